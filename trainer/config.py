"""Command line -> validated, frozen ``Config``: what was asked (None: not given).

The ``Config`` is never rebuilt: what a run decides from it and from the machine is trainer/plan.py's ``Plan``.
Nothing mutates the argparse namespace after ``parse_config`` returns. pytorch/examples' flags keep their
names and meanings; the additions are documented in ``--help`` and docs/RUNNING.md.
The command line is parsed once, every default None (``flags.parse_typed``: a value left None was not given);
the rest is filled in by layers: argparse's defaults, then a recipe's (``--recipe NAME``), then a ModelZoo entry's
(trainer/zoo.py), then the flags given, which win.
"""
import argparse
import dataclasses
import os
from typing import NamedTuple, Optional, Tuple, Union

from trainer.device_names import canonical_kind, without_accelerator
from trainer.errors import UsageError
from trainer import align, flags
from trainer.flags import (DEVICES, OPT_LEVELS, PUBLISHED, _normalise_device_list,  # noqa: F401
                           build_parser, parse_device_list, parse_profile_steps)  # (re-exported)
from trainer.optim import DEFAULT_OPTIMIZER


class _Section:
    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """What ``trainer.data.build`` reads."""
    root: Optional[str] = None  # DIR (None with --dummy)
    dummy: bool = False
    workers: Optional[int] = None  # per node; None: from the device kind and the cores (trainer.Trainer)
    train_crop_size: int = 224  # the fixed training size; with a resolution schedule its largest, max_res
    crop_scale_min: float = 0.08
    val_resize_size: int = 256
    val_crop_size: int = 224
    data_backend: str = "auto"  # auto | cpu | gpu
    # the training resolution schedule (trainer/data/resolution.py); min_res None: --train-crop-size throughout
    min_res: Optional[int] = None
    max_res: Optional[int] = None
    start_ramp: Optional[int] = None
    end_ramp: Optional[int] = None
    val_tta: str = "none"  # none | flip: validation averages the logits of each image and its mirror
    # a size flag (SIZES) was on the command line; else -e --resume evaluates at the checkpoint's sizes (plan.py)
    sizes_given: bool = False
    # the device backend's ways of working (data.LoaderSpec); None: the device's choice. No flags: set by tools
    decode_ahead: Optional[bool] = None
    batched_crops: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """What ``trainer.build_model`` reads (as the plan decided it: trainer/plan.py)."""
    arch: str = "resnet18"  # as given (checkpoints and summaries name it)
    name: str = "resnet18"  # the network built: --arch, or this project's variant of it (models.resolve)
    model_impl: str = "auto"
    pretrained: Optional[str] = None  # a weights file
    pretrained_published: bool = False  # --pretrained alone: torchvision's published weights (``pretrained``: the file)
    num_classes: Optional[int] = None  # None: the data's class count
    zero_init_residual: bool = False
    channels_last: Optional[bool] = None  # None: the device's default (decided by trainer/plan.py)
    sync_bn: bool = False
    compile: bool = False  # --compile: the training step in graph mode (trainer/graph.py)
    compile_mode: str = "default"
    blurpool: bool = False  # FFCV's BlurPool before a ResNet's strided convolutions (models/blurpool.py)


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    """What the optimizer (trainer.optim), its schedule and the loss read."""
    optimizer: str = DEFAULT_OPTIMIZER  # a name of trainer.optim.OPTIMIZERS
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_schedule: str = "step"
    warmup_epochs: float = 0.0
    label_smoothing: float = 0.0
    lr_step_unit: str = "step"  # step | epoch (ModelZoo's entries move the LR once per epoch)
    warmup_offset: int = 0  # per-epoch warm-up: lr x (epoch+1)/(warmup_epochs+offset); Shufflenetv2's is 1
    lr_peak_epoch: float = 2.0  # --lr-schedule triangular: where the LR peaks
    norm_weight_decay: Optional[float] = None  # norm parameters' and biases' (optim/groups.py); None: the optimizer's
    model_ema: bool = False  # an exponential moving average of the weights (trainer/optim/ema.py)
    model_ema_steps: int = 32
    model_ema_decay: float = 0.99998


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(_Section):
    """What trainer.precision.amp reads (--amp and its options)."""
    amp: bool = False
    amp_impl: str = "auto"  # auto | native | apex (auto is settled once the device is known: precision/amp.py settle)
    amp_dtype: str = "auto"
    opt_level: Optional[str] = None  # --opt-level; None: not given (apex runs at flags.APEX_OPT_LEVEL)
    loss_scale: Optional[Union[float, str]] = None  # None: not given; "dynamic" (cli.DYNAMIC); a number: held fixed
    combine_ddp: bool = False
    float32_math: Optional[str] = None  # ModelZoo's ALLOW_HF32 ("reduced") / ALLOW_FP32 ("full"); None: the device's
    # which of opt_level / loss_scale hold a --recipe's or ModelZoo entry's value, not one the command line gave
    # (trainer/precision/amp.py settle: apex's own loss scale wins over such a value, and it needs no note)
    preset: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LaunchConfig(_Section):
    """Where this process sits in the job and how it meets the others (trainer/job/launch.py)."""
    device: str = "auto"
    device_index: Optional[int] = None  # --gpu
    mode: str = "single"  # single | spawn | process
    world_size: int = 1  # total processes (spawn: known once the devices are counted)
    rank: int = 0  # global rank (spawn parent: this node's first rank)
    nodes: int = 1
    node_rank: int = 0
    procs_per_node: int = 1
    dist_url: Optional[str] = "env://"
    dist_backend: Optional[str] = None
    multiprocessing_distributed: bool = False
    device_list: Optional[Tuple[int, ...]] = None
    addr: Optional[str] = "127.0.0.1"
    port: Optional[int] = None
    local_rank: Optional[int] = None
    broadcast_buffers: bool = True
    dist_timeout: float = 1800.0
    # the host and device settings of each rank (trainer/job/affinity.py, Device.configure): auto | on | off
    cpu_binding: str = "auto"
    jit_compile: str = "auto"
    internal_format: str = "auto"
    pin_memory: str = "auto"


