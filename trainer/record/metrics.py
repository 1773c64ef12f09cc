"""Meters, accuracy and the log lines.

The printed lines keep pytorch/examples' formats byte for byte, because acceptance tooling greps them (one exception:
a Time or Data average of 10 s or more keeps its space after "(", which ModelZoo's scripts split on):
    Epoch: [0][ 10/500]\tTime  0.123 ( 0.150)\tData  0.001 ( 0.010)\tLoss 6.9078e+00 (6.9100e+00)\tAcc@1 ...
    Test: [ 10/196]\tTime ...
     *   Acc@1 75.123 Acc@5 92.456
Sums are kept on the device (no host sync per step); they are read, and reduced across processes, only at print
steps and at the end of an epoch.
"""
import collections
import dataclasses
import sys
import time
from typing import Optional

import torch


class LoopMeters:
    """pytorch/examples' AverageMeters of one loop and their ProgressMeter line: Time, Data (training only), Loss,
    Acc@1, Acc@5, updated at each print step from a ``StepClock`` span and ``Sums.read``'s values."""

    COLUMNS = (("Time", "6.3f"), ("Data", "6.3f"), ("Loss", ".4e"), ("Acc@1", "6.2f"), ("Acc@5", "6.2f"))

    def __init__(self, steps, prefix, data=True, restart_at=None):
        self.restart_at = restart_at  # ModelZoo's --skip_steps: the Time average restarts at that step
        self.columns = [(name, fmt) for name, fmt in self.COLUMNS if data or name != "Data"]
        self.values = {name: (0.0, 0.0) for name, _ in self.columns}  # (the last value, the average)
        self.sums = {"Time": [0.0, 0], "Data": [0.0, 0]}  # (sum, count) of the per-step times averaged
        fmt = "{:" + str(len(str(steps))) + "d}"
        self.prefix, self.batch_fmtstr = prefix, "[" + fmt + "/" + fmt.format(steps) + "]"

    def _average(self, name, seconds, steps):
        val = seconds / steps
        total = self.sums[name]
        total[0] += val * steps
        total[1] += steps
        self.values[name] = (val, total[0] / total[1])

    def update(self, span, interval, running):
        """``span``: a StepClock.Span; ``interval`` / ``running``: Sums.read's values."""
        if self.restart_at is not None and span.after is not None:
            self.sums["Time"] = [0.0, 0]
            self.values["Time"] = (0.0, 0.0)
            steps, seconds = span.after
            if steps:
                self._average("Time", seconds, steps)
        else:
            self._average("Time", span.seconds, span.steps)
        if "Data" in self.values:
            self._average("Data", span.waited, span.steps)
        for name, key in (("Loss", "loss"), ("Acc@1", "acc1"), ("Acc@5", "acc5")):
            self.values[name] = (interval[key], running[key])

    def line(self, step):
        return "\t".join([self.prefix + self.batch_fmtstr.format(step)] + [
            self._field(name, fmt, *self.values[name]) for name, fmt in self.columns])

    @staticmethod
    def _field(name, fmt, val, avg):
        """``Time  0.123 ( 0.150)``; a time of 10 s or more keeps the space after "(" (``Time 12.345 ( 12.345)``):
        ModelZoo's scripts split the Time field on spaces and read the average as the third word."""
        average = "{:{f}}".format(avg, f=fmt)
        if name in ("Time", "Data") and not average.startswith(" "):
            average = " " + average
        return "{} {:{f}} ({})".format(name, val, average, f=fmt)


# The steps between two print points: how many, their wall time, the part spent waiting for data, and (steps,
# seconds) from the FPS window's start when it opened within this span (else None)
Span = collections.namedtuple("Span", "steps seconds waited after")


