"""Command line -> validated, frozen ``Config``.

Everything the run needs flows down as one immutable ``Config``; nothing mutates the
argparse namespace after ``parse_config`` returns. pytorch/examples' flags keep their
names and meanings; the additions are documented in ``--help`` and README.md.
A recipe (``--recipe NAME``) supplies defaults; flags given on the command line win.
"""
import argparse
import dataclasses
import os
import re
from typing import Optional, Tuple

from trainer.device_names import DATA_BACKENDS, KIND_ALIASES, KINDS, canonical_kind
from trainer.cli import HelpFormatter, UsageParser, number, parse_loss_scale  # noqa: F401 (re-exported)
from trainer.errors import UsageError
from trainer.optim import DEFAULT_OPTIMIZER, OPTIMIZERS

DEVICES = ("auto",) + KINDS + tuple(KIND_ALIASES)
OPT_LEVELS = ("O1", "O2")


class _Section:
    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """What ``trainer.data.build`` reads."""
    root: Optional[str] = None  # DIR (None with --dummy)
    dummy: bool = False
    workers: Optional[int] = None  # per node; None: from the device kind and the cores (run.build)
    train_crop_size: int = 224
    crop_scale_min: float = 0.08
    val_resize_size: int = 256
    val_crop_size: int = 224
    data_backend: str = "auto"  # auto | cpu | gpu
    # the device backend's ways of working (data.LoaderSpec); None: the device's choice. No flags: set by tools
    decode_ahead: Optional[bool] = None
    batched_crops: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """What ``run.build_model`` reads."""
    arch: str = "resnet18"  # as given (checkpoints and summaries name it)
    name: str = "resnet18"  # the network built: --arch, or this project's variant of it (models.resolve)
    model_impl: str = "auto"
    pretrained: Optional[str] = None  # a weights file
    pretrained_published: bool = False  # --pretrained alone: torchvision's published weights (``pretrained``: the file)
    num_classes: Optional[int] = None  # None: the data's class count
    zero_init_residual: bool = False
    channels_last: Optional[bool] = None  # None: the device's default (settled in run.preflight)
    sync_bn: bool = False


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


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(_Section):
    """What trainer.amp reads (--amp and its options)."""
    amp: bool = False
    amp_impl: str = "auto"  # auto | native | apex (auto is settled once the device is known: trainer/amp.py settle)
    amp_dtype: str = "auto"
    opt_level: str = "O2"
    loss_scale: Optional[float] = None  # None = dynamic
    combine_ddp: bool = False


@dataclasses.dataclass(frozen=True)
class LaunchConfig(_Section):
    """Where this process sits in the job and how it meets the others (trainer/launch.py)."""
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


@dataclasses.dataclass(frozen=True)
class RunConfig(_Section):
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


SECTIONS = (("data", DataConfig), ("model", ModelConfig), ("optim", OptimConfig), ("precision", PrecisionConfig),
            ("launch", LaunchConfig), ("run", RunConfig))
