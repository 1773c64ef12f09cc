"""Where a process sits in the job and how it meets the others.

placement    this process's place (single | spawn | process; nodes, slot), decided once from the launch flags
             (``Asked``) and the environment into a frozen ``Placement``
launch       that place settled for the device kind (devices, batch, backend), the ports
clusters     what cluster launchers tell a process: torchrun's restarts, Slurm's tasks, Ascend's rank table
rendezvous   the master, the store the process group starts from, failures of the group as one line
held_stderr  fd 2 held back during the rendezvous, written out however the hold ends
distributed  the process group and the collectives a run uses (``Dist``)
ranks        spawn's ranks and their supervisor (also the ModelZoo drivers')
affinity     each rank's CPU cores (--cpu-binding)
lifeline     a process ends with the one that started it

May import: trainer.device, trainer.record.lock (a process's identity) and the spine's leaves (trainer.errors,
trainer.guard: the divergence exit code). Imported by the spine, trainer.data (lifeline) and the tools.
"""
