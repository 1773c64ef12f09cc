"""Machinery of the ImageNet trainer: one concern per module.

config      command line -> frozen Config (and validation)
device      the only module that knows npu / cuda / cpu
distributed process launch, ranks, collectives
data        image folders, fixed-shape loaders, synthetic data
amp         mixed precision (native autocast + GradScaler, or apex)
checkpoint  atomic save, tolerant load, resume
engine      train / validate loops
metrics     meters, accuracy, log lines
summary     summary.json
run         the flow that ties them together
"""
