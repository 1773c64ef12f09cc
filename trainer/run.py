"""The run, top to bottom (pytorch/examples' main -> main_worker -> train/validate):

    run(cfg)      cheap checks in the launching process (one line, exit 2, before any rank starts),
                  then one worker per device (spawn) or this process as the one worker
    worker(cfg)   one rank: the device first (an Ascend rule), the process group, then build the Job
                  and train or evaluate; every outcome becomes a summary status and an exit code here
    build(...)    the Job: data, model, precision + optimizer step, resume, DDP, schedule, checkpoints
    train(job)    epochs: train, validate, checkpoint, summary
"""
import dataclasses
import functools
import math
import os
import secrets
import signal
import sys
from typing import Any, Optional

import torch

import models
from trainer import amp as ampmod
from trainer import affinity, amp_probe
from trainer import checkpoint, cli, data, distributed, folders, graph, launch, metrics, observe, ranks, summary, zoo
from trainer.clusters import world_change
from trainer.rendezvous import check_master, peer_failure, show_traces
from trainer import device as devmod
from trainer.device import Device, resolve_kind
from trainer.engine import Engine
from trainer.errors import UsageError, one_line
from trainer.guard import Diverged, all_finite
from trainer.schedule import Schedule

def preflight(cfg, reader=None):
    """Cheap checks in the launching process. Returns (``cfg`` settled for its device: the kind resolved,
    --amp-impl auto decided; the notes on what was settled). The files it reads stay with ``reader`` for this
    process's run."""
    reader = reader or checkpoint.Reader()
    cli.check_arch(cfg.model.arch)
    kind = resolve_kind(cfg.launch.device)
    launch.check_devices(cfg.launch, kind)
    cfg, notes = ampmod.settle(cfg.replace(device=kind), kind)
    if cfg.model.channels_last is None:
        cfg = cfg.replace(channels_last=devmod.prefers_channels_last(kind))
    cfg, more = launch.settle_backend(cfg, kind)
    notes += more + launch.check_launch(cfg.launch, kind)
    check_master(cfg.launch)
    if cfg.model.compile:
        missing = devmod.compile_missing(kind)
        if missing:
            raise UsageError(missing)
        if cfg.run.evaluate:
            notes += ("--compile applies to training: the evaluation runs eagerly",)
    if cfg.model.sync_bn and not devmod.supports_sync_bn(kind):
        raise UsageError("--sync-bn needs NPU or CUDA devices (SyncBatchNorm has no CPU kernel); drop it on CPU")
    if not cfg.data.dummy:
        data.check_data_root(cfg.data.root, need_train=not cfg.run.evaluate)
    if cfg.model.pretrained_published:
        cfg = cfg.replace(pretrained=checkpoint.published_weights(cfg.model.arch, cfg.model.name))
    if cfg.model.pretrained is not None:
        reader.read(cfg.model.pretrained, "weights file")
    resume = checkpoint.resolve_resume(cfg.run.resume, cfg.run.output_dir, cfg.run.checkpoint_prefix)
    if resume is not None:
        if cfg.run.evaluate:
            checkpoint.state_dict_of(reader.read(resume), resume)
        else:
            checkpoint.read_training(resume, cfg.model.arch, reader)
    if os.path.exists(cfg.run.output_dir) and not os.path.isdir(cfg.run.output_dir):
        raise UsageError("--output-dir '{}' is a file, not a folder".format(cfg.run.output_dir))
    return cfg, notes


def run(cfg, notes=(), amp_timer=None):
    """Entry point after parsing (``notes`` as ``parse_config`` returned them): returns the
    process exit code. ``amp_timer``: the timing function of the --amp dtype probe (trainer/amp_probe.py
    ``time_steps`` by default)."""
    reader = checkpoint.Reader()
    cfg, more = preflight(cfg, reader)
    notes = tuple(notes) + more
    held_lock = None
    if folders.owns_folder(cfg):
        held_lock, more = folders.take_folder(cfg)
        notes += more
    try:
        if cfg.launch.mode == "spawn":  # the ranks read for themselves
            return ranks.spawn(cfg, cfg.launch.device, functools.partial(worker, notes=notes, amp_timer=amp_timer))
        return worker(cfg, reader, notes, amp_timer)
    finally:
        if held_lock is not None:
            held_lock.release()


