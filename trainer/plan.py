"""A run, decided once: ``plan(cfg, env) -> Plan``, read top to bottom like a checklist.

``plan`` decides what follows from the ``Config`` (what was asked) and this machine, and checks every input parsing
could not: device kind, placement, precision, graph mode, data set, weights, the checkpoint to resume (read once per
process), whether those files fit the model, memory format. It starts no process and touches no device; the one file
it may write is torchvision's published weights (``--pretrained`` alone), into torch's cache.

A ``Plan`` answers as the config does (``plan.run.epochs``): the sections it decided carry the decisions, the others
are the config's; ``plan.cfg`` is the config untouched, ``plan.as_dict()`` what checkpoints record as "config".
"""
import dataclasses
import os
from typing import Optional, Tuple

import models
from trainer import data, inputs, zoo
from trainer.job import launch
from trainer.precision import amp
from trainer.record import checkpoint
from trainer.config import FLAT, Config, DataConfig, LaunchConfig, ModelConfig, PrecisionConfig, RunConfig
from trainer.device import Device
from trainer.errors import UsageError, counted


@dataclasses.dataclass(frozen=True)
class Plan:
    """One run's facts, decided by ``plan``; ``optim`` (and ``data``, ``run`` where not decided) are the config's."""
    cfg: Config  # what was asked
    kind: str  # the device kind (npu | cuda | cpu)
    launch: LaunchConfig  # the config's, with the kind, the backend and this process's place and device decided
    model: ModelConfig  # the config's, with the memory format and the weights file decided
    precision: PrecisionConfig  # the config's, with --amp-impl and the loss scale decided for the kind
    weights: Optional[checkpoint.File] = None  # --pretrained's file (read at most once a process)
    resume: Optional[checkpoint.File] = None  # the checkpoint to resume or evaluate (read at most once a process)
    notes: Tuple[str, ...] = ()
    shown: Tuple[str, ...] = ()  # notes printed as they arose (an earlier run moved aside): the log leaves them out
    run: Optional[RunConfig] = None  # the config's, with the global batch decided for the data set (None: as asked)
    data: Optional[DataConfig] = None  # the config's; -e --resume: the checkpoint's sizes where none was given

    def __post_init__(self):
        for name in ("data", "optim", "run"):  # decided as asked unless the plan decided otherwise
            if getattr(self, name, None) is None:
                object.__setattr__(self, name, getattr(self.cfg, name))

    def as_dict(self):
        """Every setting under its flat name, as decided (checkpoints' and summaries' "config")."""
        return {name: getattr(getattr(self, section), field) for name, (section, field) in FLAT.items()}

    def placed(self, **place):
        """This plan for a process at another place of the job (a spawned rank's ``LaunchConfig`` fields)."""
        section = dataclasses.replace(self.launch, **place)
        section = dataclasses.replace(section, device_index=launch.device_index(section))
        return dataclasses.replace(self, launch=section)


def check_arch(name):
    """The network ``-a`` names exists (one line naming the closest names where it does not)."""
    if not models.known(name):
        raise UsageError(models.unknown_message(name))


def plan(cfg, env=None, notes=(), found=None):
    """The run ``cfg`` asks for, decided and checked here (``env``: os.environ by default; ``notes``: parsing's;
    ``found``: ``inputs.check(cfg)``'s, where main.py made it before torch was imported). Raises UsageError (one
    line) on anything that cannot run."""
    run = cfg.run
    notes = list(notes)

    # the inputs that need no torch: the data set, the files named, the output folder (trainer/inputs.py)
    found = (found or inputs.check(cfg)).classes

    # the network asked for exists, and takes the options given
    check_arch(cfg.model.arch)
    if cfg.model.zero_init_residual and not models.blurpool_applies(cfg.model.name):
        raise UsageError("--zero-init-residual applies to torchvision's ResNets (resnet*, resnext*, wide_resnet*), "
                         "not to -a {}: drop it".format(cfg.model.arch))

    # the device kind (auto: the first kind that sees a device)
    kind = Device.resolve_kind(cfg.launch.device)
    device_class = Device.of(kind)

    # where the processes sit: their batch, the backend, the rendezvous and its master, this process's device
    section, more = launch.settle(cfg.launch, kind, run.batch_size, env)
    notes += more

    # precision: --amp-impl auto and apex's loss scale decided for the kind; flags without effect noted
    precision, more = amp.settle(cfg, kind)
    notes += more

    # graph mode, SyncBatchNorm
    notes += _graph(cfg, device_class)

    # the data set, and the classifier's size against its class folders
    run, num_classes, classes_from, more = _data(cfg, section, found)
    notes += more

    # the weights: --pretrained FILE, or torchvision's published ones (downloaded into torch's cache)
    weights = _weights(cfg.model)

    # the checkpoint to resume (or to evaluate): read once, carried in the plan
    resume = checkpoint.resolve_resume(run.resume, run.output_dir, run.checkpoint_prefix)
    resume = checkpoint.File(resume) if resume is not None else None
    if resume is not None and not run.evaluate:
        training = resume.training(cfg.model.arch)
        done = training.epoch  # a last epoch whose validation a stop left due still has that to run
        if done > run.epochs or done == run.epochs and not training.entries.get("validation_due"):
            raise UsageError("'{}' has completed {} epoch(s), and --epochs is {}: nothing left to train (raise "
                             "--epochs to continue)".format(resume.path, done, run.epochs))

    # --blurpool: a checkpoint of this project continues, or is evaluated, as the network it was trained as (the
    # state dicts of the two are alike, so only its config tells them apart)
    saved = resume.load().get("config") if resume is not None and isinstance(resume.load(), dict) else None
    if isinstance(saved, dict) and bool(saved.get("blurpool")) != cfg.model.blurpool:
        was = bool(saved.get("blurpool"))
        raise UsageError("'{}' was trained {} --blurpool: {} as it was trained ({} --blurpool)".format(
            resume.path, "with" if was else "without", "evaluate it" if run.evaluate else "resume it",
            "add" if was else "drop"))
    sizes = cfg.data
    if run.evaluate and isinstance(saved, dict) and not cfg.data.sizes_given:
        sizes, note = _checkpoint_sizes(cfg.data, saved, resume.path)
        notes += [note] if note else []

    # --model-ema: without validation the average is kept and saved only; --evaluate evaluates a checkpoint's
    notes += _model_ema(cfg, run, resume)

    # every file that loads into the model fits it: the weights, the checkpoint to resume or evaluate
    if weights is not None or resume is not None:
        own = checkpoint.model_shapes(cfg.model.name, num_classes)
        notes += checkpoint.check_checkpoints(weights, resume, cfg.model.pretrained_published, own,
                                              "--arch {} with {} ({})".format(
                                                  cfg.model.arch, counted(num_classes, "class"), classes_from))

    # the memory format: the device's where not asked
    channels_last = device_class.prefers_channels_last if cfg.model.channels_last is None else cfg.model.channels_last

    model = dataclasses.replace(cfg.model, channels_last=channels_last, pretrained=weights.path if weights else None)
    return Plan(cfg=cfg, kind=kind, launch=section, model=model, precision=precision, weights=weights,
                resume=resume, notes=tuple(notes), run=run, data=sizes)


