"""Every setting of a run declared once: the config's sections are frozen dataclasses whose fields carry their flags
(``options.setting``). ``build_parser`` makes main.py's parser from them, trainer/config.py the sections, and ``FLAT``
holds the flat names checkpoints and summaries use. A field without a flag is decided from others; ``CommandLine``
declares the flags that fill no field of their own. Adding a flag: one ``setting`` in its section, then its use.
``parse_typed`` is the one parse of a command line: the flags it gave."""
import argparse
import dataclasses
from typing import Optional, Tuple, Union

from trainer.data import spec
from trainer.device_names import DATA_BACKENDS, KIND_ALIASES, KINDS
from trainer.options import (make_parser, number, parse_device_list, parse_dump_steps, parse_loss_scale,
                             parse_profile_steps, setting)
from trainer.optim import DEFAULT_OPTIMIZER, OPTIMIZERS
from trainer.optim.schedule import KINDS as LR_SCHEDULES
from trainer.precision import APEX_OPT_LEVEL

DEVICES = ("auto",) + KINDS + tuple(KIND_ALIASES)
OPT_LEVELS = ("O1", "O2")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's modes
MODELZOO_ENTRIES = ("auto", "off", "resnet50", "shufflenetv2")  # --modelzoo
PUBLISHED = "\0published"  # --pretrained given without FILE (argparse's const; no path can hold a NUL)
DUMP_LEVELS = ("L0", "L1", "mix")  # msprobe's levels that --dump-level offers
DUMP_TASKS = ("statistics", "tensor")
AUTO_ON_OFF = ("auto", "on", "off")

GROUPS = (  # (key, title, description): --help's groups, in order
    ("examples", "pytorch/examples flags", None),
    ("device", "device and precision", None),
    ("recipe", "recipe", None),
    ("resolution", "training resolution, test-time augmentation, BlurPool",
     "FFCV's ResNet recipes: low-resolution training rising to a higher size, validation above it with flips"),
    ("run", "run control and outputs", None),
    ("align", "precision alignment (msprobe)",
     "dumps for layer-by-layer comparison with Ascend's msprobe (pip install mindstudio-probe) and runs that repeat "
     "on another machine; python3 -m tools.align compares them (docs/TOOLS.md)"),
    ("modelzoo", "Ascend ModelZoo flags",
     "the flags of ModelZoo's ResNet50_ID4149 main.py and Shufflenetv2 8p_main_med.py, with their meaning"),
    ("distributed", "distributed", None),
)


