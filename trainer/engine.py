"""``TrainStep``: one training step in one place (LR, normalise, targets, forward and loss under autocast, backward,
the scaled optimizer step, the weight average). ``Loops``: ``train_one_epoch`` and ``validate``, given what they use.

No host<->device sync per step: losses and hit counts accumulate on the device and are read (reduced over ranks),
with the divergence guard's counters, only at print steps and at an epoch's end. FPS: global images per second over
the steps after ``--fps-warmup-steps``, timed between two device syncs; data waits are timed on the host beside it.
"""
import dataclasses
import functools
import time
import types
from typing import Any, Callable, Optional

import torch

from trainer.record import metrics
from trainer.guard import Guard
from trainer.optim.schedule import set_lr


def targets(device, target):
    """The batch's targets on the device: cast on the host, then copied (the Ascend guide's order: no cast op on
    the device per step)."""
    return device.move(target.to(device.target_dtype))


class TrainStep:
    """One training step. ``step``: the OptimizerStep (precision/amp.py: optimizer, loss scaling, autocast);
    ``schedule``: the LR of (epoch, step); ``ema``: --model-ema's average; ``dumper``: --precision-dump's (around
    forward to optimizer step); ``log``: for the compiling step's lines."""

    def __init__(self, model, criterion, step, schedule, normalize, ema=None, dumper=None, log=print):
        self.model, self.criterion, self.step, self.schedule = model, criterion, step, schedule
        self.normalize, self.device, self.ema, self.dumper, self.log = normalize, step.device, ema, dumper, log

    @property
    def compiling(self):
        """--compile: the next step compiles."""
        return getattr(self.model, "pending", False)

    def __call__(self, images, target, epoch, i):
        """Step ``i`` of ``epoch`` on one batch: (output, targets on the device, loss, the step's skipped flag)."""
        set_lr(self.step.optimizer, self.schedule(epoch, i))
        x, y = self.normalize(images), targets(self.device, target)
        if self.compiling:
            output, loss, skipped = self.model.first_step(lambda: self._update(x, y), self.device, self.log)
        else:
            output, loss, skipped = self._update(x, y)
        if self.ema is not None:
            self.ema.update(epoch, i)
        return output, y, loss, skipped

    def _update(self, x, y):
        if self.dumper is not None:
            self.dumper.start()
        with self.step.autocast():
            output = self.model(x)
            loss = self.criterion(output, y)
        self.step.zero_grad()
        skipped = self.step(loss)
        if self.dumper is not None:
            self.dumper.stop()
        return output, loss, skipped