@dataclasses.dataclass(frozen=True)
class RunConfig(_Section, align.RunFields):
    """The run itself: its length and batch, what it resumes, where it writes, what it shows."""
    epochs: int = 90
    start_epoch: int = 0
    batch_size: int = 256  # global
    print_freq: int = 10
    resume: Optional[str] = None
    evaluate: bool = False
    seed: Optional[int] = None
    output_dir: str = "."
    eval_freq: int = 1
    validate: bool = True
    max_steps_per_epoch: Optional[int] = None
    fps_warmup_steps: int = 0
    recipe: Optional[str] = None
    profile_steps: Optional[Tuple[int, int]] = None
    profile_stop: bool = False
    progress: str = "auto"  # auto | bar | lines
    tensorboard_dir: Optional[str] = None  # None: no TensorBoard
    skip_steps: Optional[int] = None  # ModelZoo's --skip_steps: the Time meter restarts there (and FPS leaves them out)
    checkpoint_prefix: str = "checkpoint"  # the last epoch's checkpoint file: PREFIX.pth.tar
    checkpoint_freq: int = 0  # N > 0: also keep PREFIX_epochE.pth.tar every N epochs
    save_every: Optional[float] = None  # MINUTES: a mid-epoch checkpoint at least this often
    move_earlier_run: bool = False  # --output-dir not given: an earlier run in it is moved aside (record/folders.py)
    modelzoo: Optional[str] = None  # the ModelZoo entry this run stands in for (its log lines): resnet50 | shufflenetv2


SECTIONS = (("data", DataConfig), ("model", ModelConfig), ("optim", OptimConfig), ("precision", PrecisionConfig),
            ("launch", LaunchConfig), ("run", RunConfig))
# the flat names (checkpoints' and summaries' "config") of the fields whose section names them
# otherwise
RENAMED = {"data": ("data", "root"), "model": ("model", "name"), "launch": ("launch", "mode")}

# the flat names in the order checkpoints and summaries have always listed them
FLAT_ORDER = """
    data arch model model_impl workers epochs start_epoch batch_size lr momentum weight_decay print_freq resume
    evaluate pretrained seed dummy device device_index amp amp_impl amp_dtype opt_level loss_scale
    label_smoothing lr_schedule warmup_epochs train_crop_size crop_scale_min val_resize_size val_crop_size
    channels_last data_backend num_classes output_dir eval_freq validate max_steps_per_epoch fps_warmup_steps
    zero_init_residual recipe profile_steps profile_stop progress tensorboard_dir launch world_size rank nodes
    node_rank procs_per_node dist_url dist_backend multiprocessing_distributed device_list addr port local_rank
    sync_bn broadcast_buffers dist_timeout combine_ddp optimizer pretrained_published decode_ahead batched_crops
    compile compile_mode lr_step_unit warmup_offset skip_steps checkpoint_prefix checkpoint_freq move_earlier_run
    modelzoo float32_math cpu_binding jit_compile internal_format pin_memory preset lr_peak_epoch norm_weight_decay
    model_ema model_ema_steps model_ema_decay min_res max_res start_ramp end_ramp val_tta blurpool sizes_given
""".split() + ["save_every"] + list(align.FIELDS)