def _recipes_help():
    from trainer import recipes  # local import: recipes reads a data file
    return ("defaults from a published recipe, adapted to the process count (batch per device kept, lr linear in the "
            "batch; a note names the rule where the batch is outside the source's published ones): " +
            ", ".join(recipes.names()))


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """The flags that fill no field of their own: config.py and the launch read them."""
    data_opt: Optional[str] = setting("--data", group="examples", metavar="DIR", help="same as DIR")
    no_accel: bool = setting("--no-accel", group="examples", default=False, action="store_true",
                             help="use the CPU even where an accelerator is present (--device cpu; with --device npu, "
                                  "cuda or gpu an error)")
    tensorboard: bool = setting("--no-tensorboard", group="run", default=True, action="store_false",
                                help="write no TensorBoard event files")
    list_models: bool = setting("--list-models", group="run", default=False, action="store_true",
                                help="print the model names and exit")
    modelzoo: str = setting(
        "--modelzoo", group="modelzoo", default="auto", choices=MODELZOO_ENTRIES,
        help="which ModelZoo entry this run stands in for: its parser's defaults (resnet50: label smoothing 0.1, 8 "
             "warm-up epochs, cosine per epoch, loss scale 1024; shufflenetv2: cosine per epoch, --eval-freq 5, loss "
             "scale 64) and its log lines; flags given win. auto: under a ModelZoo script (RANK_SIZE set) without "
             "--recipe, shufflenetv2 when started as 8p_main_med.py, else resnet50; off everywhere else "
             "(pytorch/examples' defaults)")
    mz_warmup: Optional[int] = setting(
        "--warmup", group="modelzoo", type=number(int, 0), metavar="E",
        help="ResNet50_ID4149: E warm-up epochs, lr x (epoch+1)/E in epoch `epoch`, then cosine per epoch")
    mz_warm_up_epochs: Optional[int] = setting(
        "--warm_up_epochs", group="modelzoo", type=number(int, 0), metavar="N",
        help="Shufflenetv2: N warm-up epochs, lr x (epoch+1)/(N+1), then cosine per epoch")
    mz_benchmark: int = setting("-bm", "--benchmark", group="modelzoo", default=0, type=int, choices=(0, 1),
                                help="Shufflenetv2's switch: 0 trains normally; 1 (gradient accumulation to 2048 "
                                     "images) is refused: give the batch with -b")
    device_num: Optional[int] = setting(
        "--device_num", group="modelzoo", type=number(int, 1), metavar="N",
        help="devices per node (Shufflenetv2); checked against --device-list and RANK_SIZE")
    workspace: Optional[str] = setting("--workspace", group="modelzoo", metavar="DIR",
                                       help="Shufflenetv2: where checkpoints are stored (the same as --output-dir)")
    world_size: int = setting("--world-size", group="distributed", default=-1, type=int,
                              help="number of nodes (with --multiprocessing-distributed) or of processes")
    rank: int = setting("--rank", group="distributed", default=-1, type=int,
                        help="node rank (with --multiprocessing-distributed) or process rank")
    dist_url: Optional[str] = setting("--dist-url", group="distributed",
                                      help="tcp://HOST:PORT or env:// (default: env:// from --addr/--port)")
    addr: Optional[str] = setting("--addr", group="distributed", help="master address (MASTER_ADDR)")


