"""Where a process sits in the job and how it meets the others.

placement (this process's place, from the flags and environment), launch (settled for the device kind),
clusters (torchrun, Slurm, Ascend's rank table), rendezvous and held_stderr (meeting the others), distributed
(``Dist``), ranks (spawn and its supervisor), affinity (--cpu-binding), lifeline (ending with one's parent), stop.

May import: trainer.device, trainer.record.lock (a process's identity) and the spine's leaves (trainer.errors,
trainer.guard: the divergence exit code). Imported by the spine, trainer.data (lifeline) and the tools.
"""
