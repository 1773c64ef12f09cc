"""The flow: preflight -> (spawn) -> per process: device, process group, data, model,
optimizer, mixed precision, resume, DDP, epochs (train, validate, checkpoint), summary.

``preflight`` runs in the launching process and checks everything that can be checked
cheaply (data layout, output folder, resume and weights files, devices, apex), so that a
user mistake is one line and exit code 2 before any worker or rank starts.
"""
import math
import os
import secrets

import torch

import models
from trainer import amp as ampmod
from trainer import checkpoint, cli, data, distributed, metrics, summary
from trainer import device as devmod
from trainer.device import Device, resolve_kind
from trainer.engine import Engine
from trainer.errors import UsageError, one_line
from trainer.schedule import Schedule

RUN_FILES = (checkpoint.CHECKPOINT, checkpoint.BEST, summary.SUMMARY)


def preflight(cfg):
    """Cheap checks in the launching process; returns the resolved device kind."""
    cli.check_arch(cfg.arch)
    kind = resolve_kind(cfg.device)
    distributed.check_devices(cfg, kind)
    ampmod.MixedPrecision.check(cfg, kind)
    if cfg.sync_bn and not devmod.supports_sync_bn(kind):
        raise UsageError("--sync-bn needs NPU or CUDA devices (SyncBatchNorm has no CPU kernel); drop it on CPU")
    if not cfg.dummy:
        data.check_data_root(cfg.data, need_train=not cfg.evaluate)
    if cfg.pretrained is not None:
        checkpoint.read(cfg.pretrained, "weights file")
    resume = checkpoint.resolve_resume(cfg.resume, cfg.output_dir)
    if resume is not None:
        if cfg.evaluate:
            checkpoint.state_dict_of(checkpoint.read(resume), resume)
        else:
            checkpoint.load_training_checkpoint(resume, cfg.arch)
    if os.path.exists(cfg.output_dir) and not os.path.isdir(cfg.output_dir):
        raise UsageError("--output-dir '{}' is a file, not a folder".format(cfg.output_dir))
    if not cfg.evaluate and cfg.resume is None and cfg.rank == 0:  # rank 0 owns the folder
        held = [f for f in RUN_FILES if os.path.exists(os.path.join(cfg.output_dir, f))]
        if held:
            raise UsageError("--output-dir '{}' already holds a run ({}): pass --resume auto to continue it, "
                             "or choose another --output-dir".format(cfg.output_dir, ", ".join(held)))
    return kind


def run(cfg):
    """Entry point after parsing: returns the process exit code."""
    kind = preflight(cfg)
    if cfg.launch == "spawn":
        return distributed.spawn(cfg, kind, worker)
    return worker(cfg)


def worker(cfg):
    """One process (one rank). Returns an exit code; user errors print one line (exit 2)."""
    try:
        return _train_or_evaluate(cfg)
    except UsageError as exc:
        return cli.report(exc)


def _train_or_evaluate(cfg):
    # Ascend rule: the device is set first, once, before any tensor or model touches it.
    device = Device.create(cfg.device, distributed.device_index(cfg))
    dist = distributed.init(cfg, device)
    log = metrics.Logger(dist.rank)
    try:
        return _body(cfg, device, dist, log)
    finally:
        dist.close()


def _body(cfg, device, dist, log):
    world = dist.world_size
    batch_per_rank = cfg.batch_size // world
    procs = max(1, cfg.procs_per_node)
    workers = int(math.ceil(cfg.workers / float(procs)))
    out_dir = cfg.output_dir
    if dist.is_main:
        os.makedirs(out_dir, exist_ok=True)
    name = summary.EVAL_SUMMARY if cfg.evaluate else summary.SUMMARY
    rs = summary.RunSummary(cfg, os.path.join(out_dir, name)) if dist.is_main else None
    try:
        return _run(cfg, device, dist, log, world, batch_per_rank, workers, rs)
    except KeyboardInterrupt:
        if rs is not None and rs.started:
            rs.write("interrupted", "interrupted by the user")
        log.warn("interrupted")
        return 130
    except UsageError as exc:
        if rs is not None and rs.started:
            rs.write("failed", one_line(exc))
        raise
    except BaseException as exc:
        if rs is not None and rs.started:
            rs.write("failed", "{}: {}".format(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))
        raise