def worker(cfg, reader=None, notes=(), amp_timer=None):
    """One process (one rank). Returns its exit code: 0 ok, 2 a user error (one line), 4 diverged,
    130 interrupted; anything else is raised (exit 1). ``reader``: the files ``preflight`` read in this
    process; ``notes``: what parsing and preflight settled, logged once the run is built."""
    cli.append_to_shared_log()  # several ranks may share one log file (ModelZoo's loops)
    try:
        # Ascend rule: the device is set first, once, before any tensor or model touches it.
        bound = affinity.bind(cfg.launch, cfg.launch.device)  # before any thread or data worker starts
        device = Device.create(cfg.launch.device, launch.device_index(cfg.launch))
        settings = device.configure(cfg.launch)
        host_memory = devmod.keep_host_memory(device.kind)
        dist = distributed.init(cfg.launch, device)
    except UsageError as exc:
        summary.failed_start(cfg, exc)
        return cli.report(exc)
    log, rs, node_lock = metrics.Logger(dist.rank), None, None
    log(affinity.describe(bound), all_ranks=True)
    log("=> device settings: " + ", ".join("{} {}".format(k, v) for k, v in settings.items()))
    if cfg.precision.float32_math is not None:  # ModelZoo's ALLOW_HF32 / ALLOW_FP32
        notes = tuple(notes) + (device.set_float32_math(cfg.precision.float32_math),)
    try:
        writes, node_lock, more = folders.node_writer(cfg, dist, device, log)
        notes = tuple(notes) + more
        if writes:
            os.makedirs(cfg.run.output_dir, exist_ok=True)
            name = summary.EVAL_SUMMARY if cfg.run.evaluate else summary.SUMMARY
            rs = summary.RunSummary(cfg, os.path.join(cfg.run.output_dir, name))
            rs.update(host_memory=host_memory, cpu_binding=bound, device_settings=settings)
        job = build(cfg, device, dist, log, rs, reader or checkpoint.Reader(), notes, amp_timer)
        return evaluate(job) if cfg.run.evaluate else train(job)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C (or spawn's supervisor passing it on)
        _finish(rs, "interrupted", "interrupted by the user")  # must not cut the summary short
        if dist.is_main and cfg.launch.mode != "spawn":  # spawn's parent says it for all ranks
            sys.stderr.write(cli.interrupted_line(cfg) + "\n")
            sys.stderr.flush()
        else:
            log.warn("interrupted")
        return 130
    except Diverged as exc:
        _finish(rs, "diverged", exc.message(), diverged=exc.info)
        if dist.is_main:
            sys.stderr.write("error: {}\n".format(exc.message()))
            sys.stderr.flush()
        return exc.exit_code
    except UsageError as exc:
        _finish(rs, "failed", one_line(exc))
        return cli.report(exc)
    except BaseException as exc:
        line = None if show_traces() else peer_failure(exc, cfg.launch, dist.store)
        if line is not None or devmod.out_of_memory(exc):
            line = line or cli.out_of_memory_line(cfg, device)
            _finish(rs, "failed", line)
            sys.stderr.write("error: {}\n".format(line))
            sys.stderr.flush()
            return 1
        _finish(rs, "failed", "{}: {}".format(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))
        raise
    finally:
        dist.close()
        if node_lock is not None:
            node_lock.release()


def _finish(rs, status, error, **fields):
    """A run that started records how it ended; one that never started leaves an existing summary alone."""
    if rs is not None and rs.started:
        rs.update(**fields)
        rs.write(status, error)


@dataclasses.dataclass
class Job:
    """Everything one rank's run is made of (built by ``build``; the training parts are None in an evaluation)."""
    cfg: Any
    device: Any
    dist: Any
    log: Any
    rs: Any  # summary.RunSummary of the rank that writes one, else None
    info: Any  # data.DataInfo
    num_classes: int
    batch_per_rank: int
    workers: int
    seed: int
    precision: Any
    train_loader: Any
    val_loader: Any
    normalizer: Any
    resume_path: Optional[str]
    model: Any  # what trains: a graph.Graph of the model, DDP-wrapped where distributed
    model_for_eval: Any  # the bare model
    criterion: Any = None
    step: Any = None  # the optimizer step (trainer/amp.py)
    start_epoch: int = 0
    best_acc1: Optional[float] = None
    steps: int = 0  # per epoch
    schedule: Any = None
    profiler: Any = None
    saver: Any = None
    eval_state_dict: Optional[dict] = None  # --evaluate --resume FILE: the weights to evaluate
    fallback_total: int = 0  # images the device data backend had decoded on the host (summed over ranks)


def _log_notes(notes, log, rs):
    """Each note as a ``note:`` line of the log, and all of them in the summary."""
    for note in notes:
        log("note: " + note)
    if rs is not None:
        rs.update(notes=list(notes))


def build(cfg, device, dist, log, rs, reader, notes=(), amp_timer=None):
    world = dist.world_size
    batch_per_rank = cfg.run.batch_size // world
    procs = max(1, cfg.launch.procs_per_node)
    if cfg.data.dummy:
        workers = 0  # batches made once on the device
    elif cfg.data.workers is None:
        workers = devmod.default_workers(device.kind, procs, affinity.node_cpus())
    else:
        workers = int(math.ceil(cfg.data.workers / float(procs)))
    resume_path = checkpoint.resolve_resume(cfg.run.resume, cfg.run.output_dir, cfg.run.checkpoint_prefix)
    resume = None
    if resume_path is not None and not cfg.run.evaluate:
        resume = checkpoint.read_training(resume_path, cfg.model.arch, reader)
    elif cfg.run.resume == "auto" and not cfg.run.evaluate:
        log("=> no checkpoint in '{}' to resume: starting a new run".format(cfg.run.output_dir))

    seed = cfg.run.seed
    if seed is None:
        seed = resume.seed if resume is not None and resume.seed is not None else secrets.randbits(31)
        seed = dist.broadcast_int(seed, device)  # every rank must shuffle alike
    device.manual_seed(seed)

    train_loader, val_loader, info = data.build(cfg.data, device, batch_per_rank, dist.rank, world, workers, seed,
                                                need_train=not cfg.run.evaluate,
                                                channels_last=cfg.model.channels_last,
                                                num_classes=cfg.model.num_classes)
    num_classes = cfg.model.num_classes or info.num_classes
    if cfg.model.num_classes is not None and info.classes is not None and cfg.model.num_classes < info.num_classes:
        raise UsageError("--num-classes {} is below the {} class folders in the data".format(
            cfg.model.num_classes, info.num_classes))
    model = build_model(cfg, num_classes, device, world, log, reader)
    precision = ampmod.resolve(cfg.precision, device, world,
                               amp_probe.for_run(cfg, model, device, dist, batch_per_rank, timer=amp_timer))
    log("=> {} on {} | {} process(es) | batch {} per device, {} global | lr {} ({} schedule, {} warm-up epochs) "
        "| amp {} | data {} ({} classes, {} train / {} val images, {} backend, {} workers per process)".format(
            cfg.model.arch, device.name, world, batch_per_rank, cfg.run.batch_size, cfg.optim.lr, cfg.optim.lr_schedule,
            cfg.optim.warmup_epochs, _amp_label(precision), info.layout, num_classes, info.train_images,
            info.val_images, info.backend, workers), all_ranks=True)
    if info.note:
        log("note: " + info.note)
    parts = dict(cfg=cfg, device=device, dist=dist, log=log, rs=rs, info=info, num_classes=num_classes,
                 batch_per_rank=batch_per_rank, workers=workers, seed=seed, precision=precision,
                 train_loader=train_loader, val_loader=val_loader,
                 normalizer=data.Normalizer(device, cfg.model.channels_last), resume_path=resume_path)
    if cfg.run.evaluate:
        _log_notes(tuple(notes) + tuple(n for n in (precision.note,) if n), log, rs)
        sd = checkpoint.state_dict_of(reader.read(resume_path), resume_path) if resume_path is not None else None
        return Job(model=model, model_for_eval=model, eval_state_dict=sd, **parts)

    criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing).to(device.torch_device)
    model, step = ampmod.build_step(precision, device, model, cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay,
                                    optimizer=cfg.optim.optimizer)
    _log_notes(tuple(notes) + tuple(step.notes), log, rs)
    slower = device.compile_warning(precision.dtype if precision.impl == "native" else None) \
        if cfg.model.compile else None
    if slower:
        log("warning: " + slower)
    start_epoch, best_acc1 = cfg.run.start_epoch, None
    folders.check_same_epoch(dist, device, resume.epoch if resume is not None else cfg.run.start_epoch,
                             "'{}'".format(resume_path) if resume is not None else "no checkpoint in '{}'".format(
                                 cfg.run.output_dir), (cfg.launch.local_rank or 0) == 0)
    if resume is not None:
        if resume.epoch >= cfg.run.epochs:
            raise UsageError("'{}' has completed {} epoch(s), and --epochs is {}: nothing left to train (raise "
                             "--epochs to continue)".format(resume_path, resume.epoch, cfg.run.epochs))
        start_epoch, best_acc1 = _restore(cfg, resume, model, step, device, log)
    model_for_eval = model
    if dist.active and not precision.combine_ddp:  # with combine_ddp, apex all-reduces the gradients
        model = device.ddp(model, cfg.launch.broadcast_buffers)
    model = graph.wrap(model, _unwrap(model_for_eval), device, cfg.model, log)
    steps = len(train_loader)
    if cfg.run.max_steps_per_epoch:
        steps = min(steps, cfg.run.max_steps_per_epoch)
    schedule = Schedule(cfg.optim.lr, cfg.optim.lr_schedule, cfg.run.epochs, cfg.optim.warmup_epochs, steps,
                        cfg.optim.lr_step_unit, cfg.optim.warmup_offset)
    zoo.check_skip_steps(cfg.run.skip_steps, steps)
    profiler = None
    if cfg.run.profile_steps is not None:
        from trainer.profiling import StepProfiler
        profiler = StepProfiler(cfg.run.profile_steps, cfg.run.profile_stop, device, cfg.run.output_dir, dist.rank, log)
    return Job(model=model, model_for_eval=model_for_eval, criterion=criterion, step=step, start_epoch=start_epoch,
               best_acc1=best_acc1, steps=steps, schedule=schedule, profiler=profiler,
               saver=checkpoint.CheckpointSaver(cfg.run.output_dir, cfg.run.checkpoint_prefix,
                                                cfg.run.checkpoint_freq), **parts)


