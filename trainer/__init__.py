"""The ImageNet trainer (the flow: docs/DESIGN.md, "Architecture"). The run's spine is at the top,
each subsystem a package below it.

The spine:  flags      every setting declared once: the config's sections, each field with its flag
            config     command line -> frozen Config (what was asked), each section checked by its own function
            plan       plan(cfg, env) -> Plan: every decision and check of a run, once
            run        run -> plan -> ranks -> worker -> Trainer
            trainer    Trainer: owns its parts; fit, evaluate
            engine     train / validate loops (the Trainer's)
Its leaves: cli (the lines a stopped run ends with), errors (one-line errors, exit code 2, and their report),
            options (argparse made from the declarations, the value parsers), recipes (recipes.json and the
            one scaling rule), zoo
            (ModelZoo's entry flags), graph (--compile), guard (divergence: non-finite losses and weights stop a
            run), device_names (the kinds, without importing torch), interpreter (a Python without the packages:
            one line naming the one to use)

Subsystems: device     the only package naming npu/cuda/cpu
            data       folders, fixed-shape loaders, the device decode backend
            optim      optimizers by name (--optimizer), the LR schedule
            precision  --amp: autocast, loss scaling, apex, the optimizer step
            job        where a process sits and how it meets the others
            record     what a run shows and records: log lines, metrics, summary, profiles, checkpoints, its folder

A subsystem imports only subsystems below it (device < optim < record < precision < job < data) and the spine's
leaves; the spine imports them all (tests/test_layout.py). The ModelZoo drivers are the modelzoo package.
"""