def _flat_names():
    where = dict(RENAMED)
    for section, cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if (section, f.name) not in RENAMED.values():
                where[f.name] = (section, f.name)
    assert sorted(where) == sorted(FLAT_ORDER), "every field has one flat name"
    return dict((name, where[name]) for name in FLAT_ORDER)


FLAT = _flat_names()  # flat name -> (section, field)


@dataclasses.dataclass(frozen=True)
class Config:
    """The run's configuration: one frozen section per subsystem (each factory takes its own). What parsing learnt
    besides (the notes on how the command line was adapted) travels apart, in ``Parsed``."""
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    precision: PrecisionConfig = PrecisionConfig()
    launch: LaunchConfig = LaunchConfig()
    run: RunConfig = RunConfig()

    def as_dict(self):
        """Every field under its flat name (the command line's dests: ``data`` is the data set's folder, ``model``
        the network built, ``launch`` the launch mode); a plan.Plan's ``as_dict`` is the same, as decided."""
        return {name: getattr(getattr(self, section), field) for name, (section, field) in FLAT.items()}


class Parsed(NamedTuple):
    """What ``parse_config`` returns: the config (None for --list-models) and the notes on how the command line was
    adapted (a recipe scaled, a guide's flag mapped; ``run`` logs them)."""
    cfg: Optional[Config]
    notes: Tuple[str, ...] = ()


PRESETTABLE = ("opt_level", "loss_scale")  # the precision flags whose recipe / ModelZoo values PrecisionConfig marks


def parse_config(argv=None, env=None, prog=None):
    """Parse and validate into a ``Parsed``; raise UsageError (one line) on bad input. ``prog``: the name the
    program was started as (``8p_main_med.py`` stands in for ModelZoo's Shufflenetv2 entry: trainer/zoo.py)."""
    from trainer import recipes, zoo

    env = os.environ if env is None else env
    parser = build_parser()
    typed = flags.parse_typed(parser, argv)  # the one parse: the flags given
    values = flags.convert_defaults(parser, flags.own_defaults(parser), typed)  # argparse's defaults
    if typed.get("list_models"):
        return Parsed(None)
    notes, layered = (), set()
    ns = argparse.Namespace(**dict(values, **typed))
    if ns.recipe is not None:  # the recipe's values, scaled to the processes
        from trainer.job import launch as placement
        more, notes = recipes.flag_defaults(ns.recipe, placement.process_count(ns, env), typed, ns)
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
    cfg, more = validate(ns, env, frozenset(typed), entry, preset)
    return Parsed(cfg, tuple(notes) + more)


def _modelzoo_flags(ns, explicit, env):
    """ModelZoo's flags folded into ours (trainer/zoo.py): (warm-up epochs, step unit, offset, schedule), FPS
    warm-up steps, output folder, device list."""
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
    """ModelZoo's ALLOW_HF32 / ALLOW_FP32 (exported by its scripts' --hf32 / --fp32): float32 training, with the
    device's reduced-precision float32 path allowed (HF32) or not (FP32), as their main.py does.
    Returns (float32_math, amp, notes)."""
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
    """The training sizes: (train_crop_size, (min_res, max_res, start_ramp, end_ramp) or Nones, notes).
    --train-crop-size alone is the fixed size. The schedule's four flags go together; given on the command line
    beside --train-crop-size they contradict it; a recipe's schedule yields to a --train-crop-size given, unless
    it ends at that size (``--recipe fast``'s ramp scaled to it: trainer/recipes.py)."""
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
    """(resize, crop) of validation: --val-resize-size by default --val-crop-size x 256/224, rounded (FFCV's crop
    ratio; torchvision's 256 for 224)."""
    resize = ns.val_resize_size
    if resize is None:
        resize = int(round(ns.val_crop_size / FFCV_CROP_RATIO))
    if ns.val_crop_size > resize:
        raise UsageError("--val-crop-size {} is larger than --val-resize-size {}: crop must fit in the resized image"
                         .format(ns.val_crop_size, resize))
    return resize, ns.val_crop_size


