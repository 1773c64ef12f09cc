"""Machinery of the ImageNet trainer, one concern per module (the flow: README.md, "Architecture").

config      command line -> frozen Config (asked)  recipes   recipes.json and the one scaling rule
plan        plan(cfg, env) -> Plan: decided once   trainer   Trainer: owns its parts; fit, evaluate
device      the only package naming npu/cuda/cpu    distributed  launch modes, ranks, collectives
optim       optimizers by name (--optimizer)
data        folders, fixed-shape loaders            amp       precision + the optimizer step object
guard       divergence guard                        engine    train / validate loops (the Trainer's)
checkpoint  atomic save, load, CheckpointSaver      metrics   meters, accuracy, log lines
summary     summary.json                            schedule  the LR as a function of the position
profiling   --profile-steps                         run       run -> plan -> worker -> Trainer
cli, errors  one-line errors, exit code 2          (the ModelZoo drivers: the modelzoo package)
lock        one writer per --output-dir (run.lock)   observe   TensorBoard, metrics.jsonl, progress bar
"""
