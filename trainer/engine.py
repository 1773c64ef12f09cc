"""Train and validate loops.

No host<->device synchronisation per step: losses and hit counts accumulate on the
device and are read (and reduced over processes) only at print steps and at the end of
an epoch. FPS is global images per second over the steps after ``--fps-warmup-steps``,
timed between two device synchronisations; the time spent waiting for data is measured
on the host and reported beside it. The divergence guard (trainer/guard.py) is read at the
same points as the meters.
"""
import torch

from trainer.record import metrics
from trainer.guard import Guard
from trainer.optim.schedule import set_lr


class Loops:
    """``train_one_epoch`` and ``validate``, the epoch loops of trainer.trainer.Trainer (which owns the parts they
    read: ``model``, ``criterion``, ``eval_criterion``, ``step`` (the OptimizerStep), ``precision``, ``device``,
    ``dist``, ``normalize``, ``schedule``, ``ema`` (--model-ema's average, or None), ``plan``, ``log``, ``profiler``,
    ``recorder``, ``zoo``, ``dumper`` (--precision-dump's, or None), ``batch_print`` (--deterministic's fingerprint of
    the first batches, or None); and the state they keep: ``stop_requested``, ``first_steps``)."""

    def autocast(self):
        return self.device.autocast(self.precision.dtype if self.precision.impl == "native" else None)

    def _targets(self, target):
        # cast on the host, then copy (the Ascend guide's order: no cast op on the device per step)
        return self.device.move(target.to(self.device.target_dtype))

    def train_one_epoch(self, loader, epoch, steps):
        """One epoch of ``steps`` steps; returns its metrics.TrainStats."""
        cfg, dev = self.plan, self.device
        self.model.train()
        if getattr(loader, "sampler", None) is not None and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        batch = None
        sums, guard, optimizer, rec = metrics.Sums(dev), Guard(dev), self.step.optimizer, self.recorder
        meters = metrics.LoopMeters(steps, "Epoch: [{}]".format(epoch), restart_at=cfg.run.skip_steps)
        compiling = getattr(self.model, "pending", False)  # --compile: this epoch's first step compiles
        warm = cfg.run.fps_warmup_steps
        if compiling and not 0 < warm < steps:
            warm = 1  # the step that compiles is never timed (StepClock times all steps of an epoch this short)
        clock = metrics.StepClock(dev, steps, warm, first=2 if self.first_steps is None else 0)
        step_losses, step_lrs = [], []
        rec.start_epoch(epoch, steps)
        for i, (images, target) in clock.batches(loader, steps):
            batch = images.shape[0]
            if self.batch_print is not None and self.batch_print.add(images, target):
                self._record_batches()
            set_lr(optimizer, self.schedule(epoch, i))
            x, y = self.normalize(images), self._targets(target)
            if compiling and i == 0:
                output, loss, skipped = self.model.first_step(lambda: self._step(x, y), dev, self.log)
            else:
                output, loss, skipped = self._step(x, y)
            guard.observe(loss, skipped)
            if self.ema is not None:
                self.ema.update(epoch, i)
            c1, c5 = metrics.correct_counts(output.detach(), y)
            sums.add(loss.detach() * batch, c1, c5, batch)
            rec.step(batch)
            if self.profiler is not None:
                self.profiler.step(epoch * steps + i)
                if self.profiler.stop_run:
                    self.stop_requested = True
            clock.stepped(i)
            if i < clock.first:
                for line in self.zoo.first_step(clock.first_seconds[i]):
                    self.log(line)
            if i % cfg.run.print_freq == 0 or i == steps - 1 or self.stop_requested:
                # syncs the device: one read for the meters, the loss scaler's values and the guard's counters
                interval, running, live = sums.read(self.dist.all_reduce_sum, dict(
                    self.step.live_scalars(), guard=guard.reduced(self.dist)))
                counters = live.pop("guard")
                span = clock.span(i)
                meters.update(span, interval, running)
                step_losses.append((epoch * steps + i + 1, interval["loss"]))
                step_lrs.append((epoch * steps + i + 1, optimizer.param_groups[0]["lr"]))
                if not rec.bar:
                    self.log(self.zoo.prefix + meters.line(i + 1))
                rec.train_point(epoch * steps + i + 1, dict(
                    live, loss=interval["loss"], acc1=interval["acc1"], acc5=interval["acc5"],
                    epoch_loss=running["loss"], epoch_acc1=running["acc1"],
                    lr=optimizer.param_groups[0]["lr"], data_wait=span.waited / span.seconds,
                    **{"img/s": span.steps * batch * self.dist.world_size / span.seconds}))
                self._check(guard, epoch, counters)
            if self.stop_requested:
                steps = i + 1
                break
        rec.end_phase()
        timed, seconds = clock.finish()
        timed_steps = steps - clock.warm
        elapsed = self.dist.max(timed, dev)
        _, running, counters = sums.read(self.dist.all_reduce_sum, {"guard": guard.reduced(self.dist)})
        self._check(guard, epoch, counters["guard"])
        global_batch = (batch or 0) * self.dist.world_size
        if self.first_steps is None:
            self.first_steps = tuple(clock.first_seconds)
        stats = metrics.TrainStats(
            steps=steps, timed_steps=timed_steps, timed_seconds=elapsed,
            fps=timed_steps * global_batch / elapsed if elapsed > 0 and timed_steps > 0 else None,
            data_wait_seconds=clock.waited, seconds=seconds, loss=running["loss"], acc1=running["acc1"],
            acc5=running["acc5"], images=running["count"], step_losses=tuple(step_losses), step_lrs=tuple(step_lrs))
        for line in self.zoo.trained(stats):
            self.log(line)
        return stats

    def _step(self, x, y):
        """Forward, loss, backward and the optimizer step: (output, loss, the step's skipped flag). --precision-dump:
        msprobe's dump starts before the forward pass and stops after the optimizer step."""
        if self.dumper is not None:
            self.dumper.start()
        with self.autocast():
            output = self.model(x)
            loss = self.criterion(output, y)
        self.step.zero_grad()
        skipped = self.step(loss)
        if self.dumper is not None:
            self.dumper.stop()
        return output, loss, skipped

    def _record_batches(self):
        """--deterministic: the fingerprint of the first batches so far, in the summary."""
        if self.summary is not None:
            self.summary.data.setdefault("alignment", {}).update(
                batches_sha256=self.batch_print.value(), batches_steps=self.batch_print.steps)

    def _check(self, guard, epoch, counters):
        guard.check(self.dist, epoch, lambda i: self.schedule(epoch, i), self.step.loss_scale, counters)

    @torch.no_grad()
    def validate(self, loader, model, ema=False):
        """Every image of the validation set counted exactly once (padding masked out); a metrics.EvalStats.
        --val-tta flip: each image's logits are the mean of its own and its mirror's. ``ema``: ``model`` is
        --model-ema's average (its own lines: "Test EMA: ", " *   EMA Acc@1 ...")."""
        cfg, dev = self.plan, self.device
        model.eval()
        steps = len(loader)
        sums, rec = metrics.Sums(dev), self.recorder
        meters = metrics.LoopMeters(steps, "Test EMA: " if ema else "Test: ", data=False)
        clock = metrics.StepClock(dev, steps)
        rec.start_epoch(None, steps, phase="val")
        for i, (images, target, valid) in clock.batches(loader, steps):
            x, y, m = self.normalize(images), self._targets(target), dev.move(valid)
            with self.autocast():
                output = model(x)
                if cfg.data.val_tta == "flip":  # FFCV's lr_tta (which sums; the mean ranks alike): image and mirror
                    output = (output.float() + model(x.flip(3)).float()) / 2
            per_sample = self.eval_criterion(output.float(), y)
            c1, c5 = metrics.correct_counts(output, y, m)
            sums.add((per_sample * m).sum(), c1, c5, m.sum())
            rec.step(images.shape[0])
            if i % cfg.run.print_freq == 0 or i == steps - 1:
                interval, running = sums.read(self.dist.all_reduce_sum)
                meters.update(clock.span(i), interval, running)
                if not rec.bar:
                    self.log(self.zoo.prefix + meters.line(i + 1))
        rec.end_phase()
        _, running = sums.read(self.dist.all_reduce_sum)
        self.log(metrics.summary_line(running["acc1"], running["acc5"], "EMA " if ema else ""))
        for line in () if ema else self.zoo.validated(running["acc1"], running["acc5"]):
            self.log(line)
        return metrics.EvalStats(acc1=running["acc1"], acc5=running["acc5"], loss=running["loss"],
                                 images=running["count"])