def build_model(cfg, num_classes, device, world, log=None, reader=None):
    """The model on ``device``: built, its --pretrained weights loaded (a note about them goes to ``log``),
    SyncBatchNorm where asked, channels-last where chosen."""
    kwargs = {"zero_init_residual": True} if cfg.model.zero_init_residual else {}
    try:
        model = models.get_model(cfg.model.name, num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise UsageError("--arch {} does not take this option ({}); --zero-init-residual is for ResNets".format(
            cfg.model.arch, str(exc).splitlines()[0]))
    if cfg.model.pretrained is not None:
        note = checkpoint.load_weights_into(model, cfg.model.pretrained, published=cfg.model.pretrained_published,
                                            reader=reader)
        if note and log is not None:
            log("note: " + note)
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    if cfg.model.sync_bn and world > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device.torch_device)
    if cfg.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def _amp_label(precision):
    if not precision.enabled:
        if precision.probe is not None:
            return "off (float32: measured faster than bfloat16 here)"
        return "off" if precision.note is None else "off (float32: no native bfloat16 here)"
    return "{} {}".format(precision.impl, precision.dtype_name)


def recorder(job):
    """Rank 0's ``observe.Recorder`` (TensorBoard, metrics.jsonl, progress bar); ``Silent`` elsewhere."""
    cfg = job.cfg
    if not job.dist.is_main:
        return observe.Silent()
    mode, note = observe.progress_mode(cfg.run.progress)
    if note:
        job.log("note: " + note)
    return observe.Recorder(cfg.run.output_dir, cfg.run.tensorboard_dir, mode == "bar", job.start_epoch, job.steps,
                            cfg.as_dict(), job.log)