class _Section:
    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class RunConfig(_Section):
    """The run itself: its length and batch, what it resumes, where it writes, what it shows."""
    epochs: int = setting("--epochs", group="examples", default=90, type=number(int, 1), help="total epochs to run")
    start_epoch: int = setting("--start-epoch", group="examples", default=0, type=number(int, 0),
                               help="manual epoch number to start from (useful on restarts; --resume overrides it)")
    batch_size: int = setting("-b", "--batch-size", group="examples", default=256, type=number(int, 1),
                              help="GLOBAL batch size: divided evenly over all processes")
    print_freq: int = setting("-p", "--print-freq", group="examples", default=10, type=number(int, 1),
                              help="print every N steps")
    resume: Optional[str] = setting(
        "--resume", group="examples", metavar="PATH",
        help="checkpoint to continue from, or 'auto' for the newest one in --output-dir")
    evaluate: bool = setting("-e", "--evaluate", group="examples", default=False, action="store_true",
                             help="evaluate the model on val/ and stop")
    seed: Optional[int] = setting("--seed", group="examples", type=int, help="seed for reproducible runs")
    output_dir: str = setting(
        "--output-dir", group="run", default=".", metavar="DIR",
        help="checkpoints and summary.json go here; when not given and the current folder holds an earlier run "
             "(ModelZoo's performance then full script), that run is moved to previous_runs/STAMP/ first, with a note")
    eval_freq: int = setting("--eval-freq", "-ef", group="run", default=1, type=number(int, 1),
                             help="validate every N epochs (and always after the last)")
    validate: bool = setting("--no-validate", group="run", default=True, action="store_false",
                             help="skip validation (performance runs); no Acc@1, no model_best")
    max_steps_per_epoch: Optional[int] = setting("--max-steps-per-epoch", group="run", type=number(int, 1),
                                                 help="cap the training steps per epoch (performance runs)")
    fps_warmup_steps: int = setting("--fps-warmup-steps", group="run", default=5, type=number(int, 0),
                                    help="steps at the start of each epoch left out of the FPS figure")
    recipe: Optional[str] = setting("--recipe", group="recipe", metavar="NAME", help=_recipes_help)
    profile_steps: Optional[Tuple[int, int]] = setting(
        "--profile-steps", group="run", type=parse_profile_steps, metavar="START:END",
        help="record global steps START..END-1 with the profiler into --output-dir")
    profile_stop: bool = setting("--profile-stop", group="run", default=False, action="store_true",
                                 help="stop the run after the profiled steps")
    progress: str = setting("--progress", group="run", default="auto", choices=("auto", "bar", "lines"),
                            help="auto: a live bar per epoch (tqdm) when stdout is a terminal, pytorch/examples' "
                                 "lines otherwise")
    tensorboard_dir: Optional[str] = setting(  # None: no TensorBoard
        "--tensorboard-dir", group="run", metavar="DIR",
        help="TensorBoard event files (default: --output-dir/tensorboard)")
    skip_steps: Optional[int] = setting(  # the Time meter restarts there (and FPS leaves them out)
        "--skip_steps", group="modelzoo", type=number(int, 0), metavar="N",
        help="the first N steps of each epoch are left out of the step time and FPS (the Time average of the progress "
             "lines restarts at step N, as ModelZoo's performance scripts read it)")
    checkpoint_prefix: str = setting(
        "--checkpoint-nameprefix", group="modelzoo", default="checkpoint", metavar="NAME",
        help="the last epoch's checkpoint is NAME.pth.tar (model_best.pth.tar keeps its name)")
    checkpoint_freq: int = setting(
        "--checkpoint-freq", group="modelzoo", default=0, type=number(int, 0), metavar="N",
        help="0: one checkpoint file, rewritten each epoch; N: also keep NAME_epochE.pth.tar every N epochs")
    save_every: Optional[float] = setting(
        "--save-every", group="run", type=number(float, 0, exclusive=True), metavar="MINUTES",
        help="also save a mid-epoch checkpoint every MINUTES of training (in the last epoch's file, written "
             "atomically), so that a run killed outright loses at most that much")
    move_earlier_run: bool = False  # --output-dir not given: an earlier run in it is moved aside (record/folders.py)
    modelzoo: Optional[str] = None  # the ModelZoo entry this run stands in for (its log lines): resnet50 | shufflenetv2
    # precision alignment (trainer/align.py)
    precision_dump: Optional[str] = setting(
        "--precision-dump", group="align", metavar="DIR",
        help="dump the --dump-steps training steps through msprobe's PrecisionDebugger into DIR/step<k>/rank<r>/ "
             "(started before the forward pass, stopped after the optimizer step)")
    dump_steps: Tuple[int, ...] = setting(
        "--dump-steps", group="align", default=(0,), type=parse_dump_steps, metavar="STEPS",
        help="--precision-dump: global training steps (from 0) to dump: 0,3 or 0-2")
    dump_level: str = setting("--dump-level", group="align", default="L0", choices=DUMP_LEVELS,
                              help="--precision-dump: msprobe's level: L0 modules, L1 torch APIs, mix both")
    dump_task: str = setting(
        "--dump-task", group="align", default="statistics", choices=DUMP_TASKS,
        help="--precision-dump: msprobe's task: statistics (max, min, mean, norm of each tensor) or tensor (every "
             "tensor as .npy as well)")
    dump_config: Optional[str] = setting(
        "--dump-config", group="align", metavar="FILE.json",
        help="--precision-dump: msprobe's own config.json (task, level, step, scope, list, ...) in place of "
             "--dump-steps, --dump-level and --dump-task")
    deterministic: bool = setting(
        "--deterministic", group="align", default=False, action="store_true",
        help="for alignment runs (needs --seed): msprobe's seed_all with dropout removed where msprobe is installed, "
             "Dropout at p=0, the device's deterministic algorithms; summary.json records the fingerprints of the "
             "initial weights and of the first batches")


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    """What the optimizer (trainer.optim), its schedule and the loss read."""
    optimizer: str = setting(  # a name of trainer.optim.OPTIMIZERS
        "--optimizer", group="recipe", default=DEFAULT_OPTIMIZER, choices=tuple(OPTIMIZERS),
        help="sgd: SGD with momentum (the device's fused kernel where it has one); lars: SGD momentum with a "
             "layer-wise trust ratio, for large global batches")
    lr: float = setting("--lr", "--learning-rate", group="examples", default=0.1, type=number(float, 0.0),
                        help="peak learning rate, used as given (pass it already scaled for the global batch)")
    momentum: float = setting("--momentum", group="examples", default=0.9, type=number(float, 0.0))
    weight_decay: float = setting("--wd", "--weight-decay", group="examples", default=1e-4, type=number(float, 0.0))
    lr_schedule: str = setting(
        "--lr-schedule", group="recipe", default="step", choices=LR_SCHEDULES,
        help="step: x0.1 every 30 epochs (pytorch/examples); cosine: to zero at the last step; triangular: linear "
             "from lr x 1e-4 up to lr at --lr-peak-epoch, then linear to zero at the end, every step (FFCV's ResNet "
             "recipes); poly: after warm-up, (1 - progress)^2 down to 1e-4 at the last step (MLPerf's ResNet-50 with "
             "LARS)")
    warmup_epochs: float = setting("--warmup-epochs", group="recipe", default=0.0, type=number(float, 0.0),
                                   help="linear LR warm-up, in epochs (fractions allowed)")
    label_smoothing: float = setting("--label-smoothing", group="recipe", default=0.0, type=number(float, 0.0))
    lr_step_unit: str = setting(  # ModelZoo's entries move the LR once per epoch
        "--lr-step-unit", group="recipe", default="step", choices=("step", "epoch"),
        help="step: warm-up and cosine move every step (torchvision's references); epoch: once per epoch, as Ascend "
             "ModelZoo's ResNet50 and ShuffleNetV2 entries do (set by --warmup and --warm_up_epochs)")
    warmup_offset: int = 0  # per-epoch warm-up: lr x (epoch+1)/(warmup_epochs+offset); Shufflenetv2's is 1
    lr_peak_epoch: float = setting(
        "--lr-peak-epoch", group="recipe", default=2.0, type=number(float, 0.0), metavar="E",
        help="--lr-schedule triangular: the epoch (fractions allowed) where the LR peaks; below --epochs")
    norm_weight_decay: Optional[float] = setting(  # None: the optimizer's (optim/groups.py)
        "--norm-weight-decay", group="recipe", type=number(float, 0.0), metavar="WD",
        help="weight decay of the normalisation layers' parameters and of every bias, a parameter group of their own "
             "(torchvision's reference's name; the biases too, as MLPerf's ResNet-50 exempts them; FFCV's recipes "
             "exempt only BatchNorm parameters, so the classifier's bias, decayed there, is not here); default: --wd "
             "for sgd, 0 for lars")
    model_ema: bool = setting(  # trainer/optim/ema.py
        "--model-ema", group="recipe", default=False, action="store_true",
        help="keep an exponential moving average of the weights (torchvision's reference): validated beside the "
             "weights (Test EMA lines), saved in checkpoints as model_ema; with --evaluate, evaluate a checkpoint's "
             "average")
    model_ema_steps: int = setting(
        "--model-ema-steps", group="recipe", default=32, type=number(int, 1), metavar="N",
        help="--model-ema: update the average every N steps of an epoch (its first step included)")
    model_ema_decay: float = setting(
        "--model-ema-decay", group="recipe", default=0.99998, type=number(float, 0.0), metavar="D",
        help="--model-ema: decay, adjusted as torchvision's reference does: 1 - min(1, (1 - D) x global batch x N / "
             "epochs) per update; the average copies the weights during --warmup-epochs")


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """What ``trainer.data.build`` reads."""
    root: Optional[str] = setting(  # None with --dummy
        group="examples", dest="data", nargs="?", metavar="DIR",
        help="data set: an ImageNet-style folder with train/ and val/ (or tiny-imagenet-200)")
    dummy: bool = setting("--dummy", group="examples", default=False, action="store_true",
                          help="synthetic batches made on the device (no decoding): for FPS runs")
    workers: Optional[int] = setting(  # per node; None: from the device kind and the cores (trainer.Trainer)
        "-j", "--workers", group="examples", type=number(int, 0),
        help="data loading workers per node, shared among its processes (each gets ceil(j / processes per node)); "
             "default: from each process's share of the CPU cores, up to 16 per process on an accelerator, 4 on a CPU")
    train_crop_size: int = setting(  # the fixed training size; with a resolution schedule its largest, max_res
        "--train-crop-size", group="recipe", default=spec.TRAIN_CROP_SIZE, type=number(int, 1),
        help="the training image size (RandomResizedCrop's output); with --min-res/--max-res on the command line an "
             "error (the schedule sets the size)")
    crop_scale_min: float = setting(
        "--crop-scale-min", group="recipe", default=spec.CROP_SCALE_MIN, type=number(float, 0.0),
        help="smallest area fraction RandomResizedCrop takes (torchvision: 0.08)")
    val_resize_size: int = setting(
        "--val-resize-size", group="recipe", default=spec.VAL_RESIZE_SIZE, flag_default=None, type=number(int, 1),
        help="validation: the shorter side is resized to this, then --val-crop-size is cut from the centre; default "
             "--val-crop-size x 256/224, rounded (256 for 224; FFCV's crop ratio)")
    val_crop_size: int = setting(
        "--val-crop-size", group="recipe", default=spec.VAL_CROP_SIZE, type=number(int, 1),
        help="the validation image size; may exceed the training size (the networks pool adaptively)")
    data_backend: str = setting(
        "--data-backend", group="device", default="auto", choices=DATA_BACKENDS,
        help="where JPEGs are decoded and augmented: cpu (data-loader workers, PIL with draft-mode decode), gpu "
             "(workers read bytes; whole batches are decoded and cropped on the device: nvJPEG on CUDA, DVPP via "
             "torchvision_npu on NPU); auto: cpu, the faster of the two as measured (docs/BENCHMARKS.md)")
    # the training resolution schedule (trainer/data/resolution.py); min_res None: --train-crop-size throughout
    min_res: Optional[int] = setting(
        "--min-res", group="resolution", type=number(int, 1), metavar="PX",
        help="training resolution schedule (FFCV's resolution.min_res): the size up to --start-ramp; a multiple of "
             "32; with --max-res, --start-ramp, --end-ramp, in place of --train-crop-size")
    max_res: Optional[int] = setting(
        "--max-res", group="resolution", type=number(int, 1), metavar="PX",
        help="the size from --end-ramp on (FFCV's max_res), a multiple of 32, at least --min-res")
    start_ramp: Optional[int] = setting(
        "--start-ramp", group="resolution", type=number(int, 0), metavar="E",
        help="the last epoch (counted from 0) at --min-res; the size then rises linearly, rounded to a multiple of "
             "32, once per epoch")
    end_ramp: Optional[int] = setting("--end-ramp", group="resolution", type=number(int, 0), metavar="E",
                                      help="the first epoch at --max-res; --start-ramp <= E <= --epochs")
    val_tta: str = setting(
        "--val-tta", group="resolution", default="none", choices=("none", "flip"),
        help="flip: validation averages the logits of each image and its horizontal mirror (FFCV's lr_tta), for the "
             "weights and for --model-ema's average")
    # a size flag (config.SIZES) was on the command line; else -e --resume evaluates at the checkpoint's sizes
    sizes_given: bool = False
    # the device backend's ways of working (data.LoaderSpec); None: the device's choice. No flags: set by tools
    decode_ahead: Optional[bool] = None
    batched_crops: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """What ``trainer.build_model`` reads (as the plan decided it: trainer/plan.py)."""
    arch: str = setting(  # as given (checkpoints and summaries name it)
        "-a", "--arch", group="examples", default="resnet50", metavar="ARCH",
        help="model architecture (see --list-models); shufflenet_v2_x* builds this project's numerically identical, "
             "faster shufflenet_v2_x*_npu unless --model-impl torchvision")
    name: str = "resnet50"  # the network built: --arch, or this project's variant of it (models.resolve)
    model_impl: str = setting(
        "--model-impl", group="device", default="auto", choices=("auto", "torchvision"),
        help="auto: this project's variant of --arch where one exists (shufflenet_v2_x*_npu: same weights and "
             "outputs, faster); torchvision: torchvision's own network")
    pretrained: Optional[str] = setting(  # a weights file
        "--pretrained", group="examples", nargs="?", const=PUBLISHED, metavar="FILE",
        help="initial weights: alone, torchvision's published ImageNet weights for -a (from torchvision's cache "
             "under TORCH_HOME, downloaded there when missing; a different --num-classes keeps the backbone and "
             "starts a new classifier); with FILE, a local state dict or checkpoint file")
    pretrained_published: bool = False  # --pretrained alone: torchvision's published weights (``pretrained``: the file)
    num_classes: Optional[int] = setting(  # None: the data's class count
        "--num-classes", group="recipe", type=number(int, 1),
        help="classifier outputs (default: the number of class folders; 1000 with --dummy)")
    zero_init_residual: bool = setting("--zero-init-residual", group="recipe", default=False, action="store_true",
                                       help="ResNet: zero the last BN gamma of each residual block")
    channels_last: Optional[bool] = setting(  # None: the device's default (decided by trainer/plan.py)
        "--channels-last", group="device", action="store_true", off=("--no-channels-last", "NCHW memory format"),
        help="NHWC memory format (default: on for CPU, where it is faster; off for NPU and CUDA)")
    sync_bn: bool = setting("--sync-bn", group="distributed", default=False, action="store_true",
                            help="synchronised BatchNorm across processes")
    compile: bool = setting(  # the training step in graph mode (trainer/graph.py)
        "--compile", group="device", default=False, action="store_true",
        help="graph mode: the model's training forward and backward compiled (torch.compile's inductor on CUDA and "
             "CPU, torch >= 2.0; torchair, torch_npu's graph backend, on NPU); the first step compiles "
             "(compile_seconds, apart from FPS); a model that fails to compile trains eagerly, with a note. "
             "Validation stays eager")
    compile_mode: str = setting(
        "--compile-mode", group="device", default="default", choices=COMPILE_MODES,
        help="torch.compile's mode: reduce-overhead (CUDA graphs), max-autotune (longer compile); NPU: torchair's "
             "graph engine whatever the mode")
    blurpool: bool = setting(  # models/blurpool.py
        "--blurpool", group="resolution", default=False, action="store_true",
        off=("--no-blurpool", "no BlurPool (turns off a --recipe's --blurpool)"),
        help="ResNets: a fixed 3x3 binomial blur before every strided convolution of 16 or more input channels "
             "(FFCV's BlurPoolConv2d); state dicts keep the plain network's keys")