def _run(cfg, device, dist, log, world, batch_per_rank, workers, rs):
    resume_path = checkpoint.resolve_resume(cfg.resume, cfg.output_dir)
    ckpt = None
    if resume_path is not None and not cfg.evaluate:
        ckpt = checkpoint.load_training_checkpoint(resume_path, cfg.arch)
    elif cfg.resume == "auto" and not cfg.evaluate:
        log("=> no checkpoint in '{}' to resume: starting a new run".format(cfg.output_dir))

    seed = cfg.seed
    if seed is None:
        seed = ckpt.get("seed") if ckpt and ckpt.get("seed") is not None else secrets.randbits(31)
        seed = dist.broadcast_int(seed, device)  # every rank must shuffle alike
    device.manual_seed(seed)

    train_loader, val_loader, info = data.build(cfg, device, batch_per_rank, dist.rank, world, workers, seed,
                                                need_train=not cfg.evaluate)
    num_classes = cfg.num_classes or info.num_classes
    if cfg.num_classes is not None and info.classes is not None and cfg.num_classes < info.num_classes:
        raise UsageError("--num-classes {} is below the {} class folders in the data".format(
            cfg.num_classes, info.num_classes))

    kwargs = {"zero_init_residual": True} if cfg.zero_init_residual else {}
    try:
        model = models.get_model(cfg.arch, num_classes=num_classes, weights=cfg.pretrained, **kwargs)
    except TypeError as exc:
        raise UsageError("--arch {} does not take this option ({}); --zero-init-residual is for ResNets".format(
            cfg.arch, str(exc).splitlines()[0]))
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    if cfg.sync_bn and world > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device.torch_device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)

    log("=> {} on {} | {} process(es) | batch {} per device, {} global | lr {} ({} schedule, {} warm-up epochs) "
        "| amp {} | data {} ({} classes, {} train / {} val images)".format(
            cfg.arch, device.name, world, batch_per_rank, cfg.batch_size, cfg.lr, cfg.lr_schedule,
            cfg.warmup_epochs, "off" if not cfg.amp else cfg.amp_impl, info.layout, num_classes,
            info.train_images, info.val_images), all_ranks=True)

    normalizer = data.Normalizer(device, cfg.channels_last)
    mp = ampmod.MixedPrecision(cfg, device)

    if cfg.evaluate:
        return _evaluate(cfg, device, dist, log, model, mp, normalizer, val_loader, info, rs, resume_path)

    criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing).to(device.torch_device)
    optimizer, opt_name = device.sgd(model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay,
                                     apex_amp_in_use=mp.impl == "apex")
    model, optimizer = mp.setup(model, optimizer)
    for note in mp.notes:
        log("note: " + note)

    start_epoch, best_acc1 = cfg.start_epoch, None
    if ckpt is not None:
        if int(ckpt["epoch"]) >= cfg.epochs:
            raise UsageError("'{}' has completed {} epoch(s), and --epochs is {}: nothing left to train (raise "
                             "--epochs to continue)".format(resume_path, ckpt["epoch"], cfg.epochs))
        start_epoch, best_acc1 = _restore(cfg, ckpt, model, optimizer, mp, device, log, resume_path)

    model_for_eval = model
    if dist.active:
        model = device.ddp(model, cfg.broadcast_buffers)

    steps = len(train_loader)
    if cfg.max_steps_per_epoch:
        steps = min(steps, cfg.max_steps_per_epoch)
    schedule = Schedule(cfg.lr, cfg.lr_schedule, cfg.epochs, cfg.warmup_epochs, steps)
    profiler = None
    if cfg.profile_steps is not None:
        from trainer.profiling import StepProfiler
        profiler = StepProfiler(cfg.profile_steps, cfg.profile_stop, device, cfg.output_dir, dist.rank, log)
    engine = Engine(model, criterion, optimizer, mp, device, dist, normalizer, schedule, cfg, log, profiler,
                    grads_to_none=device.zero_grad_to_none(opt_name))

    ckpt_path = os.path.join(cfg.output_dir, checkpoint.CHECKPOINT)
    best_path = os.path.join(cfg.output_dir, checkpoint.BEST)
    if rs is not None:
        rs.update(device=device.name, world_size=world, per_device_batch_size=batch_per_rank,
                  steps_per_epoch=steps, optimizer=opt_name, data_layout=info.layout,
                  train_images=info.train_images, num_classes=num_classes, amp=mp.describe(),
                  best_acc1=best_acc1, epochs_completed=start_epoch)
        if os.path.exists(ckpt_path):
            rs.update(checkpoint=ckpt_path)
        if os.path.exists(best_path):
            rs.update(best_checkpoint=best_path)

    timed_images = timed_seconds = timed_steps = wait = wall = 0.0
    last_val = None
    if rs is not None:
        rs.started = True
    for epoch in range(start_epoch, cfg.epochs):
        tr = engine.train_one_epoch(train_loader, epoch, steps)
        if tr["fps"] is not None:
            timed_images += tr["fps"] * tr["timed_seconds"]
            timed_seconds += tr["timed_seconds"]
            timed_steps += tr["timed_steps"]
        wait += tr["data_wait_seconds"]
        wall += tr["seconds"]
        done = epoch + 1
        val = None
        if cfg.validate and (done % cfg.eval_freq == 0 or done == cfg.epochs or engine.stop_requested):
            val = engine.validate(val_loader, model_for_eval)
            last_val = val
        is_best = val is not None and (best_acc1 is None or val["acc1"] > best_acc1)
        if is_best:
            best_acc1 = val["acc1"]
        overflow = mp.overflow_steps() if mp.enabled else 0
        if overflow:
            log("=> {} step(s) skipped so far for inf/nan gradients (loss scale {})".format(
                overflow, mp.current_scale()))
        if dist.is_main:
            state = {
                "format_version": checkpoint.FORMAT_VERSION, "epoch": done, "arch": cfg.arch,
                "num_classes": num_classes, "classes": info.classes,
                "state_dict": _unwrap(model_for_eval).state_dict(),
                "best_acc1": float(best_acc1) if best_acc1 is not None else None,
                "optimizer": optimizer.state_dict(), "lr_schedule": schedule.state_dict(),
                "amp": mp.state_dict(), "rng": checkpoint.rng_states(device), "seed": seed,
                "config": cfg.as_dict(),
            }
            checkpoint.save(state, ckpt_path)
            if is_best:
                checkpoint.copy(ckpt_path, best_path)
            rs.update(epochs_completed=done, checkpoint=ckpt_path, train_acc1=tr["acc1"], final_loss=tr["loss"],
                      best_acc1=best_acc1, amp=mp.describe(),
                      train_fps=timed_images / timed_seconds if timed_seconds else None,
                      train_step_time_ms=1000.0 * timed_seconds / timed_steps if timed_steps else None,
                      data_time_fraction=wait / wall if wall else None)
            if os.path.exists(best_path):
                rs.update(best_checkpoint=best_path)
            if last_val is not None:
                rs.update(final_acc1=last_val["acc1"], final_acc5=last_val["acc5"], val_images=last_val["images"],
                          val_loss=last_val["loss"])
            rs.write()
        dist.barrier()
        if engine.stop_requested:
            log("=> stopping after the profiled steps (--profile-stop)")
            break
    if profiler is not None:
        profiler.close()  # a run that ended before END still leaves its trace
    if rs is not None:
        rs.write("ok")
        log("=> summary: {}".format(os.path.abspath(rs.path)))
    return 0