def _graph(cfg, device_class):
    """--compile and --sync-bn on the device kind ``device_class``: their notes, or UsageError."""
    run, notes = cfg.run, []
    if cfg.model.compile:
        missing = device_class.compile_missing()
        if missing:
            raise UsageError(missing)
        if run.evaluate:
            notes.append("--compile applies to training: the evaluation runs eagerly")
        sizes = data.schedule_of(cfg.data) if not run.evaluate else None
        sizes = sorted({size for _, size in sizes.changes(run.start_epoch, run.epochs)}) if sizes else []
        if len(sizes) > 1:
            notes.append("--compile with a resolution schedule: each training size ({} px) compiles at the first "
                         "step of its first epoch, and only the first of them is left out of FPS".format(
                             ", ".join(map(str, sizes))))
    if cfg.model.sync_bn and not device_class.supports_sync_bn:
        raise UsageError("--sync-bn needs NPU or CUDA devices (SyncBatchNorm has no CPU kernel); drop it on CPU")
    return notes


def _data(cfg, section, found):
    """(run section with the batch fitted to the data, classifier size, where it came from, notes); ``found``: the
    class folders (inputs.check)."""
    run, notes = cfg.run, []
    num_classes, classes_from = cfg.model.num_classes, "--num-classes"
    if not cfg.data.dummy:
        if num_classes is None:  # (not below the class folders: inputs.check)
            num_classes, classes_from = found, "the data's class folders"
        if not run.evaluate:  # the batch: lowered to what train/ holds where it holds less than one batch
            world = section.nodes * len(section.device_list) if section.mode == "spawn" else section.world_size
            batch_size, note = data.fit_batch(cfg.data.root, run.batch_size, world)
            if note:
                notes.append(note)
                run = dataclasses.replace(run, batch_size=batch_size)
            if run.skip_steps is not None:  # ModelZoo's --skip_steps leaves steps of an epoch to time
                at_most = (run.skip_steps + 1) * run.batch_size
                steps = data.count_train(os.path.join(cfg.data.root, "train"), data.class_folders(cfg.data.root),
                                         at_most) // run.batch_size
                zoo.check_skip_steps(run.skip_steps, min(steps, run.max_steps_per_epoch or steps))
    elif num_classes is None:
        num_classes, classes_from = 1000, "--dummy data"
    return run, num_classes, classes_from, notes


def _weights(model):
    """--pretrained's file (torchvision's published weights downloaded into torch's cache), read; or None."""
    weights = model.pretrained
    if model.pretrained_published:
        weights = checkpoint.published_weights(model.arch, model.name)
    weights = checkpoint.File(weights, "weights file") if weights is not None else None
    if weights is not None:
        weights.load()
    return weights


def _model_ema(cfg, run, resume):
    """--model-ema's notes: without validation the average is only kept; -e evaluates a checkpoint's average."""
    notes = []
    if cfg.optim.model_ema and not run.validate:
        notes.append("--model-ema with --no-validate: the weight average is kept and saved in the checkpoints, "
                     "not validated")
    if run.evaluate and cfg.optim.model_ema:
        if resume is None:
            raise UsageError("--evaluate --model-ema evaluates a checkpoint's weight average: give --resume "
                             "CHECKPOINT (a run trained with --model-ema)")
        checkpoint.ema_state_dict_of(resume.load(), resume.path)
    return notes


def _checkpoint_sizes(asked, saved, path):
    """(data section, note or None) for ``-e --resume`` without a size flag: the checkpoint's validation sizes."""
    sizes = {k: saved.get(k) for k in ("val_resize_size", "val_crop_size")}
    now = (asked.val_resize_size, asked.val_crop_size)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes.values()) or \
            sizes["val_crop_size"] > sizes["val_resize_size"] or now == tuple(sizes.values()):
        return asked, None
    return dataclasses.replace(asked, **sizes), (
        "-e evaluates '{}' at the sizes its run validated at, --val-resize-size {} --val-crop-size {} (not {} / {}); "
        "give the size flags to evaluate at others".format(path, sizes["val_resize_size"], sizes["val_crop_size"],
                                                           *now))