def train(job):
    rec = recorder(job)
    try:
        return _train(job, rec)
    finally:
        rec.close()


def _train(job, rec):
    cfg, dist, log, rs = job.cfg, job.dist, job.log, job.rs
    engine = Engine(job.model, job.criterion, job.step, job.precision, job.device, dist, job.normalizer,
                    job.schedule, cfg, log, job.profiler, rec)
    totals = metrics.RunTotals()
    best_acc1, last_val = job.best_acc1, None
    _record(job, totals, epochs_completed=job.start_epoch, best_acc1=best_acc1, **job.saver.existing())
    if rs is not None:
        rs.started = True
    for epoch in range(job.start_epoch, cfg.run.epochs):
        tr = engine.train_one_epoch(job.train_loader, epoch, job.steps)
        totals.add(tr)
        done = epoch + 1
        val = None
        if cfg.run.validate and (done % cfg.run.eval_freq == 0 or done == cfg.run.epochs or engine.stop_requested):
            val = last_val = engine.validate(job.val_loader, job.model_for_eval)
        is_best = val is not None and (best_acc1 is None or val.acc1 > best_acc1)
        if is_best:
            best_acc1 = val.acc1
        overflow = job.step.overflow_steps() if job.precision.scaled else 0
        fallbacks = _fallbacks(job)
        if fallbacks:
            log("=> {} image(s) so far decoded on the CPU: not JPEGs the device decodes (PNG, CMYK, ...)".format(
                fallbacks))
        if overflow:
            log("=> {} step(s) skipped so far for inf/nan gradients (loss scale {})".format(
                overflow, job.step.loss_scale()))
        if not all_finite(_unwrap(job.model_for_eval).state_dict().values()):  # every rank stops alike
            raise Diverged("non-finite weights", {"epoch": epoch, "step": None, "lr": None,
                                                  "loss_scale": job.step.loss_scale()})
        if val is not None:
            rec.validation(done * job.steps, dict(val.as_dict(), epoch_seconds=tr.seconds))
        if rs is not None:  # rank 0, and each node's local rank 0 whose --output-dir is its own
            job.saver.save(_checkpoint_state(job, done, best_acc1), is_best)
            _record(job, totals, epochs_completed=done, train_acc1=tr.acc1, final_loss=tr.loss,
                    last_loss=tr.last_loss, first_steps_seconds=list(engine.first_steps or ()),
                    best_acc1=best_acc1, last_val=last_val, **job.saver.existing())
            rs.write()
            rec.epoch_record({
                "epoch": epoch, "global_step": done * job.steps, "train_loss": tr.loss, "train_acc1": tr.acc1,
                "train_acc5": tr.acc5, "val_loss": val.loss if val else None,
                "val_acc1": val.acc1 if val else None, "val_acc5": val.acc5 if val else None,
                "lr": job.schedule(epoch, tr.steps - 1), "images_per_second": tr.fps, "fps_steps": tr.timed_steps,
                "data_wait_fraction": tr.data_wait_seconds / tr.seconds if tr.seconds else None,
                "overflow_steps": overflow, "seconds": tr.seconds, "arch": cfg.model.arch, "device": job.device.name,
                "step_losses": [list(p) for p in tr.step_losses],
                "world_size": dist.world_size, "amp": _amp_label(job.precision)})
        dist.barrier()
        if engine.stop_requested:
            log("=> stopping after the profiled steps (--profile-stop)")
            break
    if job.profiler is not None:
        job.profiler.close()  # a run that ended before END still leaves its trace
    if rs is not None:
        rs.write("ok")
        log("=> summary: {}".format(os.path.abspath(rs.path)), all_ranks=True)  # a node's own folder's too
    return 0