def _evaluate(cfg, device, dist, log, model, mp, normalizer, val_loader, info, rs, resume_path):
    if resume_path is not None:
        sd = checkpoint.state_dict_of(checkpoint.read(resume_path), resume_path)
        try:
            model.load_state_dict(sd)
        except RuntimeError as exc:
            raise UsageError("'{}' does not fit --arch {} with {} classes ({})".format(
                resume_path, cfg.arch, model_num_classes(model), str(exc).splitlines()[0][:160]))
        log("=> evaluating '{}'".format(resume_path))
    elif cfg.pretrained is None:
        log("warning: --evaluate without --resume or --pretrained evaluates randomly initialised weights")
    engine = Engine(model, None, None, mp, device, dist, normalizer, None, cfg, log)
    if rs is not None:
        rs.started = True
    val = engine.validate(val_loader, model)
    if rs is not None:
        rs.update(device=device.name, world_size=dist.world_size, per_device_batch_size=cfg.batch_size // dist.world_size,
                  final_acc1=val["acc1"], final_acc5=val["acc5"], best_acc1=val["acc1"], val_images=val["images"],
                  val_loss=val["loss"], amp=mp.describe(), data_layout=info.layout, checkpoint=resume_path,
                  num_classes=model_num_classes(model))
        rs.write("ok")
        log("=> summary: {}".format(os.path.abspath(rs.path)))
    return 0


def model_num_classes(model):
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return last[-1].out_features if last else None


def _unwrap(model):
    return getattr(model, "module", model)


def _restore(cfg, ckpt, model, optimizer, mp, device, log, path):
    _unwrap(model).load_state_dict(checkpoint.strip_module(ckpt["state_dict"]))
    if ckpt.get("optimizer"):
        optimizer.load_state_dict(ckpt["optimizer"])
    mp.load_state_dict(ckpt.get("amp"), log)
    checkpoint.restore_rng(ckpt.get("rng"), device)
    saved = ckpt.get("lr_schedule") or {}
    mine = {"lr": cfg.lr, "kind": cfg.lr_schedule, "epochs": cfg.epochs, "warmup_epochs": cfg.warmup_epochs}
    diffs = ["{} {} (checkpoint {})".format(k, mine[k], saved[k]) for k in mine if k in saved and saved[k] != mine[k]]
    if diffs:
        log("note: the command line wins over the checkpoint's schedule: " + ", ".join(diffs))
    if cfg.start_epoch:
        log("note: --start-epoch {} ignored: resuming at epoch {} from the checkpoint".format(
            cfg.start_epoch, ckpt["epoch"]))
    best = ckpt.get("best_acc1")
    log("=> resumed '{}' at epoch {} (best Acc@1 {})".format(path, ckpt["epoch"], best))
    return int(ckpt["epoch"]), (float(best) if best is not None else None)
