"""What a run shows while it runs beside pytorch/examples' log lines, on rank 0 (other ranks get ``Silent``):
TensorBoard scalars on a global step axis that continues across ``--resume``, ``metrics.jsonl`` (one record per
epoch, appended and flushed as it ends), ``step_losses.csv`` (every step's loss, appended at print steps), a tqdm
bar per epoch on a terminal instead of the step lines. A resumed run drops the events and records from its position
on (docs/DESIGN.md). Only values the engine has already read at a print step are recorded: nothing here syncs the
device.
"""
import contextlib
import json
import os
import sys
import time

from trainer.record import checkpoint

METRICS = "metrics.jsonl"
LOSSES = "step_losses.csv"  # every training step's loss (mean over the ranks), written at print steps
# how often TensorBoard's writer thread flushes on its own (its default, 120 s, leaves a live board stale
# for two minutes; a shorter period also bounds any wait in its closing flush)
FLUSH_SECONDS = 10


class Silent:
    """The recorder of ranks other than 0, and of runs that record nothing."""

    bar = False

    def _nothing(self, *args, **kwargs):
        pass

    start_epoch = step = train_point = step_losses = validation = epoch_record = end_phase = close = _nothing


def progress_mode(requested):
    """``auto`` -> ``bar`` when stdout is a terminal and tqdm imports, else ``lines``; (mode, note or None)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    if requested == "lines" or (requested == "auto" and not tty):
        return "lines", None
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return "lines", "tqdm is not installed: progress is printed as lines (pip install tqdm for a bar)"
    return "bar", None


class Recorder(Silent):
    """Rank 0's recorder. ``tb_dir`` None: no TensorBoard. ``resume_epoch``: the epoch training starts at
    (records and events from there on, left by an earlier attempt, are dropped); ``resume_step``: the step within
    it that a mid-epoch checkpoint continues at."""

    def __init__(self, out_dir, tb_dir, bar, resume_epoch, steps_per_epoch, config, log, resume_step=0):
        self.log, self.bar, self._bar, self.tb = log, bar, None, None
        self.metrics_path = os.path.join(out_dir, METRICS)
        if os.path.exists(self.metrics_path):  # only the records of the epochs before resume_epoch stay
            keep = [r for r in read_records(self.metrics_path)
                    if isinstance(r.get("epoch"), int) and r["epoch"] < resume_epoch]
            text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep)
            checkpoint.atomic_write(self.metrics_path, lambda f: f.write(text.encode()))
        self.losses_path = os.path.join(out_dir, LOSSES)
        if os.path.exists(self.losses_path):  # only the steps before the resumed position stay
            at = resume_epoch * steps_per_epoch + resume_step
            kept = [row for row in read_losses(self.losses_path) if row[0] <= at] if at else []
            text = "step,loss\n" + "".join("{},{!r}\n".format(s, v) for s, v in kept)
            checkpoint.atomic_write(self.losses_path, lambda f: f.write(text.encode()))
        if tb_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception as exc:  # tensorboard missing (some Ascend 1.11 stacks) or broken
                log("note: TensorBoard is off: {} ({}); pip install tensorboard to get event files".format(
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "no tensorboard"))
            else:
                # purge_step: events at or after the resumed position (a run that did not reach its next
                # checkpoint wrote them) are discarded, so the curve stays one line
                at = resume_epoch * steps_per_epoch + resume_step
                self.tb = SummaryWriter(tb_dir, purge_step=at + 1 if at else None, flush_secs=FLUSH_SECONDS)
                if not resume_epoch:
                    self.tb.add_text("config", "```\n{}\n```".format(json.dumps(config, indent=1, default=str)), 0)

    def start_epoch(self, epoch, steps, phase="train"):
        if not self.bar:
            return
        import shutil
        from tqdm import tqdm
        size = shutil.get_terminal_size((100, 24))  # a terminal that reports 0 x 0 (a bare pty) gets 100 x 24
        self._bar = tqdm(total=steps, desc="Epoch {}".format(epoch) if phase == "train" else "Test", unit="step",
                         ncols=size.columns, nrows=max(size.lines, 2), leave=phase == "train", file=sys.stdout)

    def step(self, n_images):
        if self._bar is not None:
            self._bar.update(1)

    def end_phase(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def train_point(self, global_step, values):
        if self._bar is not None:
            shown = [("loss", "epoch_loss", "{:.4f}"), ("acc1", "epoch_acc1", "{:.2f}"), ("img/s", "img/s", "{:.0f}")]
            self._bar.set_postfix_str(", ".join("{} {}".format(name, f.format(values[k])) for name, k, f in shown
                                                if values.get(k) is not None), refresh=False)
        for key, tag in (("loss", "train/loss"), ("acc1", "train/acc1"), ("acc5", "train/acc5"), ("lr", "train/lr"),
                         ("img/s", "train/images_per_second"), ("data_wait", "train/data_wait_fraction"),
                         ("loss_scale", "amp/loss_scale"), ("overflow_steps", "amp/overflow_steps")):
            if self.tb is not None and values.get(key) is not None:
                self.tb.add_scalar(tag, values[key], global_step)

    def step_losses(self, pairs):
        """(global step, loss) of the steps read at a print step, appended to step_losses.csv."""
        with open(self.losses_path, "a") as f:
            f.write(("" if f.tell() else "step,loss\n") + "".join("{},{!r}\n".format(s, float(v)) for s, v in pairs))

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
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def read_losses(path):
    """[(global step, loss)] of a step_losses.csv in the order written (none where it is missing; a torn last line
    is ignored); a step written twice (a resumed run that redid it) appears twice, the later last."""
    rows = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            step, _, loss = line.strip().partition(",")
            with contextlib.suppress(ValueError):
                rows.append((int(step), float(loss)))
    return rows


def recorder_of(trainer):
    """A Trainer's rank 0's ``Recorder`` (TensorBoard, metrics.jsonl, progress bar); ``Silent`` elsewhere."""
    run = trainer.plan.run
    if not trainer.dist.is_main:
        return Silent()
    mode, note = progress_mode(run.progress)
    if note:
        trainer.log("note: " + note)
    at = (trainer.start_epoch - 1, trainer.steps) if trainer.due else (  # a due validation's epoch: recorded again
        trainer.start_epoch, (trainer.carry or {}).get("step", 0))
    return Recorder(run.output_dir, run.tensorboard_dir, mode == "bar", at[0], trainer.steps, trainer.plan.as_dict(),
                    trainer.log, at[1])
