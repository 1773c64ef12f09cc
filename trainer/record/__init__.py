"""What a run shows and records, and the folder it records into.

metrics     meters, accuracy, pytorch/examples' log lines, the FPS and step-time totals
observe     TensorBoard, metrics.jsonl, the progress bar
summary     summary.json: the run's status, figures and the files it wrote
files       the output folder's record: what a run may write there, what it wrote, that list read back
profiling   --profile-steps: a Chrome trace and an op table per rank
checkpoint  atomic writes, checkpoint files read once, resume, CheckpointSaver
folders     who writes --output-dir: one writer per folder, one per node where the nodes do not share it
earlier     what an earlier run in the folder is (its record) and how a new run moves it aside: main.py's
            previous_runs/STAMP, the drivers' <dir>.prev-STAMP
lock        one writer per --output-dir (run.lock)

May import: trainer.device, trainer.errors. Imported by the spine, trainer.precision and trainer.job.
"""