class StepClock:
    """An epoch loop's clocks, around the loop as torchvision's ``MetricLogger.log_every``: ``batches`` yields
    (step, batch) timing the host's wait for each; ``stepped`` marks the end of the FPS warm-up (``warmup`` steps,
    after a device sync); ``span`` the interval since the previous print point; ``finish`` the epoch's timings."""

    def __init__(self, device, steps, warmup=0, first=0, start=0):
        self.device = device
        self.warm = start + warmup if steps > start + warmup else start  # ``start``: a resumed epoch's first step
        device.synchronize()
        self.t_epoch = self.t_mark = self.t_step = time.time()
        self.t_fps = self.t_epoch if self.warm == start else None
        self.waited = self.wait_mark = 0.0
        self.last = start
        self.first, self.first_seconds = start + first, []  # this process's first steps, each timed after a sync

    def batches(self, loader, steps, start=0):
        it = iter(loader)
        for i in range(start, steps):
            t0 = time.time()
            batch = next(it)
            self.t_step = time.time()
            self.waited += self.t_step - t0
            yield i, batch

    def stepped(self, i):
        if i < self.first:
            self.device.synchronize()
            self.first_seconds.append(time.time() - self.t_step)
        if i + 1 == self.warm:
            self.device.synchronize()
            self.t_fps = time.time()

    def span(self, i):
        """The Span from the previous print point to the end of step ``i`` (the caller synchronised)."""
        now = time.time()
        after = (i + 1 - self.warm, max(now - self.t_fps, 1e-9)) \
            if self.warm and self.last <= self.warm < i + 1 and self.t_fps is not None else None
        span = Span(i + 1 - self.last, max(now - self.t_mark, 1e-9), self.waited - self.wait_mark, after)
        self.t_mark, self.wait_mark, self.last = now, self.waited, i + 1
        return span

    def finish(self):
        """(seconds since the FPS window opened, seconds since the epoch began), after a synchronisation."""
        self.device.synchronize()
        t_end = time.time()
        return t_end - (self.t_fps if self.t_fps is not None else self.t_epoch), t_end - self.t_epoch


@dataclasses.dataclass(frozen=True)
class TrainStats:
    """One training epoch, global over ranks."""
    steps: int
    timed_steps: int  # after --fps-warmup-steps
    timed_seconds: float  # their wall time (the slowest rank's)
    fps: Optional[float]  # global images per second over the timed steps
    data_wait_seconds: float  # this rank's host time waiting for batches
    seconds: float
    loss: float
    acc1: float
    acc5: float
    images: int
    step_losses: tuple = ()  # (global step, the training loss of the printed interval ending there), per print
    step_lrs: tuple = ()  # (global step, the LR of that step), per print
    start: int = 0  # the step a mid-epoch checkpoint continued at (the steps before it were trained by another run)

    @property
    def last_loss(self):
        """The loss of the last printed interval (the value on the epoch's last Epoch line), as ModelZoo reads it."""
        return self.step_losses[-1][1] if self.step_losses else None


class RunTotals:
    """A run's training epochs so far, summed for summary.json's fields (``fields``)."""

    def __init__(self):
        self.images = self.seconds = self.steps = self.wait = self.wall = 0.0
        self.trained_steps = 0

    def add(self, tr):  # one epoch's TrainStats
        if tr.fps is not None:
            self.images += tr.fps * tr.timed_seconds
            self.seconds += tr.timed_seconds
            self.steps += tr.timed_steps
        self.wait += tr.data_wait_seconds
        self.wall += tr.seconds
        self.trained_steps += tr.steps - tr.start

    def fields(self):  # summary.json's fields of these totals
        return {"trained_steps": self.trained_steps,
                "train_fps": self.images / self.seconds if self.seconds else None,
                "train_step_time_ms": 1000.0 * self.seconds / self.steps if self.steps else None,
                "data_time_fraction": self.wait / self.wall if self.wall else None}


@dataclasses.dataclass(frozen=True)
class EvalStats:
    """One validation pass, every image counted once over ranks."""
    acc1: float
    acc5: float
    loss: float
    images: int

    def as_dict(self):
        return dataclasses.asdict(self)


def summary_line(acc1, acc5, label=""):
    """pytorch/examples' line after a validation (``label``: "EMA " for --model-ema's average)."""
    return " *   {}Acc@1 {:.3f} Acc@5 {:.3f}".format(label, acc1, acc5)


class ZooLines:
    """The lines Ascend ModelZoo's scripts grep, beside pytorch/examples' (``--modelzoo``, trainer/zoo.py):
    resnet50      ``step_time = 0.1234`` after each of the first two steps (their CompileTime)
    shufflenetv2  every progress line prefixed ``[npu id: N ] `` (N: the device index), after each training epoch
                  ``[npu id: N ] * FPS@all 1234.567, TIME@all 0.123`` (global images/s, step seconds), after each
                  validation ``[npu id: N ] [AVG-ACC] * Acc@1 65.158 Acc@5 85.944`` (8p_main_med.py's)"""

    def __init__(self, entry, device_index):
        self.entry = entry
        self.prefix = "[npu id: {} ] ".format(device_index or 0) if entry == "shufflenetv2" else ""

    def first_step(self, seconds):  # after each of the run's first steps (``StepClock.first_seconds``)
        return ["step_time = {:.4f}".format(seconds)] if self.entry == "resnet50" else []

    def trained(self, stats):
        if self.entry != "shufflenetv2" or stats.fps is None or not stats.timed_steps:
            return []
        return ["{}* FPS@all {:.3f}, TIME@all {:.3f}".format(self.prefix, stats.fps,
                                                             stats.timed_seconds / stats.timed_steps)]

    def validated(self, acc1, acc5):
        return ["{}[AVG-ACC] * Acc@1 {:.3f} Acc@5 {:.3f}".format(self.prefix, acc1, acc5)] \
            if self.entry == "shufflenetv2" else []