@dataclasses.dataclass(frozen=True)
class PrecisionConfig(_Section):
    """What trainer.precision.amp reads (--amp and its options)."""
    amp: bool = setting("--amp", group="device", default=False, action="store_true",
                        off=("--no-amp", "float32 training (turns off a --recipe's --amp)"),
                        help="mixed precision in --amp-dtype; float16 steps with inf/NaN gradients are skipped")
    amp_impl: str = setting(  # auto is settled once the device is known: precision/amp.py settle
        "--amp-impl", group="device", default="auto", choices=("auto", "native", "apex"),
        help="auto: native autocast + GradScaler (on NPU torch_npu's, as Ascend's AMP guide recommends; Ascend "
             "apex.amp only on torch_npu 1.11 where it is installed); native; apex (NVIDIA or Ascend apex.amp)")
    amp_dtype: str = setting(
        "--amp-dtype", group="device", default="auto", choices=("auto", "float16", "bfloat16"),
        help="auto: bfloat16 (no loss scaling) on GPUs with native bfloat16, float16 + loss scaler on older GPUs and "
             "on NPU, bfloat16 on CPUs with native bfloat16 and float32 on other CPUs (where bfloat16 is many times "
             "slower), with a note")
    opt_level: Optional[str] = setting(  # None: not given (apex runs at precision.APEX_OPT_LEVEL)
        "--opt-level", "--opt_level", group="device",
        help="apex opt level, O1 or O2 (apex only; default: {})".format(APEX_OPT_LEVEL))
    loss_scale: Optional[Union[float, str]] = setting(  # None: not given; "dynamic" (flags.DYNAMIC); a number: fixed
        "--loss-scale", "--loss_scale", group="device", type=parse_loss_scale, metavar="N|dynamic|-1",
        help="float16 loss scale: a number is held fixed (steps with inf/NaN gradients are still skipped), dynamic "
             "(or -1, as in the Ascend guides) adapts it; default dynamic, except apex on NPU: 1024 (the Ascend "
             "guide's default)")
    combine_ddp: bool = setting(
        "--combine-ddp", group="device", default=False, action="store_true",
        help="Ascend apex: all-reduce combined gradients inside apex (amp.initialize(combine_ddp=True)) instead of "
             "torch's DistributedDataParallel")
    float32_math: Optional[str] = None  # ModelZoo's ALLOW_HF32 ("reduced") / ALLOW_FP32 ("full"); None: the device's
    # which of opt_level / loss_scale hold a --recipe's or ModelZoo entry's value, not one the command line gave
    # (trainer/precision/amp.py settle: apex's own loss scale wins over such a value, and it needs no note)
    preset: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LaunchConfig(_Section):
    """Where this process sits in the job and how it meets the others (trainer/job/launch.py)."""
    device: str = setting("--device", group="device", default="auto", choices=DEVICES,
                          help="auto: npu if torch_npu sees one, else cuda, else cpu; gpu is cuda")
    device_index: Optional[int] = setting("--gpu", group="examples", dest="gpu", type=number(int, 0),
                                          help="device index for a single-process run (any device kind)")
    # the fields without a flag: decided by the launch (trainer/job/launch.py) from --world-size, --rank,
    # --dist-url, --addr (flags.CommandLine) and the environment
    mode: str = "single"  # single | spawn | process
    world_size: int = 1  # total processes (spawn: known once the devices are counted)
    rank: int = 0  # global rank (spawn parent: this node's first rank)
    nodes: int = 1
    node_rank: int = 0
    procs_per_node: int = 1
    dist_url: Optional[str] = "env://"
    dist_backend: Optional[str] = setting(
        "--dist-backend", "--dist_backend", group="distributed",
        help="process-group backend (default: hccl on NPU, nccl on CUDA, gloo on CPU)")
    multiprocessing_distributed: bool = setting(
        "--multiprocessing-distributed", group="distributed", default=False, action="store_true",
        help="spawn one process per device of --device-list on this node")
    device_list: Optional[Tuple[int, ...]] = setting(
        "--device-list", "--device_list", group="distributed", type=parse_device_list, metavar="IDS",
        help="devices to use: 0-7, 0,1,2,3 or 0-3,6 (default: all visible)")
    addr: Optional[str] = "127.0.0.1"
    port: Optional[int] = setting("--port", group="distributed", type=int,
                                  help="master port (MASTER_PORT); 0 picks a free one")
    local_rank: Optional[int] = setting("--local-rank", "--local_rank", group="distributed", type=int,
                                        help="set by torch.distributed.launch; torchrun sets LOCAL_RANK instead")
    broadcast_buffers: bool = setting(
        "--no-broadcast-buffers", group="distributed", default=True, action="store_false",
        help="DDP: do not broadcast BN buffers from rank 0 each step")
    dist_timeout: float = setting("--dist-timeout", group="distributed", default=1800, type=number(int, 1),
                                  help="seconds a collective may wait before the job fails")
    # the host and device settings of each rank (trainer/job/affinity.py, Device.configure): auto | on | off
    cpu_binding: str = setting(
        "--cpu-binding", group="device", default="auto", choices=AUTO_ON_OFF,
        help="each rank and its data workers on a contiguous slice of this process's cores, NUMA node by NUMA node; "
             "auto: on NPU and CUDA runs (left to torch_npu where CPU_AFFINITY_CONF is set), not on a CPU run; on: "
             "also on a CPU run")
    jit_compile: str = setting(
        "--jit-compile", group="device", default="auto", choices=AUTO_ON_OFF,
        help="NPU: torch_npu.npu.set_compile_mode(jit_compile=...); auto: off (binary kernels) on Atlas A2/A3, "
             "torch_npu's default elsewhere")
    internal_format: str = setting(
        "--internal-format", group="device", default="auto", choices=AUTO_ON_OFF,
        help="NPU: torch.npu.config.allow_internal_format; auto: off on Atlas A2/A3, on elsewhere")
    pin_memory: str = setting(
        "--pin-memory", group="device", default="auto", choices=AUTO_ON_OFF,
        help="the loaders' pinned host memory; auto: on for CUDA, and for NPU on torch 2.x (pin_memory_device npu), "
             "off on CPU and on torch_npu 1.11 (its guide)")


