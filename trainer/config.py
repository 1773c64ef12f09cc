"""Command line -> validated, frozen ``Config``: what was asked (None: not given).

Every setting is declared once, in trainer/flags.py. The command line is parsed once (``flags.parse_typed``: the
flags given); the rest is filled in by layers: argparse's defaults, a recipe's, a ModelZoo entry's (trainer/zoo.py),
then the flags given, which win. Each section is made and checked by its own function (``data_section`` ...);
``validate`` composes them and checks what crosses sections. What a run decides from the config and the machine is
trainer/plan.py's ``Plan``.
"""
import argparse
import dataclasses
import os
from typing import NamedTuple, Optional, Tuple

from trainer import align, device_names, flags, options
from trainer.errors import UsageError
from trainer.flags import (FLAT, OPT_LEVELS, PUBLISHED, DataConfig, LaunchConfig, ModelConfig,  # noqa: F401
                           OptimConfig, PrecisionConfig, RunConfig, _normalise_device_list, build_parser)
from trainer.options import parse_device_list, parse_profile_steps  # noqa: F401 (re-exported)


@dataclasses.dataclass(frozen=True)
class Config:
    """The run's configuration: one frozen section per subsystem (each factory takes its own)."""
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    precision: PrecisionConfig = PrecisionConfig()
    launch: LaunchConfig = LaunchConfig()
    run: RunConfig = RunConfig()

    def as_dict(self):
        """Every field under its flat name (flags.FLAT); a plan.Plan's ``as_dict`` is the same, as decided."""
        return {name: getattr(getattr(self, section), field) for name, (section, field) in FLAT.items()}


class Parsed(NamedTuple):
    """The config (None for --list-models) and the notes on how the command line was adapted (``run`` logs them)."""
    cfg: Optional[Config]
    notes: Tuple[str, ...] = ()


PRESETTABLE = ("opt_level", "loss_scale")  # the precision flags whose recipe / ModelZoo values PrecisionConfig marks


def parse_config(argv=None, env=None, prog=None):
    """Parse and validate into a ``Parsed``; UsageError (one line) on bad input. ``prog``: the name started as
    (``8p_main_med.py``: ModelZoo's Shufflenetv2 entry)."""
    from trainer import recipes, zoo
    from trainer.job import placement

    env = os.environ if env is None else env
    parser = build_parser()
    typed = flags.parse_typed(parser, argv)  # the one parse: the flags given
    values = flags.convert_defaults(parser, flags.own_defaults(parser), typed)  # argparse's defaults
    if typed.get("list_models"):
        return Parsed(None)
    notes, layered = (), set()
    ns = argparse.Namespace(**dict(values, **typed))
    device_names.host_run_env(device_names.asked_kind(ns.device, ns.no_accel), env)  # before torch is imported
    place = placement.place(placement.Asked.of(vars(ns)), env)  # where this process sits: decided once
    if ns.recipe is not None:  # the recipe's values, scaled to the processes
        more, notes = recipes.flag_defaults(ns.recipe, place.processes(ns.device), typed, ns)
        values.update(flags.convert_defaults(parser, more, typed))
        layered.update(more)
        ns = argparse.Namespace(**dict(values, **typed))
    entry = zoo.entry(ns.modelzoo, ns.recipe, env, prog)
    if entry is not None:  # then the ModelZoo entry's
        more, note = zoo.defaults(entry, frozenset(typed))
        values.update(flags.convert_defaults(parser, more, typed))
        layered.update(more)
        notes = tuple(notes) + ((note,) if note else ())
        ns = argparse.Namespace(**dict(values, **typed))
    preset = tuple(k for k in PRESETTABLE if k in layered and k not in typed)
    cfg, more = validate(ns, env, place, frozenset(typed), entry, preset)
    return Parsed(cfg, tuple(notes) + more)