def _checkpoint_state(job, done, best_acc1):
    return job.saver.state(
        epoch=done, arch=job.cfg.model.arch, model=job.cfg.model.name, num_classes=job.num_classes,
        classes=job.info.classes,
        state_dict=_unwrap(job.model_for_eval).state_dict(), best_acc1=best_acc1,
        lr_schedule=job.schedule.state_dict(), rng=checkpoint.rng_states(job.device), seed=job.seed,
        config=job.cfg.as_dict(), step_entries=job.step.checkpoint_entries())


def _record(job, totals, last_val=None, **fields):
    """summary.json's fields of a training run, all filled here (by the ranks that write a summary)."""
    if job.rs is None:
        return
    overflow = job.step.overflow_steps() if job.precision.scaled else 0
    job.rs.update(device=job.device.name, world_size=job.dist.world_size,
                  per_device_batch_size=job.batch_per_rank, steps_per_epoch=job.steps,
                  optimizer=job.step.name, data_layout=job.info.layout, train_images=job.info.train_images,
                  data_backend=job.info.backend, data_fallback_images=job.fallback_total,
                  data_workers=job.workers, num_classes=job.num_classes, amp=job.step.describe(),
                  compile=job.model.describe(), compile_seconds=job.model.seconds,
                  overflow_steps=overflow,
                  skipped_fraction=overflow / float(totals.trained_steps) if totals.trained_steps else 0.0,
                  **dict(totals.fields(), **fields))
    if last_val is not None:
        job.rs.update(final_acc1=last_val.acc1, final_acc5=last_val.acc5, val_images=last_val.images,
                      val_loss=last_val.loss)