def correct_counts(output, target, mask=None):
    """(top-1 correct, top-5 correct) as device tensors; top-5 is top-min(5, classes)."""
    maxk = min(5, output.shape[1])
    pred = output.topk(maxk, 1, True, True)[1]
    hit = pred.eq(target.view(-1, 1).to(pred.dtype))
    c1, c5 = hit[:, :1].any(1), hit.any(1)
    if mask is not None:
        c1, c5 = c1 & mask, c5 & mask
    return c1.sum(), c5.sum()


class Sums:
    """Device-resident [loss_sum, correct1, correct5, count] with interval bookkeeping."""

    def __init__(self, device):
        self.device, self.total = device, device.move(torch.zeros(4, dtype=torch.float32))
        self._seen = [0.0, 0.0, 0.0, 0.0]

    def add(self, loss_sum, c1, c5, n):
        self.total += torch.stack([loss_sum.detach().float().reshape(()), c1.float(), c5.float(),
                                   n.float() if torch.is_tensor(n) else torch.full((), float(n), device=c1.device)])

    def seen(self):  # the totals at the last read (where the next interval starts)
        return list(self._seen)

    def state(self, seen=None, rank=0, world=1, reduce_fn=None):
        """What a mid-epoch checkpoint keeps: every process's totals, a row per rank (``reduce_fn`` sums the rows:
        every process calls this; a sync), and the interval's start (``seen``: the one before a read that the
        resumed loop does not repeat)."""
        rows = torch.zeros((world, 4), dtype=torch.float32, device=self.total.device)
        rows[rank] = self.total
        rows = rows if reduce_fn is None else reduce_fn(rows)
        return {"totals": [[float(v) for v in row] for row in rows.tolist()],
                "seen": list(self._seen if seen is None else seen)}

    def restore(self, state, rank=0, world=1):
        """``state`` back: this rank's own totals (the sums add as they would have), or rank 0 all of them where the
        world changed since."""
        rows = state["totals"]
        mine = rows[rank] if len(rows) == world else [sum(c) for c in zip(*rows)] if rank == 0 else [0.0] * 4
        self.total = self.device.move(torch.tensor(mine, dtype=torch.float32))
        self._seen = [float(v) for v in state["seen"]]

    def read(self, reduce_fn=None, extras=None):
        """Host values (reduced over processes by ``reduce_fn``): (interval, running) dicts. With ``extras``
        ({name: device tensor or number}, not reduced) also a dict of their host values (a number for a tensor
        of one element, else a list), read in the same transfer (no sync of their own)."""
        t = self.total if reduce_fn is None else reduce_fn(self.total.clone())
        names = [k for k, v in (extras or {}).items() if torch.is_tensor(v)]
        if names:
            t = torch.cat([t] + [extras[k].detach().reshape(-1).float().to(t.device) for k in names])
        values = [float(v) for v in t.tolist()]
        now, delta = values[:4], [a - b for a, b in zip(values, self._seen)]
        self._seen = now
        if extras is None:
            return _as_metrics(delta), _as_metrics(now)
        host, at = {k: v for k, v in extras.items() if not torch.is_tensor(v)}, 4
        for k in names:
            n = extras[k].numel()
            host[k], at = values[at] if n == 1 else values[at:at + n], at + n
        return _as_metrics(delta), _as_metrics(now), host


def _as_metrics(v):
    n = v[3]
    if n <= 0:
        return {"loss": 0.0, "acc1": 0.0, "acc5": 0.0, "count": 0}
    return {"loss": v[0] / n, "acc1": 100.0 * v[1] / n, "acc5": 100.0 * v[2] / n, "count": int(round(n))}


class Logger:
    """Rank 0 prints plain lines (greppable); other ranks prefix theirs with [rank N]."""

    def __init__(self, rank=0):
        self.rank = rank

    def __call__(self, msg, all_ranks=False):
        if self.rank == 0 or all_ranks:
            prefix = "" if self.rank == 0 else "[rank {}] ".format(self.rank)
            sys.stdout.write("".join(prefix + line + "\n" for line in str(msg).splitlines() or [""]))
            sys.stdout.flush()

    def warn(self, msg):
        self("warning: " + msg, all_ranks=True)