def validate(ns, env, explicit=frozenset(), entry=None, preset=()):
    """(Config, notes) from parsed flags (``explicit``: the dests the command line gave; ``entry``: the ModelZoo
    entry the run stands in for; ``preset``: the PRESETTABLE dests that hold a recipe's or the entry's value)."""
    import models
    notes = ()
    (warmup_epochs, lr_step_unit, warmup_offset, lr_schedule), fps_warmup, output_dir, ns.device_list = \
        _modelzoo_flags(ns, explicit, env)
    if ns.pretrained not in (None, PUBLISHED) and os.path.isdir(ns.pretrained) and not ns.data:
        # pytorch/examples' `main.py --pretrained DIR`: there --pretrained takes no value, so the folder is DIR
        ns.data, ns.pretrained = ns.pretrained, PUBLISHED
    device_list, order_note = _normalise_device_list(ns.device_list)
    if order_note:
        notes = notes + (order_note,)
    if ns.data and ns.data_opt and os.path.abspath(ns.data) != os.path.abspath(ns.data_opt):
        raise UsageError("DIR '{}' and --data '{}' disagree: give the data set once".format(ns.data, ns.data_opt))
    data = ns.data or ns.data_opt
    if not ns.dummy and not data:
        raise UsageError("no data set given: pass DIR (an ImageNet-style folder) or --dummy for synthetic data")
    device = without_accelerator(canonical_kind(ns.device)) if ns.no_accel else canonical_kind(ns.device)
    if device is None:  # --no-accel (pytorch/examples' flag: the CPU, whatever accelerator is present)
        raise UsageError("--device {} and --no-accel contradict each other: --no-accel runs on the CPU; drop one"
                         .format(ns.device))
    if ns.opt_level is not None and ns.opt_level not in OPT_LEVELS:
        raise UsageError("--opt-level must be O1 or O2, got '{}'".format(ns.opt_level))
    val_resize_size, val_crop_size = _val_sizes(ns)
    train_crop_size, (min_res, max_res, start_ramp, end_ramp), more = _resolution(ns, explicit)
    notes = notes + more
    if not 0 < ns.crop_scale_min <= 1:
        raise UsageError("--crop-scale-min must be in (0, 1], got {}".format(ns.crop_scale_min))
    if ns.label_smoothing >= 1.0:
        raise UsageError("--label-smoothing must be below 1, got {}".format(ns.label_smoothing))
    if warmup_epochs > ns.epochs and lr_step_unit != "epoch":  # ModelZoo's per-epoch warm-up may outlast a short run
        raise UsageError("--warmup-epochs {:g} exceeds --epochs {}".format(warmup_epochs, ns.epochs))
    _check_short_schedule(ns, explicit, lr_schedule, warmup_epochs)
    if ns.start_epoch >= ns.epochs and not ns.evaluate:
        raise UsageError("--start-epoch {} leaves nothing to train with --epochs {}".format(ns.start_epoch, ns.epochs))
    if ns.amp_impl == "apex" and not ns.amp:
        raise UsageError("--amp-impl apex needs --amp")
    if ns.combine_ddp and not ns.amp:
        raise UsageError("--combine-ddp is an option of apex.amp: it needs --amp (with Ascend apex)")
    model = models.resolve(ns.arch, ns.model_impl)
    if ns.model_impl == "torchvision" and ns.arch in models.VARIANTS.values():
        base = [k for k, v in models.VARIANTS.items() if v == ns.arch][0]
        raise UsageError("--model-impl torchvision with -a {}: that is this project's variant; use -a {} for "
                         "torchvision's network".format(ns.arch, base))
    if ns.blurpool and model not in models.blurpool_archs():
        raise UsageError("--blurpool applies to torchvision's ResNets ({}), not to -a {}: drop --blurpool".format(
            ", ".join(models.blurpool_archs()), ns.arch))
    if model != ns.arch:
        notes = notes + ("-a {} builds {}: the same network and weights with the channel shuffle as one copy "
                         "(faster on NPU and CUDA); --model-impl torchvision for torchvision's own".format(
                             ns.arch, model),)
    if ns.amp_dtype != "auto" and not ns.amp:
        raise UsageError("--amp-dtype {} needs --amp".format(ns.amp_dtype))
    if ns.evaluate and not ns.validate:
        raise UsageError("--evaluate with --no-validate has nothing to do")
    if not ns.tensorboard and ns.tensorboard_dir is not None:
        raise UsageError("--tensorboard-dir and --no-tensorboard contradict each other: give one")
    if ns.compile_mode != "default" and not ns.compile:
        raise UsageError("--compile-mode {} needs --compile".format(ns.compile_mode))
    if ns.profile_stop and ns.profile_steps is None:
        raise UsageError("--profile-stop needs --profile-steps START:END")
    if ns.recipe is not None:
        from trainer import recipes
        recipes.get(ns.recipe)  # raises UsageError for unknown names
    from trainer.job import launch as placement
    dist = placement.resolve_launch(ns, env)
    notes = notes + dist["notes"]
    float32_math, amp, more = _float32_env(env, ns.amp)
    notes = notes + more
    return Config(
        data=DataConfig(root=data, dummy=ns.dummy, workers=ns.workers, train_crop_size=train_crop_size,
                        crop_scale_min=ns.crop_scale_min, val_resize_size=val_resize_size,
                        val_crop_size=val_crop_size, data_backend=ns.data_backend, min_res=min_res, max_res=max_res,
                        start_ramp=start_ramp, end_ramp=end_ramp, val_tta=ns.val_tta,
                        sizes_given=bool(set(SIZES) & set(explicit))),
        model=ModelConfig(arch=ns.arch, name=model, model_impl=ns.model_impl,
                          pretrained=None if ns.pretrained == PUBLISHED else ns.pretrained,
                          pretrained_published=ns.pretrained == PUBLISHED, num_classes=ns.num_classes,
                          zero_init_residual=ns.zero_init_residual, channels_last=ns.channels_last, sync_bn=ns.sync_bn,
                          compile=ns.compile, compile_mode=ns.compile_mode, blurpool=ns.blurpool),
        optim=OptimConfig(optimizer=ns.optimizer, lr=ns.lr, momentum=ns.momentum, weight_decay=ns.weight_decay,
                          lr_schedule=lr_schedule, warmup_epochs=warmup_epochs,
                          label_smoothing=ns.label_smoothing, lr_step_unit=lr_step_unit, warmup_offset=warmup_offset,
                          lr_peak_epoch=ns.lr_peak_epoch, norm_weight_decay=ns.norm_weight_decay,
                          model_ema=ns.model_ema, model_ema_steps=ns.model_ema_steps,
                          model_ema_decay=ns.model_ema_decay),
        precision=PrecisionConfig(amp=amp, float32_math=float32_math, amp_impl=ns.amp_impl, amp_dtype=ns.amp_dtype,
                                  opt_level=ns.opt_level, loss_scale=ns.loss_scale, combine_ddp=ns.combine_ddp,
                                  preset=tuple(preset)),
        launch=LaunchConfig(device=device, device_index=ns.gpu, mode=dist["launch"],
                            world_size=dist["world_size"], rank=dist["rank"], nodes=dist["nodes"],
                            node_rank=dist["node_rank"], procs_per_node=dist["procs_per_node"],
                            dist_url=dist["dist_url"], dist_backend=ns.dist_backend,
                            multiprocessing_distributed=ns.multiprocessing_distributed,
                            device_list=dist["device_list"] if dist["device_list"] is not None else device_list,
                            addr=dist["addr"], port=dist["port"], local_rank=dist["local_rank"],
                            broadcast_buffers=ns.broadcast_buffers, dist_timeout=float(ns.dist_timeout),
                            cpu_binding=ns.cpu_binding, jit_compile=ns.jit_compile,
                            internal_format=ns.internal_format, pin_memory=ns.pin_memory),
        run=RunConfig(epochs=ns.epochs, start_epoch=ns.start_epoch, batch_size=ns.batch_size,
                      print_freq=ns.print_freq, resume=dist["resume"], evaluate=ns.evaluate, seed=ns.seed,
                      output_dir=output_dir, eval_freq=ns.eval_freq, validate=ns.validate,
                      max_steps_per_epoch=ns.max_steps_per_epoch, fps_warmup_steps=fps_warmup,
                      recipe=ns.recipe, profile_steps=ns.profile_steps, profile_stop=ns.profile_stop,
                      progress=ns.progress, tensorboard_dir=(ns.tensorboard_dir or os.path.join(
                          output_dir, "tensorboard")) if ns.tensorboard else None,
                      skip_steps=ns.skip_steps, checkpoint_prefix=ns.checkpoint_prefix, save_every=ns.save_every,
                      checkpoint_freq=ns.checkpoint_freq, modelzoo=entry, **align.run_fields(ns, explicit),
                      move_earlier_run=not ({"output_dir", "workspace"} & set(explicit)) and dist["resume"] is None),
    ), notes
