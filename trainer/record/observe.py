"""What a run shows while it runs, beside pytorch/examples' log lines (rank 0 only):

- TensorBoard scalars (``torch.utils.tensorboard``) at every print step and validation, on a global step
  axis that continues across ``--resume`` (events a crash left beyond the checkpoint are purged);
- ``metrics.jsonl``: one JSON object per epoch, appended and flushed as the epoch ends; a resumed run
  first drops the records of the epochs it is about to train again, so no epoch appears twice;
- a live progress bar (tqdm) per epoch on a terminal, instead of the step lines.

Only values the engine has already read at a print step are recorded: nothing here syncs the device.
Other ranks get ``Silent``, which does nothing.
"""
import json
import os
import sys
import time

from trainer.record import checkpoint

METRICS = "metrics.jsonl"


# how often TensorBoard's writer thread flushes on its own (its default, 120 s, leaves a live board stale
# for two minutes; a shorter period also bounds any wait in its closing flush)
FLUSH_SECONDS = 10


class Silent:
    """The recorder of ranks other than 0, and of runs that record nothing."""

    bar = False

    def start_epoch(self, epoch, steps, phase="train"):
        pass

    def step(self, n_images):
        pass

    def train_point(self, global_step, values):
        pass

    def validation(self, global_step, values, tag="val"):
        pass

    def epoch_record(self, record):
        pass

    def end_phase(self):
        pass

    def write(self, line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def close(self):
        pass


def progress_mode(requested, stream=None):
    """``auto`` -> ``bar`` when stdout is a terminal and tqdm imports, else ``lines``; (mode, note or None)."""
    stream = stream or sys.stdout
    if requested == "lines" or (requested == "auto" and not _isatty(stream)):
        return "lines", None
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return "lines", "tqdm is not installed: progress is printed as lines (pip install tqdm for a bar)"
    return "bar", None


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Recorder(Silent):
    """Rank 0's recorder. ``tb_dir`` None: no TensorBoard. ``resume_epoch``: the epoch training starts at
    (records and events from there on, left by an earlier attempt, are dropped); ``resume_step``: the step within
    it that a mid-epoch checkpoint continues at."""

    def __init__(self, out_dir, tb_dir, bar, resume_epoch, steps_per_epoch, config, log, resume_step=0):
        self.log = log
        self.metrics_path = os.path.join(out_dir, METRICS)
        _truncate_records(self.metrics_path, resume_epoch)
        self.bar = bar
        self._bar = None
        self.tb = None
        if tb_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception as exc:  # tensorboard missing (some Ascend 1.11 stacks) or broken
                log("note: TensorBoard is off: {} ({}); pip install tensorboard to get event files".format(
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "no tensorboard"))
            else:
                # purge_step: events at or after the resumed position were written by a run that did not
                # reach its next checkpoint, and are discarded, so the curve stays one line
                at = resume_epoch * steps_per_epoch + resume_step  # a mid-epoch checkpoint's step within its epoch
                self.tb = SummaryWriter(tb_dir, purge_step=at + 1 if at else None,
                                        flush_secs=FLUSH_SECONDS)
                if not resume_epoch:
                    self.tb.add_text("config", "```\n{}\n```".format(json.dumps(config, indent=1, default=str)), 0)

    # -- progress bar
    def start_epoch(self, epoch, steps, phase="train"):
        if not self.bar:
            return
        import shutil
        from tqdm import tqdm
        desc = "Epoch {}".format(epoch) if phase == "train" else "Test"
        size = shutil.get_terminal_size((100, 24))  # a terminal that reports 0 x 0 (a bare pty) gets 100 x 24
        self._bar = tqdm(total=steps, desc=desc, unit="step", ncols=size.columns, nrows=max(size.lines, 2),
                         leave=phase == "train", file=sys.stdout)

    def step(self, n_images):
        if self._bar is not None:
            self._bar.update(1)

    def _postfix(self, values):
        if self._bar is not None:
            shown = [("loss", "epoch_loss", "{:.4f}"), ("acc1", "epoch_acc1", "{:.2f}"), ("img/s", "img/s", "{:.0f}")]
            self._bar.set_postfix_str(", ".join("{} {}".format(name, f.format(values[k])) for name, k, f in shown
                                                if values.get(k) is not None), refresh=False)

    def end_phase(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, line):
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            Silent.write(self, line)

    # -- scalars
    def train_point(self, global_step, values):
        self._postfix(values)
        if self.tb is None:
            return
        for key, tag in (("loss", "train/loss"), ("acc1", "train/acc1"), ("acc5", "train/acc5"), ("lr", "train/lr"),
                         ("img/s", "train/images_per_second"), ("data_wait", "train/data_wait_fraction"),
                         ("loss_scale", "amp/loss_scale"), ("overflow_steps", "amp/overflow_steps")):
            if values.get(key) is not None:
                self.tb.add_scalar(tag, values[key], global_step)

    def validation(self, global_step, values, tag="val"):
        """A validation's scalars under ``tag`` (val; val_ema: --model-ema's average)."""
        if self.tb is None:
            return
        for key in ("loss", "acc1", "acc5"):
            self.tb.add_scalar(tag + "/" + key, values[key], global_step)
        if values.get("epoch_seconds") is not None:
            self.tb.add_scalar("train/epoch_seconds", values["epoch_seconds"], global_step)
        self.tb.flush()

    def epoch_record(self, record):
        record = dict(record, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.tb is not None:
            self.tb.flush()

    def close(self):
        self.end_phase()
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def read_records(path):
    """The records of a metrics.jsonl (a torn last line, from a crash mid-write, is ignored)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _truncate_records(path, from_epoch):
    """Keep only the records of epochs before ``from_epoch`` (rewritten atomically)."""
    if not os.path.exists(path):
        return
    keep = [r for r in read_records(path) if isinstance(r.get("epoch"), int) and r["epoch"] < from_epoch]
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep)
    checkpoint.atomic_write(path, lambda f: f.write(text.encode()))
