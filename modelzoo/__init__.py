"""The ModelZoo layer above the trainer: the shell drivers' Python (test/*.sh -> ``python3 -m modelzoo.drivers``)
and the acceptance check of a run against published numbers.

plan        a driver's arguments, recipe, baseline check, output folder and main.py command line
zooargs     ModelZoo's script arguments (--hf32, --precision_mode, --profiling, ...) with their ModelZoo meaning
drivers     one main.py per device, supervised, then the ModelZoo report
acceptance  ModelZoo's result lines and case log; checks against a baseline table or a reference run
baselines   the baseline tables, a run's entry in one, and the published results recipes record

It imports models and trainer, never tools; the trainer imports nothing from here.
"""
