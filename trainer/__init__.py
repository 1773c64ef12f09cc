"""The ImageNet trainer (the flow: docs/DESIGN.md, "Architecture"): the run's spine at the top, each subsystem a
package below it.

The spine:  flags (every setting declared once: the config's sections, each field with its flag), config (command
            line -> frozen Config, each section checked by its own function), plan (plan(cfg, env) -> Plan: every
            decision and check of a run, once), run (run -> plan -> ranks -> worker -> Trainer), trainer (Trainer:
            owns its parts; fit, evaluate), engine (the train / validate loops and the training step)
Its leaves: cli (a stopped run's last lines), errors (one-line errors, exit 2), options (argparse made from the
            declarations; value parsers), recipes (recipes.json and the scaling rule), zoo (ModelZoo's entry flags),
            graph (--compile), guard (divergence stops a run), device_names (the kinds, without torch), interpreter
            (a Python without the packages: one line naming the one to use)
Subsystems: device (the only package naming npu/cuda/cpu), data (folders, fixed-shape loaders, the device decode
            backend), optim (optimizers by name, the LR schedule), precision (--amp: autocast, loss scaling, apex, the
            optimizer step), job (where a process sits and how it meets the others), record (log lines, metrics,
            summary, profiles, checkpoints, the run's folder)

A subsystem imports only subsystems below it (device < optim < record < precision < job < data) and the spine's
leaves; the spine imports them all (tests/test_layout.py). The ModelZoo drivers are the modelzoo package.
"""
