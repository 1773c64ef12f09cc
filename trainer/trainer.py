"""One rank's run: ``Trainer(plan, device, dist, log, summary)`` builds and owns its parts (resume, seed, data,
model, precision, loss, optimizer step, DDP / graph mode, schedule, profiler, checkpoint saver); ``fit()`` reads as
pytorch/examples' main_worker (each epoch: train, validate, save, record; the loops: trainer/engine.py);
``evaluate()`` is --evaluate. Every field of summary.json a run fills is filled in ``summary_fields``."""
import contextlib
import dataclasses
import math
import os
import secrets
import sys

import torch

import models
from trainer import align, cli, data, graph, optim, zoo
from trainer.job import affinity
from trainer.precision import amp, amp_label, amp_probe
from trainer.record import checkpoint, folders, metrics, observe
from trainer.job.clusters import world_change
from trainer.engine import Loops, TrainStep
from trainer.errors import UsageError, counted
from trainer.guard import Diverged, all_finite
from trainer.optim.groups import describe as describe_groups
from trainer.optim.schedule import Schedule


class Trainer:
    """``summary``: a RunSummary (on a writing rank) or None; ``amp_timer``: the --amp dtype probe's timer
    (amp_probe.time_steps by default); ``stop``: the job.stop.StopRequest, armed while the epochs run, or None."""

    def __init__(self, plan, device, dist, log, summary=None, amp_timer=None, stop=None):
        self.plan, self.device, self.dist, self.log, self.summary = plan, device, dist, log, summary
        self.stop, self.carry = stop, None  # carry: a mid-epoch checkpoint's position in its epoch
        self.due = None  # an epoch checkpoint's validation not run yet (a stop came first): its epoch's training stats
        run, world = plan.run, dist.world_size
        self.batch_per_rank = run.batch_size // world
        # data-loader workers per process: -j (per node) shared by the node's processes, else the device's default
        # for the cores the node's ranks share (where this rank bound itself: affinity.node_cpus)
        procs = max(1, plan.launch.procs_per_node)
        if plan.data.dummy:
            self.workers = 0  # batches made once on the device
        elif plan.data.workers is None:
            self.workers = device.default_workers(procs, affinity.node_cpus())
        else:
            self.workers = int(math.ceil(plan.data.workers / float(procs)))
        resume = None
        if plan.resume is not None and not run.evaluate:
            resume = plan.resume.training(plan.model.arch)  # read by the plan (a spawned rank: here)
        elif run.resume == "auto" and not run.evaluate:
            log("=> no checkpoint in '{}' to resume: starting a new run".format(run.output_dir))
        self.seed = run.seed
        if self.seed is None:
            self.seed = resume.seed if resume is not None and resume.seed is not None else secrets.randbits(31)
            self.seed = dist.broadcast_int(self.seed, device)  # every rank must shuffle alike
        device.manual_seed(self.seed)
        align_note = align.seed_all(self.seed, device) if run.deterministic else None

        self.train_loader, self.val_loader, self.info = data.build(
            plan.data, device, data.Sampling(self.batch_per_rank, dist.rank, world, self.workers, self.seed),
            need_train=not run.evaluate, channels_last=plan.model.channels_last, num_classes=plan.model.num_classes)
        self.num_classes = plan.model.num_classes or self.info.num_classes
        self.model = build_model(plan.model, self.num_classes, device, world, plan.weights)
        self.dumper, self.batch_print = None, None  # --precision-dump's msprobe; --deterministic's batch fingerprint
        if run.deterministic or run.precision_dump is not None:  # what tools/align.py config compares
            self.batch_print = align.BatchFingerprint()
            n = align.remove_dropout(self.model) if run.deterministic else 0
            if summary is not None:
                summary.update(alignment=align.record(self.seed, run.deterministic, n, self.model))
        self.precision = amp.resolve(plan.precision, device, world, amp_probe.for_run(
            plan, self.model, device, dist, self.batch_per_rank, timer=amp_timer))
        log("=> {} on {} | {} process(es) | batch {} per device, {} global | lr {} ({} schedule, {}) "
            "| amp {} | data {} ({}, {} train / {}, {} backend, {} per process)".format(
                plan.model.arch, device.name, world, self.batch_per_rank, run.batch_size, plan.optim.lr,
                plan.optim.lr_schedule, counted(plan.optim.warmup_epochs, "warm-up epoch"), amp_label(self.precision),
                self.info.layout, counted(self.num_classes, "class"), self.info.train_images,
                counted(self.info.val_images, "val image"), self.info.backend, counted(self.workers, "worker")),
            all_ranks=True)
        for note in filter(None, (self.info.note, align_note)):
            log("note: " + note)
        self.normalize = data.Normalizer(device, plan.model.channels_last)
        self.eval_criterion = torch.nn.CrossEntropyLoss(reduction="none", label_smoothing=plan.optim.label_smoothing)
        self.zoo = metrics.ZooLines(run.modelzoo, device.index)  # the lines ModelZoo's scripts grep
        self.recorder, self.profiler, self.step, self.fallback_total = observe.Silent(), None, None, 0
        self.ema, self.last_ema_val = None, None  # --model-ema's average and its last validation
        self.model_for_eval, self.start_epoch, self.best_acc1, self.steps = self.model, run.start_epoch, None, 0
        self.last_val = None
        if run.evaluate:
            self._log_notes(tuple(plan.notes) + tuple(n for n in (self.precision.note,) if n))
        else:
            self._build_training(resume)

    def _build_training(self, resume):
        """The training parts: loss, optimizer step, resumed state, DDP, graph mode, schedule, profiler, saver."""
        plan, device, log = self.plan, self.device, self.log
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=plan.optim.label_smoothing).to(
            device.torch_device)
        choice = optim.build(plan.optim, self.model, device, self.precision)
        self.model, self.step = amp.wrap(choice, self.precision, device, self.model)
        self._log_notes(tuple(plan.notes) + tuple(self.step.notes))
        slower = device.compile_warning(self.precision.autocast_dtype) if plan.model.compile else None
        if slower:
            log("warning: " + slower)
        folders.check_same_epoch(self.dist, device, resume.epoch if resume is not None else plan.run.start_epoch,
                                 "'{}'".format(resume.path) if resume is not None else "no checkpoint in '{}'".format(
                                     plan.run.output_dir), (plan.launch.local_rank or 0) == 0)
        if resume is not None:
            self._restore(resume)
            plan.resume.release()  # the file's contents are in the parts now
        self.model_for_eval = self.model
        self.steps = len(self.train_loader)
        if plan.run.max_steps_per_epoch:
            self.steps = min(self.steps, plan.run.max_steps_per_epoch)
        if self.carry:
            log("=> continuing epoch {} at step {} of {} (a mid-epoch checkpoint{})".format(
                self.carry["epoch"], self.carry["step"], self.steps,
                ", saved for {}".format(self.carry["signal"]) if self.carry.get("signal") else ""))
        if self.due:
            log("=> validating epoch {} first: {} stopped the run before its validation".format(
                self.start_epoch - 1, self.due.get("signal") or "a stop"))
        self.ema = self._build_ema(resume)
        if self.dist.active and not self.precision.combine_ddp:  # with combine_ddp, apex all-reduces the gradients
            self.model = device.ddp(self.model, plan.launch.broadcast_buffers)
        self.model = graph.wrap(self.model, _unwrap(self.model_for_eval), device, plan.model, log)
        self.schedule = Schedule(plan.optim.lr, plan.optim.lr_schedule, plan.run.epochs, plan.optim.warmup_epochs,
                                 self.steps, plan.optim.lr_step_unit, plan.optim.warmup_offset,
                                 plan.optim.lr_peak_epoch)
        zoo.check_skip_steps(plan.run.skip_steps, self.steps)
        if plan.run.precision_dump is not None:
            first = self.start_epoch * self.steps + (self.carry or {}).get("step", 0)  # mid-epoch: inside the epoch
            self.dumper = align.Dumper(plan.run, self.dist.rank, first, _unwrap(self.model_for_eval), log)
        self.train_step = TrainStep(self.model, self.criterion, self.step, self.schedule, self.normalize, self.ema,
                                    self.dumper, log)
        if plan.run.profile_steps is not None:
            from trainer.record.profiling import StepProfiler
            self.profiler = StepProfiler(plan.run.profile_steps, plan.run.profile_stop, device, plan.run.output_dir,
                                         self.dist.rank, log)
        self.saver = checkpoint.CheckpointSaver(
            plan.run, _unwrap(self.model_for_eval), self.step, self.schedule, device,
            dict(arch=plan.model.arch, model=plan.model.name, num_classes=self.num_classes, classes=self.info.classes,
                 seed=self.seed, config=plan.as_dict()), self.ema)

    def _build_ema(self, resume):
        """--model-ema's average of the (resumed) weights, restored from the checkpoint; None without it."""
        plan, log = self.plan, self.log
        saved = resume.entries.get("model_ema") if resume is not None else None
        if not plan.optim.model_ema:
            if saved:
                log("note: the checkpoint's weight average (model_ema) is not kept: this run has no --model-ema")
            return None
        from trainer.optim.ema import ModelEMA
        ema = ModelEMA(_unwrap(self.model_for_eval), plan.optim, plan.run.batch_size, plan.run.epochs, self.steps)
        if saved:
            ema.load_state_dict(saved)
        elif resume is not None:
            log("note: the checkpoint holds no weight average (model_ema): the average starts from its weights")
        log("=> model EMA: updated every {} step(s) of an epoch, decay {:.6g} per update (--model-ema-decay {:g} "
            "adjusted for the global batch {}, the {} step(s) and {} epoch(s))".format(
                ema.every, ema.decay, ema.asked, plan.run.batch_size, ema.every, plan.run.epochs))
        return ema

    def _restore(self, resume):
        """The model, optimizer step, RNGs from ``resume`` (a checkpoint.Resume); the epoch and best Acc@1."""
        plan, log = self.plan, self.log
        _unwrap(self.model).load_state_dict(resume.state_dict)
        self.step.restore(resume.entries, log)
        checkpoint.restore_rng(resume.rng, self.device)
        saved = resume.lr_schedule
        mine = {"lr": plan.optim.lr, "kind": plan.optim.lr_schedule, "epochs": plan.run.epochs,
                "warmup_epochs": plan.optim.warmup_epochs}
        if plan.optim.lr_schedule == "triangular":
            mine["peak_epoch"] = plan.optim.lr_peak_epoch
        diffs = ["{} {} (checkpoint {})".format(k, mine[k], saved[k]) for k in mine
                 if k in saved and saved[k] != mine[k]]
        if diffs:
            log("note: the command line wins over the checkpoint's schedule: " + ", ".join(diffs))
        for note in world_change(resume.entries.get("config"), plan):
            log("note: " + note)
        if plan.run.start_epoch:
            log("note: --start-epoch {} ignored: resuming at epoch {} from the checkpoint".format(
                plan.run.start_epoch, resume.epoch))
        log("=> resumed '{}' at epoch {} (best Acc@1 {})".format(resume.path, resume.epoch, resume.best_acc1))
        self.start_epoch, self.best_acc1 = resume.epoch, resume.best_acc1
        self.carry, self.due = resume.entries.get("mid_epoch"), resume.entries.get("validation_due")

    def _log_notes(self, notes):
        """Each note as a ``note:`` line of the log, and all of them in the summary."""
        for note in notes:
            if note not in self.plan.shown:  # (printed as it arose: record/folders.py's take_folder)
                self.log("note: " + note)
        if self.summary is not None:
            self.summary.update(notes=list(notes))

    def _loops(self):
        """The epoch loops (trainer/engine.py) over this rank's device, process group, recorder and log."""
        return Loops(self.device, self.dist, self.normalize, self.recorder, self.log, self.zoo, self.plan.run,
                     val_tta=self.plan.data.val_tta, precision=self.precision, stop=self.stop,
                     batch=self.batch_per_rank, save=self._save_mid if self.step is not None else None)

    def _writing(self):
        """Around a checkpoint's and its summary's write: a signal meanwhile waits for it to be whole."""
        return self.stop.writing() if self.stop is not None else contextlib.nullcontext()

    def _save_mid(self, position):
        """--save-every: a mid-epoch checkpoint (by the rank that writes them), noted in the summary."""
        if self.summary is None:
            return
        saved = dict(epoch=position["epoch"], step=position["step"],
                     global_step=position["epoch"] * self.steps + position["step"])
        with self._writing():
            self.saver.save_mid(position, self.best_acc1)
            self.summary.update(last_saved=saved)
            self.summary.write()
        self.log("=> --save-every: checkpoint at epoch {epoch} step {step} (global step {global_step})".format(
            **saved))

    def _batch_print(self, images, target):
        """--deterministic: the fingerprint of the first batches so far, in the summary."""
        if self.batch_print is not None and self.batch_print.add(images, target) and self.summary is not None:
            self.summary.data.setdefault("alignment", {}).update(
                batches_sha256=self.batch_print.value(), batches_steps=self.batch_print.steps)

    def fit(self):
        """The epochs: train, validate, save, record. Returns 0, or 128 + a stop signal (a failure raises)."""
        run, dist, log, summary = self.plan.run, self.dist, self.log, self.summary
        self.recorder = observe.recorder_of(self)
        loops = self.loops = self._loops()
        try:
            totals = metrics.RunTotals()
            self._summarize(totals, epochs_completed=self.start_epoch, best_acc1=self.best_acc1)
            if summary is not None:
                summary.started = True
                if self.carry:
                    summary.update(resumed=dict(epoch=self.carry["epoch"], step=self.carry["step"],
                                                global_step=self.carry["epoch"] * self.steps + self.carry["step"],
                                                saved_for=self.carry.get("signal") or "--save-every"),
                                   steps_redone=0 if self.carry.get("signal") else None)
            if self.stop is not None:
                self.stop.armed = True  # from here a signal stops the run at a step boundary
                if self.stop.several or self.stop.asked:  # a signal while the ranks built the run (or a warning
                    # while one process did): they stop together, before training
                    asked = int(dist.max(self.stop.signum or 0, self.device))
                    if asked:
                        loops.agree(asked)
                        return self._stopped(loops, totals, self.start_epoch, self.carry["step"] if self.carry else 0,
                                             due=bool(self.due))
            if self.due:  # the last epoch trained whole, its validation not run: first of all, as it would have run
                code = self._end_epoch(loops, totals, self.start_epoch - 1, metrics.TrainStats(**dict(
                    self.due["train"], step_losses=tuple(map(tuple, self.due["train"]["step_losses"])),
                    step_lrs=tuple(map(tuple, self.due["train"]["step_lrs"])))))
                if code is not None:
                    return code
            resolution = data.schedule_of(self.plan.data)
            sizes = dict(resolution.changes(self.start_epoch, run.epochs)) if resolution is not None else {}
            for epoch in range(self.start_epoch, run.epochs):
                if epoch in sizes:
                    log("=> training resolution {} from epoch {}".format(sizes[epoch], epoch))
                carry, self.carry = (self.carry if epoch == self.start_epoch else None), None
                tr = loops.train_one_epoch(self.train_step, self.train_loader, epoch, self.steps,
                                           self.profiler, self._batch_print, carry)
                if loops.position is not None:  # a stop signal in the middle of the epoch
                    return self._stopped(loops, totals)
                totals.add(tr)
                code = self._end_epoch(loops, totals, epoch, tr)
                if code is not None:
                    return code
                if loops.stop_requested and not loops.stopped_by:
                    log("=> stopping after the profiled steps (--profile-stop)")
                    break
            if self.profiler is not None:
                self.profiler.close()  # a run that ended before END still leaves its trace
        finally:
            if self.stop is not None:
                self.stop.end()  # a signal from here on is recorded: the run has ended, as its summary will say
            self.recorder.close()
        if summary is not None:
            summary.write("ok")
            log("=> summary: {}".format(os.path.abspath(summary.path)), all_ranks=True)  # a node's own folder's too
        return 0

    def _end_epoch(self, loops, totals, epoch, tr):
        """After epoch ``epoch`` trained (``tr``: its TrainStats): validate where due, save, record, agree on a stop
        (one before the validation ended saves with it due, ``validation_due``). None, or a stop's exit code."""
        run, dist, summary = self.plan.run, self.dist, self.summary
        done = epoch + 1
        due = run.validate and (done % run.eval_freq == 0 or done == run.epochs or
                                loops.stop_requested and not loops.stopped_by)  # --profile-stop validates
        val = ema_val = rng = None
        if due and not loops.stopped_by:
            rng = checkpoint.rng_states(self.device)  # what a stop in the validation saves: the states before it
            val = loops.validate(self.model_for_eval, self.val_loader, self.eval_criterion)
            if val is not None and self.ema is not None:
                ema_val = loops.validate(self.ema.module, self.val_loader, self.eval_criterion, ema=True)
        if due and loops.stopped_by:  # a stop at the epoch's last step or in its validation: saved first
            return self._stopped(loops, totals, done, due=dict(train=dataclasses.asdict(tr)), rng=rng)
        is_best = val is not None and (self.best_acc1 is None or val.acc1 > self.best_acc1)
        if val is not None:
            self.last_val = val
        if is_best:
            self.best_acc1 = val.acc1
        overflow = self._check_health(epoch)
        if ema_val is not None:
            self.last_ema_val = ema_val
        if val is not None:
            self.recorder.validation(done * self.steps, dict(val.as_dict(), epoch_seconds=tr.seconds))
        if ema_val is not None:
            self.recorder.validation(done * self.steps, ema_val.as_dict(), "val_ema")
        if summary is not None:  # rank 0, and each node's local rank 0 whose --output-dir is its own
            with self._writing():
                self.saver.save(done, self.best_acc1, is_best)
                self._summarize(totals, self.last_val, epochs_completed=done, train_acc1=tr.acc1, final_loss=tr.loss,
                                last_loss=tr.last_loss, first_steps_seconds=list(self.loops.first_steps or ()),
                                best_acc1=self.best_acc1)
                summary.write()
            self.recorder.epoch_record(self._epoch_record(epoch, tr, (val, ema_val), overflow))
        if self.stop is None:
            dist.barrier()
            return None
        # every rank waits for the checkpoint here, and agrees on a stop that came since the last print step
        asked = loops.stopped_by or int(dist.max(self.stop.signum or 0, self.device))
        if not asked or done >= run.epochs:  # after the last epoch's checkpoint a stop has nothing left to stop
            return None
        loops.agree(asked)
        return self._stopped(loops, totals, done)

    def _stopped(self, loops, totals, done=None, step=0, due=None, rng=None):
        """A stop agreed by every rank: what the run holds saved first (mid-epoch, or with ``due`` the epoch's, its
        validation due, ``rng`` from before it), the summary (``interrupted``), a requeue. Returns 128 + the signal."""
        from trainer.job import stop as stops
        where, signame, best_acc1 = loops.position, stops.name(loops.stopped_by), self.best_acc1
        epoch, step = (done, step) if where is None else (where["epoch"], where["step"])
        global_step = epoch * self.steps + step
        before = ", before epoch {}'s validation".format(epoch - 1) if due else ""
        if self.summary is not None:
            # the checkpoint --resume auto continues from: this stop's, or the one this run resumed or saved last
            kept = self.saver.last if where is not None or isinstance(due, dict) or os.path.exists(self.saver.last) \
                else None
            self.log("=> {}: stopped at epoch {} step {} of {} (global step {}){}; {}".format(
                signame, epoch, step, self.steps, global_step, before, "checkpoint '{}'".format(kept) if kept else
                "no checkpoint yet"))
            if where is not None:
                self.saver.save_mid(dict(where, signal=signame), best_acc1)
            elif isinstance(due, dict):
                self.saver.save(done, best_acc1, False, dict(due, signal=signame), rng)
            self._summarize(totals, best_acc1=best_acc1)
            stopped = dict(signal=signame, epoch=epoch, step=step, global_step=global_step,
                           checkpoint=os.path.abspath(kept) if kept else None)
            if due:
                stopped["validation_due"] = True
            self.summary.update(stopped=stopped)
            self.summary.write("interrupted", "stopped by {} at epoch {} step {} (global step {}){}; continue with "
                                              "--resume auto".format(signame, epoch, step, global_step, before))
            if self.stop is not None and self.stop.later:
                self.log("=> {} while the run stopped: recorded, the checkpoint and summary were written whole".format(
                    ", ".join(stops.name(s) for s in self.stop.later)))
        self.dist.barrier()  # every rank leaves once the checkpoint is whole
        if self.stop is not None:
            self.stop.ignore()  # nothing is left to stop: the requeue's SIGTERM must not cut the exit short
        if self.dist.is_main:
            line = stops.requeue(loops.stopped_by)
            if line:
                self.log("=> " + line)
            if self.plan.launch.mode != "spawn":  # spawn's parent says it for all ranks
                sys.stderr.write(cli.interrupted_line(self.plan, signame, global_step) + "\n")
                sys.stderr.flush()
        return stops.exit_code(loops.stopped_by)

    def _check_health(self, epoch):
        """After an epoch, on every rank: CPU-decoded images and skipped steps logged, non-finite weights raise
        Diverged. Returns the skipped steps."""
        overflow = self.step.overflow_steps() if self.precision.scaled else 0
        fallbacks = self._fallbacks()
        if fallbacks:
            self.log("=> {} image(s) so far decoded on the CPU: not JPEGs the device decodes (PNG, CMYK, ...)".format(
                fallbacks))
        if overflow:
            self.log("=> {} step(s) skipped so far for inf/nan gradients (loss scale {})".format(
                overflow, self.step.loss_scale()))
        if not all_finite(_unwrap(self.model_for_eval).state_dict().values()):  # every rank stops alike
            raise Diverged("non-finite weights", {"epoch": epoch, "step": None, "lr": None,
                                                  "loss_scale": self.step.loss_scale()})
        return overflow

    def _fallbacks(self):
        """Images the device data backend decoded on the CPU, summed over ranks (all call this alike)."""
        n = sum(getattr(loader, "fallbacks", 0) for loader in (self.train_loader, self.val_loader))
        if self.info.backend != data.DEVICE_DECODE:
            return n
        n = int(self.dist.sum(n, self.device))  # one collective (this rank's count alone when not distributed)
        self.fallback_total = n
        return n

    def _epoch_record(self, epoch, tr, vals, overflow):
        """metrics.jsonl's line of an epoch (``vals``: the validations of the weights and of their average)."""
        val, ema_val = vals
        record = {
            "epoch": epoch, "global_step": (epoch + 1) * self.steps, **_losses("train_", tr), **_losses("val_", val),
            "lr": self.schedule(epoch, tr.steps - 1), "images_per_second": tr.fps, "fps_steps": tr.timed_steps,
            "data_wait_fraction": tr.data_wait_seconds / tr.seconds if tr.seconds else None,
            "overflow_steps": overflow, "seconds": tr.seconds, "arch": self.plan.model.arch,
            "device": self.device.name, "step_losses": [list(p) for p in tr.step_losses],
            "step_lrs": [list(p) for p in tr.step_lrs], "world_size": self.dist.world_size,
            "amp": amp_label(self.precision)}
        if self.ema is not None:
            record.update(_losses("ema_val_", ema_val))
        return record

    def summary_fields(self, totals=None, last_val=None):
        """summary.json's fields of this run (training: ``totals``, a metrics.RunTotals; the last validation)."""
        fields = dict(device=self.device.name, world_size=self.dist.world_size,
                      per_device_batch_size=self.batch_per_rank, data_layout=self.info.layout,
                      data_backend=self.info.backend, data_workers=self.workers, num_classes=self.num_classes)
        if self.step is None:  # an evaluation
            last = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear)]  # the classifier's classes
            fields.update(amp=self.precision.describe(), num_classes=last[-1].out_features if last else None)
        else:
            overflow = self.step.overflow_steps() if self.precision.scaled else 0
            trained = totals.trained_steps if totals is not None else 0
            fields.update(steps_per_epoch=self.steps, optimizer=self.step.name, train_images=self.info.train_images,
                          data_fallback_images=self.fallback_total, amp=self.step.describe(),
                          compile=self.model.describe(), compile_seconds=self.model.seconds,
                          overflow_steps=overflow, skipped_fraction=overflow / float(trained) if trained else 0.0,
                          param_groups=describe_groups(self.step.optimizer, self.step.groups),
                          **self.saver.existing())
            resolution = data.schedule_of(self.plan.data)
            if resolution is not None:  # the sizes of the whole run, from the epoch each starts at
                fields["train_resolutions"] = [{"from_epoch": e, "size": s}
                                               for e, s in resolution.changes(0, self.plan.run.epochs)]
            if self.ema is not None:
                last = self.last_ema_val
                fields["model_ema"] = dict(self.ema.describe(), final_acc1=last.acc1 if last else None,
                                           final_acc5=last.acc5 if last else None, val_loss=last.loss if last else None)
            if totals is not None:
                fields.update(totals.fields())
        if last_val is not None:
            fields.update(final_acc1=last_val.acc1, final_acc5=last_val.acc5, val_images=last_val.images,
                          val_loss=last_val.loss)
        return fields

    def _summarize(self, totals, last_val=None, **now):
        if self.summary is not None:
            self.summary.update(**dict(self.summary_fields(totals, last_val), **now))

    def evaluate(self):
        """--evaluate: one validation of the weights given (--resume FILE, --pretrained, or as initialised)."""
        plan, log, summary = self.plan, self.log, self.summary
        if plan.resume is not None:
            read = checkpoint.ema_state_dict_of if plan.optim.model_ema else checkpoint.state_dict_of
            sd = read(plan.resume.load(), plan.resume.path)  # checked by the plan
            plan.resume.release()
            self.model.load_state_dict(sd)
            log("=> evaluating {}'{}'".format("the weight average (model_ema) of " if plan.optim.model_ema else "",
                                             plan.resume.path))
        elif plan.model.pretrained is None:
            log("warning: --evaluate without --resume or --pretrained evaluates randomly initialised weights")
        if summary is not None:
            summary.started = True
        val = self._loops().validate(self.model, self.val_loader, self.eval_criterion)
        if summary is not None:
            self._summarize(None, val, best_acc1=val.acc1,
                            checkpoint=plan.resume.path if plan.resume is not None else None)
            summary.write("ok")
            log("=> summary: {}".format(os.path.abspath(summary.path)))
        return 0


def build_model(section, num_classes, device, world, weights=None):
    """The model ``section`` (as planned) describes, on ``device``: its --pretrained ``weights`` (a checkpoint.File)
    loaded, SyncBatchNorm in a job of ``world`` > 1 processes where asked, channels-last where chosen."""
    kwargs = {"zero_init_residual": True} if section.zero_init_residual else {}
    if section.blurpool:  # checked against the arch by the config
        kwargs["blurpool"] = True
    try:
        model = models.get_model(section.name, num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise UsageError("--arch {} does not take this option ({}); --zero-init-residual is for ResNets".format(
            section.arch, str(exc).splitlines()[0]))
    if weights is None and section.pretrained is not None:
        weights = checkpoint.File(section.pretrained, "weights file")
    if weights is not None:  # checked against this model by the plan (checkpoint.check_checkpoints)
        checkpoint.load_weights_into(model, weights, published=section.pretrained_published)
        weights.release()
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    if section.sync_bn and world > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device.torch_device)
    if section.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def _losses(prefix, stats):
    return {prefix + k: getattr(stats, k) if stats else None for k in ("loss", "acc1", "acc5")}


def _unwrap(model):
    return getattr(model, "module", model)


__all__ = ["Trainer", "build_model", "amp_label"]