def _modelzoo_flags(ns, explicit, env):
    """ModelZoo's flags folded into ours: the warm-up (trainer/zoo.py), FPS warm-up, output folder, device list."""
    from trainer import zoo
    warm = zoo.warmup(ns, explicit) or (ns.warmup_epochs, ns.lr_step_unit, 0, ns.lr_schedule)
    if ns.mz_benchmark == 1:
        raise UsageError("--benchmark 1 (8p_main_med.py's gradient accumulation to 2048 images per optimizer step) "
                         "is not supported: pass the batch you want with -b (global), or --benchmark 0")
    fps_warmup = ns.fps_warmup_steps
    if ns.skip_steps is not None:
        if "fps_warmup_steps" in explicit and ns.fps_warmup_steps != ns.skip_steps:
            raise UsageError("--skip_steps {} and --fps-warmup-steps {} disagree: give one".format(
                ns.skip_steps, ns.fps_warmup_steps))
        fps_warmup = ns.skip_steps
    output_dir = ns.output_dir
    if ns.workspace is not None:
        if "output_dir" in explicit and os.path.abspath(ns.output_dir) != os.path.abspath(ns.workspace):
            raise UsageError("--workspace '{}' and --output-dir '{}' disagree: give one".format(
                ns.workspace, ns.output_dir))
        output_dir = ns.workspace
    if not ns.checkpoint_prefix or os.sep in ns.checkpoint_prefix or ns.checkpoint_prefix in (".", ".."):
        raise UsageError("--checkpoint-nameprefix must be a file name without a folder, got '{}'".format(
            ns.checkpoint_prefix))
    device_list = ns.device_list
    if ns.device_num is not None:
        if device_list is not None and len(device_list) != ns.device_num:
            raise UsageError("--device_num {} but --device-list {} names {} device(s): give one, or make them "
                             "agree".format(ns.device_num, ",".join(map(str, device_list)), len(device_list)))
        if ns.multiprocessing_distributed and env.get("RANK_SIZE") and env["RANK_SIZE"].strip() != str(ns.device_num):
            raise UsageError("--device_num {} but RANK_SIZE={}: the devices per node must agree".format(
                ns.device_num, env["RANK_SIZE"]))
        if device_list is None and ns.multiprocessing_distributed:
            device_list = tuple(range(ns.device_num))
    return warm, fps_warmup, output_dir, device_list


def _set(env, name):
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _float32_env(env, amp):
    """ModelZoo's ALLOW_HF32 / ALLOW_FP32 (its scripts' --hf32 / --fp32): float32 training with the reduced-precision
    float32 path allowed or not, as its main.py does. Returns (float32_math, amp, notes)."""
    hf32, fp32 = _set(env, "ALLOW_HF32"), _set(env, "ALLOW_FP32")
    if hf32 and fp32:
        raise UsageError("ALLOW_FP32 and ALLOW_HF32 cannot be set at the same time: unset one")
    if not (hf32 or fp32):
        return None, amp, ()
    name = "ALLOW_HF32" if hf32 else "ALLOW_FP32"
    notes = ("{} is set: float32 training as ModelZoo's main.py does, --amp ignored".format(name),) if amp else ()
    return ("reduced" if hf32 else "full"), False, notes


def _check_short_schedule(ns, explicit, lr_schedule, warmup_epochs):
    """--lr-peak-epoch, --model-ema-steps and --model-ema-decay against the flags they belong to."""
    if lr_schedule == "triangular":
        if ns.lr_peak_epoch >= ns.epochs:
            raise UsageError("--lr-peak-epoch {:g}{} is not below --epochs {}: the LR must come down to zero by the "
                             "end; give --lr-peak-epoch below {}".format(
                                 ns.lr_peak_epoch, "" if "lr_peak_epoch" in explicit else " (the default)", ns.epochs,
                                 ns.epochs))
        if warmup_epochs:
            raise UsageError("--lr-schedule triangular rises to --lr-peak-epoch by itself: a warm-up of {:g} epoch(s) "
                             "does not apply; give --warmup-epochs 0".format(warmup_epochs))
    elif "lr_peak_epoch" in explicit:
        raise UsageError("--lr-peak-epoch applies to --lr-schedule triangular, and the schedule is {}: add "
                         "--lr-schedule triangular or drop --lr-peak-epoch".format(lr_schedule))
    for dest in ("model_ema_steps", "model_ema_decay"):
        if dest in explicit and not ns.model_ema:
            raise UsageError("--{} needs --model-ema".format(dest.replace("_", "-")))
    if ns.model_ema_decay >= 1:
        raise UsageError("--model-ema-decay must be below 1 (1 would never move the average), got {:g}".format(
            ns.model_ema_decay))