SECTIONS = (("data", DataConfig), ("model", ModelConfig), ("optim", OptimConfig), ("precision", PrecisionConfig),
            ("launch", LaunchConfig), ("run", RunConfig))
# the flat names (checkpoints' and summaries' "config") of the fields whose section names them otherwise
RENAMED = {("data", "root"): "data", ("model", "name"): "model", ("launch", "mode"): "launch"}
FLAT = {RENAMED.get((section, f.name), f.name): (section, f.name)  # flat name -> (section, field)
        for section, cls in SECTIONS for f in dataclasses.fields(cls)}
assert len(FLAT) == sum(len(dataclasses.fields(cls)) for _, cls in SECTIONS), "every field has one flat name"


def build_parser():
    """main.py's parser, made from the declarations above."""
    return make_parser(
        (CommandLine,) + tuple(cls for _, cls in SECTIONS), GROUPS, prog="main.py",
        description="ImageNet-style training and evaluation on Ascend NPU, CUDA or CPU (a port of pytorch/examples' "
                    "imagenet/main.py).",
        epilog="Exit codes: 0 the model trained (summary.json status ok); 1 a crash (failed); 2 a user error (one line "
               "on stderr); 4 the run diverged (status diverged: a non-finite training loss, more than 50 consecutive "
               "float16 steps skipped for inf/NaN gradients, or non-finite weights; the last good checkpoints are "
               "kept; see docs/PRECISION.md); 128 + the signal's number when a signal stopped it (130 SIGINT, "
               "143 SIGTERM, 138 SIGUSR1: a mid-epoch checkpoint that --resume auto continues; docs/DISTRIBUTED.md).")


