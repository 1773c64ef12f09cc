"""summary.json: the run's results for machines (scripts read it; nobody greps it).

Written at the end of every epoch (status "running"), at the end ("ok"), and on a failure ("failed", with the
error) or Ctrl-C ("interrupted"). Its "files" lists what the run wrote in --output-dir (paths relative to it,
trainer/record/files.py): the record by which a later run there moves this one aside (trainer/record/earlier.py).
"""
import json
import os
import time

from trainer import device as devmod
from trainer.record import checkpoint
from trainer.record.files import EVAL_SUMMARY, FILES, SUMMARY, changed, outputs, read_record, snapshot


class RunSummary:
    def __init__(self, plan, path):
        self.path, self.t0 = path, time.time()
        self.started = False  # until the run starts, a failure leaves an existing summary alone
        # the record of what this run writes: what is new in its folder since now, and what a run it continues listed
        self.folder, self.outputs = os.path.dirname(os.path.abspath(path)), outputs(plan)
        self.before = snapshot(self.folder, self.outputs)
        earlier = read_record(self.folder, os.path.basename(path)) if plan.run.resume is not None else None
        self.carried = earlier[0] if earlier else []
        self.data = {  # (the keys' order is the file's)
            "status": "running", "error": None, "arch": plan.model.arch, "model": plan.model.name, "device": None,
            "world_size": plan.launch.world_size, "global_batch_size": plan.run.batch_size,
            "per_device_batch_size": None, "lr": plan.optim.lr, "epochs": plan.run.epochs, "epochs_completed": 0,
            "steps_per_epoch": None, "train_fps": None, "train_step_time_ms": None, "data_time_fraction": None,
            "train_acc1": None, "final_loss": None, "best_acc1": None, "final_acc1": None, "final_acc5": None,
            "val_images": None, "val_loss": None, "e2e_seconds": None, "amp": None,
            "channels_last": plan.model.channels_last, "data_backend": None, "data_fallback_images": None,
            "data_workers": None, "optimizer": None, "checkpoint": None, "best_checkpoint": None, "data_layout": None,
            "train_images": None, "num_classes": None, "recipe": plan.run.recipe,
            "versions": devmod.versions(), "config": plan.as_dict(), "notes": []}

    def update(self, **values):
        self.data.update(values)

    def write(self, status=None, error=None):
        if status is not None:
            self.data["status"] = status
        if error is not None:
            self.data["error"] = error
        self.data["e2e_seconds"] = round(time.time() - self.t0, 3)
        self.data[FILES] = sorted(set(self.carried + changed(self.folder, self.outputs, self.before) +
                                      [os.path.basename(self.path)]))
        text = json.dumps(self.data, indent=2, sort_keys=False, default=str) + "\n"
        os.makedirs(self.folder, exist_ok=True)
        checkpoint.atomic_write(self.path, lambda f: f.write(text.encode()))


def failed_start(plan, exc):
    """A job that failed at its rendezvous (``exc`` a RendezvousError; other errors are left to the run): rank 0
    records its line as the error in a folder that holds no summary yet (one of a run to resume is left alone)."""
    from trainer.errors import one_line
    path = os.path.join(plan.run.output_dir, EVAL_SUMMARY if plan.run.evaluate else SUMMARY)
    if plan.launch.rank == 0 and not os.path.exists(path):
        RunSummary(plan, path).write("failed", one_line(exc))