RESOLUTION = ("min_res", "max_res", "start_ramp", "end_ramp")  # the schedule's dests (FFCV's names)
SIZES = ("train_crop_size", "val_resize_size", "val_crop_size") + RESOLUTION  # the size flags' dests
FFCV_CROP_RATIO = 224.0 / 256.0  # FFCV's validation crop: the centre crop is this fraction of the resized side


def _flag(dest):
    return "--" + dest.replace("_", "-")


def _resolution(ns, explicit):
    """(train_crop_size, (min_res, max_res, start_ramp, end_ramp) or Nones, notes). The schedule's flags given
    beside --train-crop-size contradict it; a recipe's schedule yields to it unless it ends at that size."""
    asked = [d for d in RESOLUTION if getattr(ns, d) is not None]
    none = (None, None, None, None)
    if not asked:
        return ns.train_crop_size, none, ()
    if "train_crop_size" in explicit:
        typed = [d for d in RESOLUTION if d in explicit]
        if typed:
            raise UsageError("--train-crop-size {} and {} contradict each other: the resolution schedule sets the "
                             "training size; give one".format(ns.train_crop_size, _flag(typed[0])))
        if ns.max_res != ns.train_crop_size:
            return ns.train_crop_size, none, (
                "--train-crop-size {} given: training stays at that size; the recipe's resolution schedule ({}) is "
                "not used".format(ns.train_crop_size, ", ".join(_flag(d) for d in asked)),)
    for a, b in (("min_res", "max_res"), ("max_res", "min_res")):
        if getattr(ns, a) is None:
            raise UsageError("{} needs {}: the resolution schedule takes --min-res and --max-res (and --start-ramp "
                             "and --end-ramp when they differ)".format(_flag(b), _flag(a)))
    lo, hi = ns.min_res, ns.max_res
    for dest, value in (("min_res", lo), ("max_res", hi)):
        if value % 32:
            raise UsageError("{} {} is not a multiple of 32 (the schedule's sizes are: FFCV's rounding, and a ResNet's "
                             "stride); give {} or {}".format(_flag(dest), value, max(32, value // 32 * 32),
                                                             value // 32 * 32 + 32))
    if lo > hi:
        raise UsageError("--min-res {} is above --max-res {}: the size rises from --min-res to --max-res".format(
            lo, hi))
    start, end = ns.start_ramp, ns.end_ramp
    if lo < hi and (start is None or end is None):
        raise UsageError("--min-res {} and --max-res {} need --start-ramp and --end-ramp: the epochs the size rises "
                         "between".format(lo, hi))
    start, end = start if start is not None else 0, end if end is not None else 0
    if start > end:
        raise UsageError("--start-ramp {} is after --end-ramp {}: give --start-ramp <= --end-ramp".format(start, end))
    if end > ns.epochs:
        raise UsageError("--end-ramp {} is beyond --epochs {}: give --end-ramp <= {}".format(end, ns.epochs, ns.epochs))
    return hi, (lo, hi, start, end), ()


def _val_sizes(ns):
    """(resize, crop) of validation: --val-resize-size by default --val-crop-size x 256/224, rounded."""
    resize = ns.val_resize_size
    if resize is None:
        resize = int(round(ns.val_crop_size / FFCV_CROP_RATIO))
    if ns.val_crop_size > resize:
        raise UsageError("--val-crop-size {} is larger than --val-resize-size {}: crop must fit in the resized image"
                         .format(ns.val_crop_size, resize))
    return resize, ns.val_crop_size


def _section(cls, ns, **decided):
    """Section ``cls``: each field declared with a flag takes the parsed flag's value, the ``decided`` ones theirs."""
    return cls(**dict({f.name: getattr(ns, dest) for dest, f, _ in options.declared(cls)}, **decided))


def data_section(ns, explicit):
    """(DataConfig, notes): the data set, the crops, the training sizes."""
    if ns.data and ns.data_opt and os.path.abspath(ns.data) != os.path.abspath(ns.data_opt):
        raise UsageError("DIR '{}' and --data '{}' disagree: give the data set once".format(ns.data, ns.data_opt))
    root = ns.data or ns.data_opt
    if not ns.dummy and not root:
        raise UsageError("no data set given: pass DIR (an ImageNet-style folder) or --dummy for synthetic data")
    val_resize_size, _ = _val_sizes(ns)
    train_crop_size, (min_res, max_res, start_ramp, end_ramp), notes = _resolution(ns, explicit)
    if not 0 < ns.crop_scale_min <= 1:
        raise UsageError("--crop-scale-min must be in (0, 1], got {}".format(ns.crop_scale_min))
    return _section(DataConfig, ns, root=root, train_crop_size=train_crop_size, val_resize_size=val_resize_size,
                    min_res=min_res, max_res=max_res, start_ramp=start_ramp, end_ramp=end_ramp,
                    sizes_given=bool(set(SIZES) & set(explicit))), notes


def model_section(ns):
    """(ModelConfig, notes): the network -a and --model-impl build, and its options."""
    import models
    model = models.resolve(ns.arch, ns.model_impl)
    if ns.model_impl == "torchvision" and ns.arch in models.VARIANTS.values():
        base = [k for k, v in models.VARIANTS.items() if v == ns.arch][0]
        raise UsageError("--model-impl torchvision with -a {}: that is this project's variant; use -a {} for "
                         "torchvision's network".format(ns.arch, base))
    if ns.blurpool and not models.blurpool_applies(model):
        raise UsageError("--blurpool applies to torchvision's ResNets (resnet*, resnext*, wide_resnet*), not to -a {}: "
                         "drop --blurpool".format(ns.arch))
    if ns.compile_mode != "default" and not ns.compile:
        raise UsageError("--compile-mode {} needs --compile".format(ns.compile_mode))
    notes = () if model == ns.arch else (
        "-a {} builds {}: the same network and weights with the channel shuffle as one copy (faster on NPU and "
        "CUDA); --model-impl torchvision for torchvision's own".format(ns.arch, model),)
    return _section(ModelConfig, ns, name=model, pretrained=None if ns.pretrained == PUBLISHED else ns.pretrained,
                    pretrained_published=ns.pretrained == PUBLISHED), notes


def optim_section(ns, explicit, warm):
    """The OptimConfig, with the warm-up ``warm`` (epochs, step unit, offset, schedule) ModelZoo's flags decide."""
    warmup_epochs, lr_step_unit, warmup_offset, lr_schedule = warm
    if ns.label_smoothing >= 1.0:
        raise UsageError("--label-smoothing must be below 1, got {}".format(ns.label_smoothing))
    if warmup_epochs > ns.epochs and lr_step_unit != "epoch":  # ModelZoo's per-epoch warm-up may outlast a short run
        raise UsageError("--warmup-epochs {:g} exceeds --epochs {}".format(warmup_epochs, ns.epochs))
    _check_short_schedule(ns, explicit, lr_schedule, warmup_epochs)
    return _section(OptimConfig, ns, warmup_epochs=warmup_epochs, lr_step_unit=lr_step_unit,
                    warmup_offset=warmup_offset, lr_schedule=lr_schedule)


def precision_section(ns, env, preset):
    """(PrecisionConfig, notes): --amp and its options (``preset``: those a recipe or the ModelZoo entry set)."""
    if ns.opt_level is not None and ns.opt_level not in OPT_LEVELS:
        raise UsageError("--opt-level must be O1 or O2, got '{}'".format(ns.opt_level))
    if ns.amp_impl == "apex" and not ns.amp:
        raise UsageError("--amp-impl apex needs --amp")
    if ns.combine_ddp and not ns.amp:
        raise UsageError("--combine-ddp is an option of apex.amp: it needs --amp (with Ascend apex)")
    if ns.amp_dtype != "auto" and not ns.amp:
        raise UsageError("--amp-dtype {} needs --amp".format(ns.amp_dtype))
    float32_math, amp, notes = _float32_env(env, ns.amp)
    return _section(PrecisionConfig, ns, amp=amp, float32_math=float32_math, preset=tuple(preset)), notes


def launch_section(ns, place):
    """(LaunchConfig, notes): the device and this process's place in the job (``place``: trainer/job/placement.py)."""
    device = device_names.asked_kind(ns.device, ns.no_accel)
    if device is None:  # --no-accel (pytorch/examples' flag: the CPU, whatever accelerator is present)
        raise UsageError("--device {} and --no-accel contradict each other: --no-accel runs on the CPU; drop one"
                         .format(ns.device))
    device_list, order_note = _normalise_device_list(ns.device_list)
    placed = {k: getattr(place, k) for k in ("world_size", "rank", "nodes", "node_rank", "procs_per_node", "dist_url",
                                             "addr", "port", "local_rank")}
    section = _section(LaunchConfig, ns, device=device, mode=place.mode, dist_timeout=float(ns.dist_timeout),
                       device_list=device_list if place.device_list is None else place.device_list, **placed)
    return section, (order_note,) * bool(order_note) + place.notes


def run_section(ns, explicit, entry, fps_warmup, output_dir):
    """The RunConfig: the run's length, what it resumes, where it writes."""
    if ns.start_epoch >= ns.epochs and not ns.evaluate:
        raise UsageError("--start-epoch {} leaves nothing to train with --epochs {}".format(ns.start_epoch, ns.epochs))
    if ns.evaluate and not ns.validate:
        raise UsageError("--evaluate with --no-validate has nothing to do")
    if not ns.tensorboard and ns.tensorboard_dir is not None:
        raise UsageError("--tensorboard-dir and --no-tensorboard contradict each other: give one")
    if ns.profile_stop and ns.profile_steps is None:
        raise UsageError("--profile-stop needs --profile-steps START:END")
    if ns.recipe is not None:
        from trainer import recipes
        recipes.get(ns.recipe)  # raises UsageError for unknown names
    align.check_flags(ns, explicit)
    tensorboard_dir = (ns.tensorboard_dir or os.path.join(output_dir, "tensorboard")) if ns.tensorboard else None
    return _section(RunConfig, ns, output_dir=output_dir, fps_warmup_steps=fps_warmup,
                    tensorboard_dir=tensorboard_dir, modelzoo=entry,
                    move_earlier_run=not ({"output_dir", "workspace"} & set(explicit)) and ns.resume is None)


def validate(ns, env, place, explicit=frozenset(), entry=None, preset=()):
    """(Config, notes) from parsed flags: what crosses sections (ModelZoo's flags, --pretrained DIR), then each
    section. ``place``: placement.place's; ``explicit``: the dests given; ``entry``: the ModelZoo entry; ``preset``:
    the PRESETTABLE dests that hold a recipe's or the entry's value."""
    warm, fps_warmup, output_dir, ns.device_list = _modelzoo_flags(ns, explicit, env)
    if ns.pretrained not in (None, PUBLISHED) and os.path.isdir(ns.pretrained) and not ns.data:
        # pytorch/examples' `main.py --pretrained DIR`: there --pretrained takes no value, so the folder is DIR
        ns.data, ns.pretrained = ns.pretrained, PUBLISHED
    data, data_notes = data_section(ns, explicit)
    model, model_notes = model_section(ns)
    optim = optim_section(ns, explicit, warm)
    precision, precision_notes = precision_section(ns, env, preset)
    launch, launch_notes = launch_section(ns, place)
    run = run_section(ns, explicit, entry, fps_warmup, output_dir)
    return Config(data, model, optim, precision, launch, run), data_notes + model_notes + launch_notes + precision_notes