@dataclasses.dataclass(eq=False)
class Loops:
    """The epoch loops. ``recorder``: observe.Recorder or Silent; ``zoo``: metrics.ZooLines; ``run``: the run
    section; ``precision``: validation's autocast; ``stop``: the job.stop.StopRequest or None; ``batch``: per process
    (a resumed epoch skips the batches trained); ``save(position)``: --save-every's checkpoint. Kept across epochs:
    ``first_steps``, ``stop_requested``, ``stopped_by`` (the agreed signal), ``position`` (where a stop left the
    epoch, or None).

    A stop signal: one process stops after the step it arrived in (a host flag). Several ranks agree on the step:
    the max-reduced flag travels with the meters' read at print steps, the sync that exists already, so every rank
    stops after the same step with no added sync. --save-every's interval is agreed alike. Validation stops alike,
    after the batch (one process) or at the print step (several ranks) where the stop is agreed."""

    device: Any
    dist: Any
    normalize: Any
    recorder: Any
    log: Any
    zoo: Any
    run: Any
    val_tta: Optional[str] = None
    precision: Any = None
    stop: Any = None
    batch: Optional[int] = None
    save: Optional[Callable] = None

    def __post_init__(self):
        self.save_every = 60.0 * self.run.save_every if self.save is not None and self.run.save_every else None
        self._saved_at = time.time()
        self.first_steps, self.stop_requested, self.stopped_by, self.position = None, False, None, None

    def agree(self, signum):
        """Every rank stops for ``signum`` (the stop request holds further signals until the exit)."""
        self.stop_requested, self.stopped_by = True, signum
        if self.stop is not None:
            self.stop.agree(signum)

    def _stoppable(self):
        """Whether the loops check for a stop (the run's epochs, not --evaluate): alike on every rank."""
        return self.stop is not None and self.stop.armed

    def _asked(self):
        """(the stop signal's number or 0, whether --save-every's interval has passed), this process's view."""
        due = bool(self.save_every) and time.time() - self._saved_at >= self.save_every
        return (self.stop.signum or 0) if self.stop is not None else 0, due

    def _position(self, ep, i, seen=None):
        """What a mid-epoch checkpoint keeps of the loop after step ``i`` of ``ep`` (``seen``: the open interval's
        start, where a stop's read is not to be repeated)."""
        dist = self.dist
        return dict(epoch=ep.epoch, step=i + 1,
                    sums=ep.sums.state(seen, dist.rank, dist.world_size, dist.all_reduce_sum),
                    guard=ep.guard.state(), step_losses=[list(p) for p in ep.step_losses],
                    step_lrs=[list(p) for p in ep.step_lrs])

    def _start_epoch(self, step, loader, epoch, steps, carry):
        """What the training epoch ``epoch`` keeps between steps, continued from ``carry`` (a mid-epoch checkpoint's
        position) where given; ``start``: the step it continues at."""
        dev, dist, run = self.device, self.dist, self.run
        start = carry["step"] if carry else 0
        sampler = getattr(loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
            if start:  # the batches trained before the stop are skipped, not drawn (the order is (seed, epoch)'s)
                sampler.skip = start * self.batch
        sums, guard = metrics.Sums(dev), Guard(dev)
        if carry:
            sums.restore(carry["sums"], dist.rank, dist.world_size)
            guard.restore(carry["guard"])
        warm = run.fps_warmup_steps
        if step.compiling and not 0 < warm < steps:  # --compile: this epoch's first step compiles
            warm = 1  # the step that compiles is never timed (StepClock times all steps of an epoch this short)
        return types.SimpleNamespace(
            epoch=epoch, steps=steps, start=start, sums=sums, guard=guard,
            meters=metrics.LoopMeters(steps, "Epoch: [{}]".format(epoch), restart_at=run.skip_steps),
            clock=metrics.StepClock(dev, steps, warm, first=2 if self.first_steps is None else 0, start=start),
            lr_at=functools.partial(step.schedule, epoch),  # the divergence guard's LR of a step of this epoch
            step_losses=[tuple(p) for p in carry["step_losses"]] if carry else [],
            step_lrs=[tuple(p) for p in carry["step_lrs"]] if carry else [], losses=[])

    def train_one_epoch(self, step, loader, epoch, steps, profiler=None, batch_print=None, carry=None):
        """One epoch of ``steps`` steps of ``step`` (a TrainStep) over ``loader``: a metrics.TrainStats.
        ``batch_print(images, target)``: --deterministic's fingerprint; ``carry``: where a mid-epoch checkpoint
        left this epoch."""
        dev, dist, rec, run = self.device, self.dist, self.recorder, self.run
        step.model.train()
        self.position = None
        ep = self._start_epoch(step, loader, epoch, steps, carry)
        clock, batch = ep.clock, None
        rec.start_epoch(epoch, steps)
        for i, (images, target) in clock.batches(loader, steps, ep.start):
            batch = images.shape[0]
            if batch_print is not None:
                batch_print(images, target)
            output, y, loss, skipped = step(images, target, epoch, i)
            ep.guard.observe(loss, skipped)
            c1, c5 = metrics.correct_counts(output.detach(), y)
            ep.losses.append(loss.detach() * batch)  # this step's, read with the meters at the next print step
            ep.sums.add(ep.losses[-1], c1, c5, batch)
            rec.step(batch)
            if profiler is not None:
                profiler.step(epoch * steps + i)
                if profiler.stop_run:
                    self.stop_requested = True
            clock.stepped(i)
            if i < clock.first:
                for line in self.zoo.first_step(clock.first_seconds[-1]):  # this step's
                    self.log(line)
            regular = i % run.print_freq == 0 or i == steps - 1
            agreed, due = self._asked() if dist.world_size == 1 else (0, False)  # one process: this step's boundary
            if regular or self.stop_requested or agreed:
                agreed, due = self._print_step(step, ep, i, batch, regular, agreed, due)
            if due and not agreed and i + 1 < steps:  # --save-every: a mid-epoch checkpoint, training goes on
                self.save(self._position(ep, i))
                self._saved_at = time.time()
            if self.stop_requested:
                steps = i + 1
                break
        rec.end_phase()
        timed, seconds = clock.finish()
        timed_steps = steps - clock.warm
        elapsed = dist.max(timed, dev)
        _, running, counters = ep.sums.read(dist.all_reduce_sum, {"guard": ep.guard.reduced(dist)})
        ep.guard.check(dist, epoch, ep.lr_at, step.step.loss_scale, counters["guard"])
        global_batch = (batch or 0) * dist.world_size
        if self.first_steps is None:
            self.first_steps = tuple(clock.first_seconds)
        stats = metrics.TrainStats(
            steps=steps, timed_steps=timed_steps, timed_seconds=elapsed,
            fps=timed_steps * global_batch / elapsed if elapsed > 0 and timed_steps > 0 else None,
            data_wait_seconds=clock.waited, seconds=seconds, loss=running["loss"], acc1=running["acc1"],
            acc5=running["acc5"], images=running["count"], step_losses=tuple(ep.step_losses),
            step_lrs=tuple(ep.step_lrs), start=ep.start)
        for line in self.zoo.trained(stats):
            self.log(line)
        return stats

    def _print_step(self, step, ep, i, batch, regular, signalled, due):
        """After step ``i``, at a print step (``regular``) or a stop: one read (one sync) of the meters, scaler and
        guard, where ranks also agree on a stop and on --save-every; the log line, the recorder, the guard's check.
        Returns (the agreed signal or 0, whether a checkpoint is due); ``signalled``, ``due``: one process's own."""
        dev, dist, rec = self.device, self.dist, self.recorder
        optimizer, steps = step.step.optimizer, ep.steps
        seen = ep.sums.seen()  # a stop between print steps: the checkpoint keeps the interval open
        extras = dict(step.step.live_scalars(), guard=ep.guard.reduced(dist))
        if dist.world_size > 1 and regular and (self.stop is not None or self.save_every):
            extras["asked"] = dist.all_reduce_max(dev.move(torch.tensor(self._asked(), dtype=torch.float32)))
        held, ep.losses = ep.losses, []  # the loss of each step since the last read, summed over the ranks
        if held:
            extras["losses"] = dist.all_reduce_sum(torch.stack([t.float().reshape(()) for t in held]))
        interval, running, live = ep.sums.read(dist.all_reduce_sum, extras)
        if held:
            values, first = live.pop("losses"), ep.epoch * steps + i + 2 - len(held)
            rec.step_losses([(first + k, v / (batch * dist.world_size))
                             for k, v in enumerate(values if isinstance(values, list) else [values])])
        counters = live.pop("guard")
        agreed = signalled
        if "asked" in live:
            agreed, due = int(live["asked"][0]), bool(live.pop("asked")[1])
        span = ep.clock.span(i)
        ep.meters.update(span, interval, running)
        if regular:
            ep.step_losses.append((ep.epoch * steps + i + 1, interval["loss"]))
            ep.step_lrs.append((ep.epoch * steps + i + 1, optimizer.param_groups[0]["lr"]))
        if not rec.bar:
            self.log(self.zoo.prefix + ep.meters.line(i + 1))
        rec.train_point(ep.epoch * steps + i + 1, dict(
            live, loss=interval["loss"], acc1=interval["acc1"], acc5=interval["acc5"],
            epoch_loss=running["loss"], epoch_acc1=running["acc1"],
            lr=optimizer.param_groups[0]["lr"], data_wait=span.waited / span.seconds,
            **{"img/s": span.steps * batch * dist.world_size / span.seconds}))
        ep.guard.check(dist, ep.epoch, ep.lr_at, step.step.loss_scale, counters)  # the counters read with the meters
        if agreed:
            self.agree(agreed)
            if i + 1 < steps:  # mid-epoch: what the checkpoint keeps of the loop
                self.position = self._position(ep, i, None if regular else seen)
        return agreed, due

    @torch.no_grad()
    def validate(self, model, loader, criterion, ema=False):
        """Every validation image counted once (padding masked out): a metrics.EvalStats, or None where a stop was
        agreed before its end (``stopped_by``). ``criterion``: per sample; ``ema``: ``model`` is --model-ema's
        average (lines "Test EMA: ", " *   EMA Acc@1")."""
        dev, dist, rec, p = self.device, self.dist, self.recorder, self.precision
        stoppable = self._stoppable()
        several = stoppable and dist.world_size > 1
        model.eval()
        steps = len(loader)
        sums = metrics.Sums(dev)
        meters = metrics.LoopMeters(steps, "Test EMA: " if ema else "Test: ", data=False)
        clock = metrics.StepClock(dev, steps)
        rec.start_epoch(None, steps, phase="val")
        for i, (images, target, valid) in clock.batches(loader, steps):
            x, y, m = self.normalize(images), targets(dev, target), dev.move(valid)
            with dev.autocast(p.autocast_dtype if p is not None else None):
                output = model(x)
                if self.val_tta == "flip":  # FFCV's lr_tta (which sums; the mean ranks alike): image and mirror
                    output = (output.float() + model(x.flip(3)).float()) / 2
            per_sample = criterion(output.float(), y)
            c1, c5 = metrics.correct_counts(output, y, m)
            sums.add((per_sample * m).sum(), c1, c5, m.sum())
            rec.step(images.shape[0])
            agreed = (self.stop.signum or 0) if stoppable and not several else 0  # one process: this batch's end
            if i % self.run.print_freq == 0 or i == steps - 1:
                extras = dict(asked=dist.all_reduce_max(dev.move(torch.tensor([float(self.stop.signum or 0)])))) \
                    if several else {}
                interval, running, live = sums.read(dist.all_reduce_sum, extras)  # several ranks agree here
                agreed = int(live["asked"]) if several else agreed
                meters.update(clock.span(i), interval, running)
                if not rec.bar:
                    self.log(self.zoo.prefix + meters.line(i + 1))
            if agreed:
                self.agree(agreed)
                rec.end_phase()
                return None
        rec.end_phase()
        _, running = sums.read(dist.all_reduce_sum)
        self.log(metrics.summary_line(running["acc1"], running["acc5"], "EMA " if ema else ""))
        for line in () if ema else self.zoo.validated(running["acc1"], running["acc5"]):
            self.log(line)
        return metrics.EvalStats(acc1=running["acc1"], acc5=running["acc5"], loss=running["loss"],
                                 images=running["count"])