# the flat names (checkpoints' and summaries' "config", Config.replace) of the fields whose section names them
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
""".split()


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
    """The run's configuration: one frozen section per subsystem (each factory takes its own), the flags given on
    the command line, and the notes on how the command line was adapted (logged at the start of the run)."""
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    precision: PrecisionConfig = PrecisionConfig()
    launch: LaunchConfig = LaunchConfig()
    run: RunConfig = RunConfig()
    explicit: Tuple[str, ...] = ()  # the flags given on the command line (their argparse dests)
    notes: Tuple[str, ...] = ()

    def replace(self, **changes):
        """A copy with fields changed: sections whole (``launch=LaunchConfig(...)``), or fields by their flat
        names (``world_size=8``; ``data=DIR``, ``model=NAME``, ``launch=MODE``: see ``as_dict``)."""
        top, per_section = {}, {}
        for name, value in changes.items():
            if name in ("explicit", "notes") or isinstance(value, _Section):
                top[name] = value
            elif name in FLAT:
                section, field = FLAT[name]
                per_section.setdefault(section, {})[field] = value
            else:
                raise TypeError("Config has no field '{}'".format(name))
        for section, fields in per_section.items():
            top[section] = top.get(section, getattr(self, section)).replace(**fields)
        return dataclasses.replace(self, **top)

    def as_dict(self):
        """Every field under its flat name (the command line's dests: ``data`` is the data set's folder, ``model``
        the network built, ``launch`` the launch mode): what checkpoints and summaries record as "config"."""
        out = {}
        for name, (section, field) in FLAT.items():
            out[name] = getattr(getattr(self, section), field)
        out["explicit"], out["notes"] = self.explicit, self.notes
        return out


def parse_device_list(text):
    """``0-7``, ``0,1,2,3``, ``0-3,6`` -> (0, 1, ...); duplicates and bad ranges rejected."""
    ids = []
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise argparse.ArgumentTypeError(
                "--device-list: '{}' is not a device id or range (use e.g. 0-7, 0,1,2,3 or 0-3,6)".format(part))
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise argparse.ArgumentTypeError(
                "--device-list: range '{}' runs backwards (write {}-{})".format(part, hi, lo))
        ids.extend(range(lo, hi + 1))
    twice = [i for n, i in enumerate(ids) if i in ids[:n]]
    if twice:
        raise argparse.ArgumentTypeError("--device-list '{}' names device {} twice".format(text, twice[0]))
    return tuple(ids)


def parse_profile_steps(text):
    m = re.fullmatch(r"(\d+):(\d+)", str(text).strip())
    if not m or int(m.group(2)) <= int(m.group(1)):
        raise argparse.ArgumentTypeError(
            "--profile-steps must be START:END with END > START (global step numbers), got '{}'".format(text))
    return (int(m.group(1)), int(m.group(2)))


def build_parser():
    p = UsageParser(
        prog="main.py",
        description="ImageNet-style training and evaluation on Ascend NPU, CUDA or CPU "
                    "(a port of pytorch/examples' imagenet/main.py).",
        formatter_class=HelpFormatter,
        epilog="Exit codes: 0 the model trained (summary.json status ok); 1 a crash (failed); 2 a user error "
               "(one line on stderr); 4 the run diverged (status diverged: a non-finite training loss, more than "
               "50 consecutive float16 steps skipped for inf/NaN gradients, or non-finite weights; the last good "
               "checkpoints are kept; see docs/PRECISION.md); 130 interrupted.",
    )
    from trainer import recipes  # local import: recipes reads a data file

    g = p.add_argument_group("pytorch/examples flags")
    g.add_argument("data", nargs="?", default=None, metavar="DIR",
                   help="data set: an ImageNet-style folder with train/ and val/ (or tiny-imagenet-200)")
    g.add_argument("--data", dest="data_opt", default=None, metavar="DIR", help="same as DIR")
    g.add_argument("-a", "--arch", default="resnet50", metavar="ARCH",
                   help="model architecture (see --list-models); shufflenet_v2_x* builds this project's "
                        "numerically identical, faster shufflenet_v2_x*_npu unless --model-impl torchvision")
    g.add_argument("-j", "--workers", type=number(int, 0), default=None,
                   help="data loading workers per node, shared among its processes (each gets "
                        "ceil(j / processes per node)); default: from each process's share of the CPU cores, "
                        "up to 16 per process on an accelerator, 4 on a CPU")
    g.add_argument("--epochs", type=number(int, 1), default=90, help="total epochs to run")
    g.add_argument("--start-epoch", type=number(int, 0), default=0,
                   help="manual epoch number to start from (useful on restarts; --resume overrides it)")
    g.add_argument("-b", "--batch-size", type=number(int, 1), default=256,
                   help="GLOBAL batch size: divided evenly over all processes")
    g.add_argument("--lr", "--learning-rate", dest="lr", type=number(float, 0.0), default=0.1,
                   help="peak learning rate, used as given (pass it already scaled for the global batch)")
    g.add_argument("--momentum", type=number(float, 0.0), default=0.9)
    g.add_argument("--wd", "--weight-decay", dest="weight_decay", type=number(float, 0.0), default=1e-4)
    g.add_argument("-p", "--print-freq", type=number(int, 1), default=10,
                   help="print every N steps")
    g.add_argument("--resume", default=None, metavar="PATH",
                   help="checkpoint to continue from, or 'auto' for the newest one in --output-dir")
    g.add_argument("-e", "--evaluate", action="store_true", help="evaluate the model on val/ and stop")
    g.add_argument("--pretrained", nargs="?", const=PUBLISHED, default=None, metavar="FILE",
                   help="initial weights: alone, torchvision's published ImageNet weights for -a (from torchvision's "
                        "cache under TORCH_HOME, downloaded there when missing; a different --num-classes keeps the "
                        "backbone and starts a new classifier); with FILE, a local state dict or checkpoint file")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible runs")
    g.add_argument("--gpu", type=number(int, 0), default=None,
                   help="device index for a single-process run (any device kind)")
    g.add_argument("--dummy", action="store_true",
                   help="synthetic batches made on the device (no decoding): for FPS runs")

    d = p.add_argument_group("device and precision")
    d.add_argument("--device", choices=DEVICES, default="auto",
                   help="auto: npu if torch_npu sees one, else cuda, else cpu; gpu is cuda")
    d.add_argument("--model-impl", choices=("auto", "torchvision"), default="auto",
                   help="auto: this project's variant of --arch where one exists (shufflenet_v2_x*_npu: "
                        "same weights and outputs, faster); torchvision: torchvision's own network")
    d.add_argument("--amp", action="store_true",
                   help="mixed precision in --amp-dtype; float16 steps with inf/NaN gradients are skipped")
    d.add_argument("--amp-dtype", choices=("auto", "float16", "bfloat16"), default="auto",
                   help="auto: bfloat16 (no loss scaling) on GPUs with native bfloat16, float16 + loss scaler "
                        "on older GPUs and on NPU, bfloat16 on CPUs with native bfloat16 and float32 on other "
                        "CPUs (where bfloat16 is many times slower), with a note")
    d.add_argument("--amp-impl", choices=("auto", "native", "apex"), default="auto",
                   help="auto: Ascend apex.amp on NPU where it is installed (the Ascend guide's way), native "
                        "autocast + GradScaler otherwise; native; apex (NVIDIA or Ascend apex.amp)")
    d.add_argument("--opt-level", "--opt_level", dest="opt_level", default="O2",
                   help="apex opt level, O1 or O2 (apex only)")
    d.add_argument("--loss-scale", "--loss_scale", dest="loss_scale", type=parse_loss_scale,
                   default=None, metavar="N|dynamic|-1",
                   help="float16 loss scale: a number is held fixed (steps with inf/NaN gradients are still "
                        "skipped), dynamic (or -1, as in the Ascend guides) adapts it; default dynamic, except "
                        "apex on NPU: 1024 (the Ascend guide's default)")
    d.add_argument("--combine-ddp", action="store_true",
                   help="Ascend apex: all-reduce combined gradients inside apex (amp.initialize(combine_ddp="
                        "True)) instead of torch's DistributedDataParallel")
    d.add_argument("--channels-last", dest="channels_last", action="store_true", default=None,
                   help="NHWC memory format (default: on for CPU, where it is faster; off for NPU and CUDA)")
    d.add_argument("--no-channels-last", dest="channels_last", action="store_false", help="NCHW memory format")
    d.add_argument("--data-backend", choices=DATA_BACKENDS, default="auto",
                   help="where JPEGs are decoded and augmented: cpu (data-loader workers, PIL with draft-mode "
                        "decode), gpu (workers read bytes; whole batches are decoded and cropped on the device: "
                        "nvJPEG on CUDA, DVPP via torchvision_npu on NPU); auto: cpu, the faster of the two as "
                        "measured (docs/BENCHMARKS.md)")

    t = p.add_argument_group("recipe")
    t.add_argument("--recipe", default=None, metavar="NAME",
                   help="defaults from a published recipe, adapted to the process count (batch per device "
                        "kept, lr linear in the batch): " + ", ".join(recipes.names()))
    t.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default=DEFAULT_OPTIMIZER,
                   help="sgd: SGD with momentum (the device's fused kernel where it has one); lars: SGD momentum "
                        "with a layer-wise trust ratio, for large global batches")
    t.add_argument("--label-smoothing", type=number(float, 0.0), default=0.0)
    t.add_argument("--lr-schedule", choices=("step", "cosine"), default="step",
                   help="step: x0.1 every 30 epochs (pytorch/examples); cosine: to zero at the last step")
    t.add_argument("--warmup-epochs", type=number(float, 0.0), default=0.0,
                   help="linear LR warm-up, in epochs (fractions allowed)")
    t.add_argument("--train-crop-size", type=number(int, 1), default=224)
    t.add_argument("--crop-scale-min", type=number(float, 0.0), default=0.08,
                   help="smallest area fraction RandomResizedCrop takes (torchvision: 0.08)")
    t.add_argument("--val-resize-size", type=number(int, 1), default=256)
    t.add_argument("--val-crop-size", type=number(int, 1), default=224)
    t.add_argument("--num-classes", type=number(int, 1), default=None,
                   help="classifier outputs (default: the number of class folders; 1000 with --dummy)")
    t.add_argument("--zero-init-residual", action="store_true",
                   help="ResNet: zero the last BN gamma of each residual block")

    o = p.add_argument_group("run control and outputs")
    o.add_argument("--output-dir", default=".", metavar="DIR",
                   help="checkpoints and summary.json go here")
    o.add_argument("--eval-freq", type=number(int, 1), default=1,
                   help="validate every N epochs (and always after the last)")
    o.add_argument("--no-validate", dest="validate", action="store_false",
                   help="skip validation (performance runs); no Acc@1, no model_best")
    o.add_argument("--max-steps-per-epoch", type=number(int, 1), default=None,
                   help="cap the training steps per epoch (performance runs)")
    o.add_argument("--fps-warmup-steps", type=number(int, 0), default=5,
                   help="steps at the start of each epoch left out of the FPS figure")
    o.add_argument("--profile-steps", type=parse_profile_steps, default=None, metavar="START:END",
                   help="record global steps START..END-1 with the profiler into --output-dir")
    o.add_argument("--profile-stop", action="store_true",
                   help="stop the run after the profiled steps")
    o.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                   help="auto: a live bar per epoch (tqdm) when stdout is a terminal, pytorch/examples' lines "
                        "otherwise")
    o.add_argument("--tensorboard-dir", default=None, metavar="DIR",
                   help="TensorBoard event files (default: --output-dir/tensorboard)")
    o.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                   help="write no TensorBoard event files")
    o.add_argument("--list-models", action="store_true", help="print the model names and exit")

    m = p.add_argument_group("distributed")
    m.add_argument("--world-size", type=int, default=-1,
                   help="number of nodes (with --multiprocessing-distributed) or of processes")
    m.add_argument("--rank", type=int, default=-1,
                   help="node rank (with --multiprocessing-distributed) or process rank")
    m.add_argument("--dist-url", default=None, help="tcp://HOST:PORT or env:// (default: env:// from --addr/--port)")
    m.add_argument("--dist-backend", "--dist_backend", dest="dist_backend", default=None,
                   help="process-group backend (default: hccl on NPU, nccl on CUDA, gloo on CPU)")
    m.add_argument("--multiprocessing-distributed", action="store_true",
                   help="spawn one process per device of --device-list on this node")
    m.add_argument("--device-list", "--device_list", dest="device_list", type=parse_device_list,
                   default=None, metavar="IDS", help="devices to use: 0-7, 0,1,2,3 or 0-3,6 (default: all visible)")
    m.add_argument("--addr", default=None, help="master address (MASTER_ADDR)")
    m.add_argument("--port", type=int, default=None, help="master port (MASTER_PORT); 0 picks a free one")
    m.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=None,
                   help="set by torch.distributed.launch; torchrun sets LOCAL_RANK instead")
    m.add_argument("--sync-bn", action="store_true", help="synchronised BatchNorm across processes")
    m.add_argument("--no-broadcast-buffers", dest="broadcast_buffers", action="store_false",
                   help="DDP: do not broadcast BN buffers from rank 0 each step")
    m.add_argument("--dist-timeout", type=number(int, 1), default=1800,
                   help="seconds a collective may wait before the job fails")
    return p


_UNSET = object()


def _explicit_dests(argv):
    """Destinations the user set on the command line (so recipes never override them)."""
    probe = build_parser()
    probe.set_defaults(**{a.dest: _UNSET for a in probe._actions if a.dest != "help"})
    return {k for k, v in vars(probe.parse_args(argv)).items() if v is not _UNSET}


def _normalise_device_list(ids):
    """The Ascend guide maps process i to the i-th smallest device id (its device_id_to_process_device_map
    sorts the list): the same order here, on every device kind. Returns (ids, note or None)."""
    if ids is None or list(ids) == sorted(ids):
        return ids, None
    ordered = tuple(sorted(ids))
    return ordered, "--device-list {} taken in ascending order {}: process i uses the i-th smallest id".format(
        ",".join(map(str, ids)), ",".join(map(str, ordered)))


def parse_config(argv=None, env=None):
    """Parse and validate; raise UsageError (one line) on bad input."""
    from trainer import recipes

    env = os.environ if env is None else env
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.list_models:
        return None, ns
    notes = ()
    explicit = _explicit_dests(argv)
    if ns.recipe is not None:
        from trainer import launch as placement
        given = {k: getattr(ns, k) for k in recipes.SCALED if k in explicit}
        values, notes = recipes.flag_defaults(ns.recipe, placement.process_count(ns, env), given)
        parser.set_defaults(**{k: v for k, v in values.items() if k not in explicit})
        ns = parser.parse_args(argv)
    return validate(ns, env, tuple(notes), explicit), ns


PUBLISHED = "\0published"  # --pretrained given without FILE (argparse's const; no path can hold a NUL)


def validate(ns, env, notes=(), explicit=()):
    import models
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
    if ns.opt_level not in OPT_LEVELS:
        raise UsageError("--opt-level must be O1 or O2, got '{}'".format(ns.opt_level))
    if ns.val_crop_size > ns.val_resize_size:
        raise UsageError("--val-crop-size {} is larger than --val-resize-size {}: crop must fit in the resized image"
                         .format(ns.val_crop_size, ns.val_resize_size))
    if not 0 < ns.crop_scale_min <= 1:
        raise UsageError("--crop-scale-min must be in (0, 1], got {}".format(ns.crop_scale_min))
    if ns.label_smoothing >= 1.0:
        raise UsageError("--label-smoothing must be below 1, got {}".format(ns.label_smoothing))
    if ns.warmup_epochs > ns.epochs:
        raise UsageError("--warmup-epochs {} exceeds --epochs {}".format(ns.warmup_epochs, ns.epochs))
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
    if ns.profile_stop and ns.profile_steps is None:
        raise UsageError("--profile-stop needs --profile-steps START:END")
    if ns.recipe is not None:
        from trainer import recipes
        recipes.get(ns.recipe)  # raises UsageError for unknown names
    from trainer import launch as placement
    dist = placement.resolve_launch(ns, env)
    notes = notes + dist["notes"]
    return Config(
        data=DataConfig(root=data, dummy=ns.dummy, workers=ns.workers, train_crop_size=ns.train_crop_size,
                        crop_scale_min=ns.crop_scale_min, val_resize_size=ns.val_resize_size,
                        val_crop_size=ns.val_crop_size, data_backend=ns.data_backend),
        model=ModelConfig(arch=ns.arch, name=model, model_impl=ns.model_impl,
                          pretrained=None if ns.pretrained == PUBLISHED else ns.pretrained,
                          pretrained_published=ns.pretrained == PUBLISHED, num_classes=ns.num_classes,
                          zero_init_residual=ns.zero_init_residual, channels_last=ns.channels_last, sync_bn=ns.sync_bn),
        optim=OptimConfig(optimizer=ns.optimizer, lr=ns.lr, momentum=ns.momentum, weight_decay=ns.weight_decay,
                          lr_schedule=ns.lr_schedule, warmup_epochs=ns.warmup_epochs,
                          label_smoothing=ns.label_smoothing),
        precision=PrecisionConfig(amp=ns.amp, amp_impl=ns.amp_impl, amp_dtype=ns.amp_dtype, opt_level=ns.opt_level,
                                  loss_scale=ns.loss_scale, combine_ddp=ns.combine_ddp),
        launch=LaunchConfig(device=canonical_kind(ns.device), device_index=ns.gpu, mode=dist["launch"],
                            world_size=dist["world_size"], rank=dist["rank"], nodes=dist["nodes"],
                            node_rank=dist["node_rank"], procs_per_node=dist["procs_per_node"],
                            dist_url=dist["dist_url"], dist_backend=ns.dist_backend,
                            multiprocessing_distributed=ns.multiprocessing_distributed, device_list=device_list,
                            addr=dist["addr"], port=dist["port"], local_rank=dist["local_rank"],
                            broadcast_buffers=ns.broadcast_buffers, dist_timeout=float(ns.dist_timeout)),
        run=RunConfig(epochs=ns.epochs, start_epoch=ns.start_epoch, batch_size=ns.batch_size,
                      print_freq=ns.print_freq, resume=ns.resume, evaluate=ns.evaluate, seed=ns.seed,
                      output_dir=ns.output_dir, eval_freq=ns.eval_freq, validate=ns.validate,
                      max_steps_per_epoch=ns.max_steps_per_epoch, fps_warmup_steps=ns.fps_warmup_steps,
                      recipe=ns.recipe, profile_steps=ns.profile_steps, profile_stop=ns.profile_stop,
                      progress=ns.progress, tensorboard_dir=(ns.tensorboard_dir or os.path.join(
                          ns.output_dir, "tensorboard")) if ns.tensorboard else None),
        explicit=tuple(sorted(explicit)), notes=notes,
    )