def _fallbacks(job):
    """Images the device data backend had decoded on the CPU (not JPEG, or a colour mode it does not take),
    summed over ranks: every rank calls this at the same points."""
    n = sum(getattr(loader, "fallbacks", 0) for loader in (job.train_loader, job.val_loader) if loader is not None)
    if job.info.backend != devmod.DEVICE_DECODE:
        return n
    n = int(job.dist.sum(n, job.device))  # one collective (this rank's count alone when not distributed)
    job.fallback_total = n
    return n


def evaluate(job):
    cfg, log, rs, model = job.cfg, job.log, job.rs, job.model
    if job.resume_path is not None:
        sd = job.eval_state_dict
        try:
            model.load_state_dict(sd)
        except RuntimeError as exc:
            raise UsageError("'{}' does not fit --arch {} with {} classes ({})".format(
                job.resume_path, cfg.model.arch, model_num_classes(model), str(exc).splitlines()[0][:160]))
        log("=> evaluating '{}'".format(job.resume_path))
    elif cfg.model.pretrained is None:
        log("warning: --evaluate without --resume or --pretrained evaluates randomly initialised weights")
    engine = Engine(model, None, None, job.precision, job.device, job.dist, job.normalizer, None, cfg, log)
    if rs is not None:
        rs.started = True
    val = engine.validate(job.val_loader, model)
    if rs is not None:
        p = job.precision
        rs.update(device=job.device.name, world_size=job.dist.world_size,
                  per_device_batch_size=job.batch_per_rank,
                  final_acc1=val.acc1, final_acc5=val.acc5, best_acc1=val.acc1, val_images=val.images,
                  val_loss=val.loss, data_layout=job.info.layout, checkpoint=job.resume_path,
                  amp={"enabled": p.enabled, "impl": p.impl, "requested_dtype": p.requested,
                       "dtype": p.dtype_name, "note": p.note, "probe": p.probe},
                  num_classes=model_num_classes(model))
        rs.write("ok")
        log("=> summary: {}".format(os.path.abspath(rs.path)))
    return 0


def model_num_classes(model):
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return last[-1].out_features if last else None


def _unwrap(model):
    return getattr(model, "module", model)


def _restore(cfg, resume, model, step, device, log):
    """The model, optimizer step, RNGs from ``resume`` (a checkpoint.Resume); returns (start epoch, best Acc@1)."""
    _unwrap(model).load_state_dict(resume.state_dict)
    step.restore(resume.entries, log)
    checkpoint.restore_rng(resume.rng, device)
    saved = resume.lr_schedule
    mine = {"lr": cfg.optim.lr, "kind": cfg.optim.lr_schedule, "epochs": cfg.run.epochs,
            "warmup_epochs": cfg.optim.warmup_epochs}
    diffs = ["{} {} (checkpoint {})".format(k, mine[k], saved[k]) for k in mine if k in saved and saved[k] != mine[k]]
    if diffs:
        log("note: the command line wins over the checkpoint's schedule: " + ", ".join(diffs))
    for note in world_change(resume.entries.get("config"), cfg):
        log("note: " + note)
    if cfg.run.start_epoch:
        log("note: --start-epoch {} ignored: resuming at epoch {} from the checkpoint".format(
            cfg.run.start_epoch, resume.epoch))
    log("=> resumed '{}' at epoch {} (best Acc@1 {})".format(resume.path, resume.epoch, resume.best_acc1))
    return resume.epoch, resume.best_acc1
