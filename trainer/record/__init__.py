"""What a run shows and records, and the folder it records into.

metrics (meters, accuracy, pytorch/examples' log lines, the FPS and step-time totals), observe (TensorBoard,
metrics.jsonl, the progress bar), summary (summary.json), files (what a run may write in --output-dir, what it wrote,
that list read back), profiling (--profile-steps), checkpoint (atomic writes, reads, resume, CheckpointSaver), lock
(one writer per --output-dir: run.lock), folders (who writes it: one writer per folder, per node where nodes do not
share it), earlier (an earlier run there moved aside: main.py's previous_runs/STAMP, the drivers' <dir>.prev-STAMP).

May import: trainer.device, trainer.errors. Imported by the spine, trainer.precision and trainer.job.
"""