def parse_typed(parser, argv):
    """{dest: value} of the flags the command line gave: parsed into a namespace of Nones, so argparse fills in no
    default and a dest left None was not given (the parser, and so --help, keeps its defaults)."""
    dests = {a.dest for a in parser._actions if a.dest is not argparse.SUPPRESS} | set(parser._defaults)
    ns = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests)))
    return {k: v for k, v in vars(ns).items() if v is not None}


def own_defaults(parser):
    """{dest: the value argparse fills in where its flag is not given}."""
    out = {}
    for a in parser._actions:
        if a.default is not argparse.SUPPRESS and a.dest is not argparse.SUPPRESS:
            out.setdefault(a.dest, a.default)
    for dest, value in parser._defaults.items():
        out.setdefault(dest, value)
    return out


def convert_defaults(parser, values, typed):
    """``values`` with each default that is a string (not ``typed``) passed through its action's ``type=``, as
    argparse does with a string default; a value that does not convert is argparse's error."""
    first = {}
    for a in parser._actions:
        first.setdefault(a.dest, a)
    out = dict(values)
    for dest, value in values.items():
        if dest not in typed and isinstance(value, str) and dest in first:
            try:
                out[dest] = parser._get_value(first[dest], value)
            except argparse.ArgumentError as exc:
                parser.error(str(exc))
    return out


def _normalise_device_list(ids):
    """The Ascend guide maps process i to the i-th smallest device id (its device_id_to_process_device_map
    sorts the list): the same order here, on every device kind. Returns (ids, note or None)."""
    if ids is None or list(ids) == sorted(ids):
        return ids, None
    ordered = tuple(sorted(ids))
    return ordered, "--device-list {} taken in ascending order {}: process i uses the i-th smallest id".format(
        ",".join(map(str, ids)), ",".join(map(str, ordered)))
