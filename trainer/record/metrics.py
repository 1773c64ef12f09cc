"""Meters, accuracy and the log lines.

The printed lines keep pytorch/examples' formats byte for byte, because acceptance
tooling greps them (the Epoch line is one line, wrapped here):
    Epoch: [0][ 10/500]\tTime  0.123 ( 0.150)\tData  0.001 ( 0.010)\tLoss 6.9078e+00 (6.9100e+00)
        \tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.50)
    Test: [ 10/196]\tTime ...
     *   Acc@1 75.123 Acc@5 92.456
Sums are kept on the device (no host sync per step); they are read, and reduced across
processes, only at print steps and at the end of an epoch.
"""
import dataclasses
import sys
import time
from typing import Optional

import torch


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0.0

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(
            name=self.name, val=self.val, avg=self.avg)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        digits = len(str(num_batches))
        fmt = "{:" + str(digits) + "d}"
        self.batch_fmtstr = "[" + fmt + "/" + fmt.format(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def line(self, batch):
        return "\t".join([self.prefix + self.batch_fmtstr.format(batch)] + [str(m) for m in self.meters])


class LoopMeters:
    """pytorch/examples' meters of one loop and its progress line: Time, Data (training only), Loss, Acc@1,
    Acc@5, updated at each print step from a ``StepClock`` interval and ``Sums.read``'s values."""

    def __init__(self, steps, prefix, data=True, restart_at=None):
        self.restart_at = restart_at  # ModelZoo's --skip_steps: the Time average restarts at that step
        self.batch_time = AverageMeter("Time", ":6.3f")
        self.data_time = AverageMeter("Data", ":6.3f") if data else None
        self.losses = AverageMeter("Loss", ":.4e")
        self.top1 = AverageMeter("Acc@1", ":6.2f")
        self.top5 = AverageMeter("Acc@5", ":6.2f")
        meters = [m for m in (self.batch_time, self.data_time, self.losses, self.top1, self.top5) if m is not None]
        self.progress = ProgressMeter(steps, meters, prefix=prefix)

    def update(self, span, interval, running):
        """``span``: a StepClock.Span; ``interval`` / ``running``: Sums.read's values."""
        if self.restart_at is not None and span.after is not None:
            self.batch_time.reset()
            steps, seconds = span.after
            if steps:
                self.batch_time.update(seconds / steps, steps)
        else:
            self.batch_time.update(span.seconds / span.steps, span.steps)
        if self.data_time is not None:
            self.data_time.update(span.waited / span.steps, span.steps)
        for meter, key in ((self.losses, "loss"), (self.top1, "acc1"), (self.top5, "acc5")):
            meter.val, meter.avg = interval[key], running[key]

    def line(self, step):
        return self.progress.line(step)


class Span:
    """The steps between two print points: how many, their wall time, and the part spent waiting for data."""

    def __init__(self, steps, seconds, waited, after=None):
        self.steps, self.seconds, self.waited = steps, seconds, waited
        self.after = after  # (steps, seconds) from the FPS window's start, when it opened within this span


class StepClock:
    """An epoch loop's clocks, around the loop rather than in it (torchvision's ``MetricLogger.log_every`` is
    the model): ``batches`` yields (step, batch) and times the wait for each batch on the host; ``stepped``
    marks the end of the FPS warm-up (``warmup`` steps, after a device synchronisation); ``span`` gives the
    interval since the previous print point; ``finish`` the epoch's timings."""

    def __init__(self, device, steps, warmup=0, first=0, start=0):
        self.device = device
        self.warm = start + warmup if steps > start + warmup else start  # ``start``: a resumed epoch's first step
        device.synchronize()
        self.t_epoch = self.t_mark = self.t_step = time.time()
        self.t_fps = self.t_epoch if self.warm == start else None
        self.waited = self.wait_mark = 0.0
        self.last = start
        # time this process's first steps one by one (a synchronisation after each): ``first_seconds``
        self.first = start + first
        self.first_seconds = []

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
        after = None
        if self.warm and self.last <= self.warm < i + 1 and self.t_fps is not None:
            after = (i + 1 - self.warm, max(now - self.t_fps, 1e-9))
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
    """The training epochs of a run so far, summed for summary.json: images/s over the timed steps, step
    time, the fraction of wall time spent waiting for data, steps trained."""

    def __init__(self):
        self.images = self.seconds = self.steps = self.wait = self.wall = 0.0
        self.trained_steps = 0

    def add(self, tr):
        """Add one epoch's TrainStats."""
        if tr.fps is not None:
            self.images += tr.fps * tr.timed_seconds
            self.seconds += tr.timed_seconds
            self.steps += tr.timed_steps
        self.wait += tr.data_wait_seconds
        self.wall += tr.seconds
        self.trained_steps += tr.steps - tr.start

    def fields(self):
        """summary.json's fields of these totals."""
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
    shufflenetv2  every progress line prefixed ``[npu id: N ] `` (N: the device index), and after each training
                  epoch ``[npu id: N ] * FPS@all 1234.567, TIME@all 0.123`` (global images/s, step seconds), after
                  each validation ``[npu id: N ] [AVG-ACC] * Acc@1 65.158 Acc@5 85.944`` (8p_main_med.py's)
    """

    def __init__(self, entry, device_index):
        self.entry = entry
        self.prefix = "[npu id: {} ] ".format(device_index or 0) if entry == "shufflenetv2" else ""

    def first_step(self, seconds):
        """After each of the run's first steps (timed one by one: ``StepClock.first_seconds``)."""
        return ["step_time = {:.4f}".format(seconds)] if self.entry == "resnet50" else []

    def trained(self, stats):
        if self.entry != "shufflenetv2" or stats.fps is None or not stats.timed_steps:
            return []
        return ["{}* FPS@all {:.3f}, TIME@all {:.3f}".format(self.prefix, stats.fps,
                                                             stats.timed_seconds / stats.timed_steps)]

    def validated(self, acc1, acc5):
        if self.entry != "shufflenetv2":
            return []
        return ["{}[AVG-ACC] * Acc@1 {:.3f} Acc@5 {:.3f}".format(self.prefix, acc1, acc5)]


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
        self.device = device
        self.total = device.move(torch.zeros(4, dtype=torch.float32))
        self._seen = [0.0, 0.0, 0.0, 0.0]

    def add(self, loss_sum, c1, c5, n):
        self.total += torch.stack([loss_sum.detach().float().reshape(()), c1.float(), c5.float(),
                                   n.float() if torch.is_tensor(n) else torch.full((), float(n), device=c1.device)])

    def seen(self):
        """The totals at the last read (where the next interval starts)."""
        return list(self._seen)

    def state(self, seen=None, rank=0, world=1, reduce_fn=None):
        """What a mid-epoch checkpoint keeps: every process's totals, one row per rank (``reduce_fn`` sums the rows
        each process filled with its own: every process calls this; a sync), and the interval's start (``seen``:
        another start, the one before a read that the resumed loop does not repeat)."""
        rows = torch.zeros((world, 4), dtype=torch.float32, device=self.total.device)
        rows[rank] = self.total
        rows = rows if reduce_fn is None else reduce_fn(rows)
        return {"totals": [[float(v) for v in row] for row in rows.tolist()],
                "seen": list(self._seen if seen is None else seen)}

    def restore(self, state, rank=0, world=1):
        """``state`` back: this rank's own totals (so that the sums add as they would have); where the world
        changed since, rank 0 holds them all."""
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
        now = values[:4]
        delta = [a - b for a, b in zip(now, self._seen)]
        self._seen = now
        if extras is None:
            return _as_metrics(delta), _as_metrics(now)
        host = {k: v for k, v in extras.items() if not torch.is_tensor(v)}
        at = 4
        for k in names:
            n = extras[k].numel()
            host[k] = values[at] if n == 1 else values[at:at + n]
            at += n
        return _as_metrics(delta), _as_metrics(now), host


def _as_metrics(v):
    n = v[3]
    if n <= 0:
        return {"loss": 0.0, "acc1": 0.0, "acc5": 0.0, "count": 0}
    return {"loss": v[0] / n, "acc1": 100.0 * v[1] / n, "acc5": 100.0 * v[2] / n, "count": int(round(n))}


class Logger:
    """Rank 0 prints plain lines (greppable); other ranks prefix theirs with [rank N]."""

    def __init__(self, rank=0, stream=None):
        self.rank = rank
        self.stream = stream

    @property
    def is_main(self):
        return self.rank == 0

    def __call__(self, msg, all_ranks=False):
        if self.rank != 0 and not all_ranks:
            return
        out = self.stream or sys.stdout
        prefix = "" if self.rank == 0 else "[rank {}] ".format(self.rank)
        for line in str(msg).splitlines() or [""]:
            out.write(prefix + line + "\n")
        out.flush()

    def warn(self, msg):
        self("warning: " + msg, all_ranks=True)
