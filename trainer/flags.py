"""The command line's flags: main.py's argparse parser (pytorch/examples' flags, then this project's, in groups),
their value parsers, and the one parse of a command line, which learns the flags it gave (``parse_typed``).
``trainer/config.py`` fills in the rest (argparse's defaults, a recipe's, a ModelZoo entry's) and turns the flags
into a ``Config``."""
import argparse
import re

from trainer.cli import HelpFormatter, UsageParser, number, parse_loss_scale
from trainer.device_names import DATA_BACKENDS, KIND_ALIASES, KINDS
from trainer.optim import DEFAULT_OPTIMIZER, OPTIMIZERS
from trainer.optim.schedule import KINDS as LR_SCHEDULES

DEVICES = ("auto",) + KINDS + tuple(KIND_ALIASES)
OPT_LEVELS = ("O1", "O2")
APEX_OPT_LEVEL = "O2"  # apex's opt level where --opt-level is not given (the Ascend guide's)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's modes
MODELZOO_ENTRIES = ("auto", "off", "resnet50", "shufflenetv2")  # --modelzoo
PUBLISHED = "\0published"  # --pretrained given without FILE (argparse's const; no path can hold a NUL)


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


DUMP_LEVELS = ("L0", "L1", "mix")  # msprobe's levels that --dump-level offers
DUMP_TASKS = ("statistics", "tensor")


def parse_dump_steps(text):
    """``0``, ``0,3``, ``0-2`` -> sorted distinct global steps (--dump-steps)."""
    steps = set()
    for part in str(text).split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise argparse.ArgumentTypeError(
                "--dump-steps: '{}' is not a step or a rising range (use e.g. 0, 0,3 or 0-2)".format(part.strip()))
        steps.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return tuple(sorted(steps))


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
    g.add_argument("--save-every", dest="save_every", type=number(float, 0, exclusive=True), default=None,
                   metavar="MINUTES", help="also save a mid-epoch checkpoint every MINUTES of training (in the "
                   "last epoch's file, written atomically), so that a run killed outright loses at most that much")
    g.add_argument("-e", "--evaluate", action="store_true", help="evaluate the model on val/ and stop")
    g.add_argument("--pretrained", nargs="?", const=PUBLISHED, default=None, metavar="FILE",
                   help="initial weights: alone, torchvision's published ImageNet weights for -a (from torchvision's "
                        "cache under TORCH_HOME, downloaded there when missing; a different --num-classes keeps the "
                        "backbone and starts a new classifier); with FILE, a local state dict or checkpoint file")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible runs")
    g.add_argument("--gpu", type=number(int, 0), default=None,
                   help="device index for a single-process run (any device kind)")
    g.add_argument("--no-accel", action="store_true",
                   help="use the CPU even where an accelerator is present (--device cpu; with --device npu, cuda or "
                        "gpu an error)")
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
    d.add_argument("--no-amp", dest="amp", action="store_false",
                   help="float32 training (turns off a --recipe's --amp)")
    d.add_argument("--amp-dtype", choices=("auto", "float16", "bfloat16"), default="auto",
                   help="auto: bfloat16 (no loss scaling) on GPUs with native bfloat16, float16 + loss scaler "
                        "on older GPUs and on NPU, bfloat16 on CPUs with native bfloat16 and float32 on other "
                        "CPUs (where bfloat16 is many times slower), with a note")
    d.add_argument("--amp-impl", choices=("auto", "native", "apex"), default="auto",
                   help="auto: native autocast + GradScaler (on NPU torch_npu's, as Ascend's AMP guide recommends; "
                        "Ascend apex.amp only on torch_npu 1.11 where it is installed); native; apex (NVIDIA or "
                        "Ascend apex.amp)")
    d.add_argument("--opt-level", "--opt_level", dest="opt_level", default=None,
                   help="apex opt level, O1 or O2 (apex only; default: {})".format(APEX_OPT_LEVEL))
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
    d.add_argument("--compile", action="store_true",
                   help="graph mode: the model's training forward and backward compiled (torch.compile's "
                        "inductor on CUDA and CPU, torch >= 2.0; torchair, torch_npu's graph backend, on NPU); "
                        "the first step compiles (compile_seconds, apart from FPS); a model that fails to "
                        "compile trains eagerly, with a note. Validation stays eager")
    d.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile's mode: reduce-overhead (CUDA graphs), max-autotune (longer compile); "
                        "NPU: torchair's graph engine whatever the mode")
    d.add_argument("--cpu-binding", choices=("auto", "on", "off"), default="auto",
                   help="each rank and its data workers on a contiguous slice of this process's cores, NUMA node "
                        "by NUMA node; auto: on NPU and CUDA runs (left to torch_npu where CPU_AFFINITY_CONF is "
                        "set), not on a CPU run; on: also on a CPU run")
    d.add_argument("--jit-compile", choices=("auto", "on", "off"), default="auto",
                   help="NPU: torch_npu.npu.set_compile_mode(jit_compile=...); auto: off (binary kernels) on Atlas "
                        "A2/A3, torch_npu's default elsewhere")
    d.add_argument("--internal-format", choices=("auto", "on", "off"), default="auto",
                   help="NPU: torch.npu.config.allow_internal_format; auto: off on Atlas A2/A3, on elsewhere")
    d.add_argument("--pin-memory", choices=("auto", "on", "off"), default="auto",
                   help="the loaders' pinned host memory; auto: on for CUDA, and for NPU on torch 2.x "
                        "(pin_memory_device npu), off on CPU and on torch_npu 1.11 (its guide)")
    d.add_argument("--data-backend", choices=DATA_BACKENDS, default="auto",
                   help="where JPEGs are decoded and augmented: cpu (data-loader workers, PIL with draft-mode "
                        "decode), gpu (workers read bytes; whole batches are decoded and cropped on the device: "
                        "nvJPEG on CUDA, DVPP via torchvision_npu on NPU); auto: cpu, the faster of the two as "
                        "measured (docs/BENCHMARKS.md)")

    t = p.add_argument_group("recipe")
    t.add_argument("--recipe", default=None, metavar="NAME",
                   help="defaults from a published recipe, adapted to the process count (batch per device "
                        "kept, lr linear in the batch; a note names the rule where the batch is outside the "
                        "source's published ones): " + ", ".join(recipes.names()))
    t.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default=DEFAULT_OPTIMIZER,
                   help="sgd: SGD with momentum (the device's fused kernel where it has one); lars: SGD momentum "
                        "with a layer-wise trust ratio, for large global batches")
    t.add_argument("--label-smoothing", type=number(float, 0.0), default=0.0)
    t.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="step",
                   help="step: x0.1 every 30 epochs (pytorch/examples); cosine: to zero at the last step; "
                        "triangular: linear from lr x 1e-4 up to lr at --lr-peak-epoch, then linear to zero at the "
                        "end, every step (FFCV's ResNet recipes); poly: after warm-up, (1 - progress)^2 down to "
                        "1e-4 at the last step (MLPerf's ResNet-50 with LARS)")
    t.add_argument("--lr-peak-epoch", type=number(float, 0.0), default=2.0, metavar="E",
                   help="--lr-schedule triangular: the epoch (fractions allowed) where the LR peaks; below --epochs")
    t.add_argument("--warmup-epochs", type=number(float, 0.0), default=0.0,
                   help="linear LR warm-up, in epochs (fractions allowed)")
    t.add_argument("--norm-weight-decay", type=number(float, 0.0), default=None, metavar="WD",
                   help="weight decay of the normalisation layers' parameters and of every bias, a parameter "
                        "group of their own (torchvision's reference's name; the biases too, as MLPerf's ResNet-50 "
                        "exempts them; FFCV's recipes exempt only BatchNorm parameters, so the classifier's bias, "
                        "decayed there, is not here); default: --wd for sgd, 0 for lars")
    t.add_argument("--model-ema", action="store_true",
                   help="keep an exponential moving average of the weights (torchvision's reference): validated "
                        "beside the weights (Test EMA lines), saved in checkpoints as model_ema; with --evaluate, "
                        "evaluate a checkpoint's average")
    t.add_argument("--model-ema-steps", type=number(int, 1), default=32, metavar="N",
                   help="--model-ema: update the average every N steps of an epoch (its first step included)")
    t.add_argument("--model-ema-decay", type=number(float, 0.0), default=0.99998, metavar="D",
                   help="--model-ema: decay, adjusted as torchvision's reference does: 1 - min(1, (1 - D) x global "
                        "batch x N / epochs) per update; the average copies the weights during --warmup-epochs")
    t.add_argument("--lr-step-unit", choices=("step", "epoch"), default="step",
                   help="step: warm-up and cosine move every step (torchvision's references); epoch: once per "
                        "epoch, as Ascend ModelZoo's ResNet50 and ShuffleNetV2 entries do (set by --warmup and "
                        "--warm_up_epochs)")
    t.add_argument("--train-crop-size", type=number(int, 1), default=224,
                   help="the training image size (RandomResizedCrop's output); with --min-res/--max-res on the "
                        "command line an error (the schedule sets the size)")
    t.add_argument("--crop-scale-min", type=number(float, 0.0), default=0.08,
                   help="smallest area fraction RandomResizedCrop takes (torchvision: 0.08)")
    t.add_argument("--val-resize-size", type=number(int, 1), default=None,
                   help="validation: the shorter side is resized to this, then --val-crop-size is cut from the "
                        "centre; default --val-crop-size x 256/224, rounded (256 for 224; FFCV's crop ratio)")
    t.add_argument("--val-crop-size", type=number(int, 1), default=224,
                   help="the validation image size; may exceed the training size (the networks pool adaptively)")
    t.add_argument("--num-classes", type=number(int, 1), default=None,
                   help="classifier outputs (default: the number of class folders; 1000 with --dummy)")
    t.add_argument("--zero-init-residual", action="store_true",
                   help="ResNet: zero the last BN gamma of each residual block")

    r = p.add_argument_group(
        "training resolution, test-time augmentation, BlurPool",
        "FFCV's ResNet recipes: low-resolution training rising to a higher size, validation above it with flips")
    r.add_argument("--min-res", type=number(int, 1), default=None, metavar="PX",
                   help="training resolution schedule (FFCV's resolution.min_res): the size up to --start-ramp; a "
                        "multiple of 32; with --max-res, --start-ramp, --end-ramp, in place of --train-crop-size")
    r.add_argument("--max-res", type=number(int, 1), default=None, metavar="PX",
                   help="the size from --end-ramp on (FFCV's max_res), a multiple of 32, at least --min-res")
    r.add_argument("--start-ramp", type=number(int, 0), default=None, metavar="E",
                   help="the last epoch (counted from 0) at --min-res; the size then rises linearly, rounded to a "
                        "multiple of 32, once per epoch")
    r.add_argument("--end-ramp", type=number(int, 0), default=None, metavar="E",
                   help="the first epoch at --max-res; --start-ramp <= E <= --epochs")
    r.add_argument("--val-tta", choices=("none", "flip"), default="none",
                   help="flip: validation averages the logits of each image and its horizontal mirror (FFCV's "
                        "lr_tta), for the weights and for --model-ema's average")
    r.add_argument("--blurpool", action="store_true",
                   help="ResNets: a fixed 3x3 binomial blur before every strided convolution of 16 or more input "
                        "channels (FFCV's BlurPoolConv2d); state dicts keep the plain network's keys")
    r.add_argument("--no-blurpool", dest="blurpool", action="store_false",
                   help="no BlurPool (turns off a --recipe's --blurpool)")

    o = p.add_argument_group("run control and outputs")
    o.add_argument("--output-dir", default=".", metavar="DIR",
                   help="checkpoints and summary.json go here; when not given and the current folder holds an "
                        "earlier run (ModelZoo's performance then full script), that run is moved to "
                        "previous_runs/STAMP/ first, with a note")
    o.add_argument("--eval-freq", "-ef", type=number(int, 1), default=1,
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

    a = p.add_argument_group(
        "precision alignment (msprobe)",
        "dumps for layer-by-layer comparison with Ascend's msprobe (pip install mindstudio-probe) and runs that "
        "repeat on another machine; python3 -m tools.align compares them (docs/TOOLS.md)")
    a.add_argument("--precision-dump", default=None, metavar="DIR",
                   help="dump the --dump-steps training steps through msprobe's PrecisionDebugger into "
                        "DIR/step<k>/rank<r>/ (started before the forward pass, stopped after the optimizer step)")
    a.add_argument("--dump-steps", type=parse_dump_steps, default=(0,), metavar="STEPS",
                   help="--precision-dump: global training steps (from 0) to dump: 0,3 or 0-2")
    a.add_argument("--dump-level", choices=DUMP_LEVELS, default="L0",
                   help="--precision-dump: msprobe's level: L0 modules, L1 torch APIs, mix both")
    a.add_argument("--dump-task", choices=DUMP_TASKS, default="statistics",
                   help="--precision-dump: msprobe's task: statistics (max, min, mean, norm of each tensor) or "
                        "tensor (every tensor as .npy as well)")
    a.add_argument("--dump-config", default=None, metavar="FILE.json",
                   help="--precision-dump: msprobe's own config.json (task, level, step, scope, list, ...) in place "
                        "of --dump-steps, --dump-level and --dump-task")
    a.add_argument("--deterministic", action="store_true",
                   help="for alignment runs (needs --seed): msprobe's seed_all with dropout removed where msprobe "
                        "is installed, Dropout at p=0, the device's deterministic algorithms; summary.json records "
                        "the fingerprints of the initial weights and of the first batches")

    z = p.add_argument_group(
        "Ascend ModelZoo flags",
        "the flags of ModelZoo's ResNet50_ID4149 main.py and Shufflenetv2 8p_main_med.py, with their meaning")
    z.add_argument("--modelzoo", choices=MODELZOO_ENTRIES, default="auto",
                   help="which ModelZoo entry this run stands in for: its parser's defaults (resnet50: label "
                        "smoothing 0.1, 8 warm-up epochs, cosine per epoch, loss scale 1024; shufflenetv2: cosine "
                        "per epoch, --eval-freq 5, loss scale 64) and its log lines; flags given win. auto: under a "
                        "ModelZoo script (RANK_SIZE set) without --recipe, shufflenetv2 when started as "
                        "8p_main_med.py, else resnet50; off everywhere else (pytorch/examples' defaults)")
    z.add_argument("--warmup", dest="mz_warmup", type=number(int, 0), default=None, metavar="E",
                   help="ResNet50_ID4149: E warm-up epochs, lr x (epoch+1)/E in epoch `epoch`, then cosine per epoch")
    z.add_argument("--warm_up_epochs", dest="mz_warm_up_epochs", type=number(int, 0), default=None, metavar="N",
                   help="Shufflenetv2: N warm-up epochs, lr x (epoch+1)/(N+1), then cosine per epoch")
    z.add_argument("--skip_steps", dest="skip_steps", type=number(int, 0), default=None, metavar="N",
                   help="the first N steps of each epoch are left out of the step time and FPS (the Time average "
                        "of the progress lines restarts at step N, as ModelZoo's performance scripts read it)")
    z.add_argument("-bm", "--benchmark", dest="mz_benchmark", type=int, choices=(0, 1), default=0,
                   help="Shufflenetv2's switch: 0 trains normally; 1 (gradient accumulation to 2048 images) is "
                        "refused: give the batch with -b")
    z.add_argument("--device_num", dest="device_num", type=number(int, 1), default=None, metavar="N",
                   help="devices per node (Shufflenetv2); checked against --device-list and RANK_SIZE")
    z.add_argument("--workspace", dest="workspace", default=None, metavar="DIR",
                   help="Shufflenetv2: where checkpoints are stored (the same as --output-dir)")
    z.add_argument("--checkpoint-nameprefix", dest="checkpoint_prefix", default="checkpoint", metavar="NAME",
                   help="the last epoch's checkpoint is NAME.pth.tar (model_best.pth.tar keeps its name)")
    z.add_argument("--checkpoint-freq", dest="checkpoint_freq", type=number(int, 0), default=0, metavar="N",
                   help="0: one checkpoint file, rewritten each epoch; N: also keep NAME_epochE.pth.tar every N "
                        "epochs")

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


def parse_typed(parser, argv):
    """The command line parsed, once: {dest: value} of the flags it gave. The parse starts from a namespace with
    every dest None, so argparse fills in no default (store_true's False, store_false's True, "auto", the numbers)
    and a dest left None was not given; the parser itself, and so --help, keeps its defaults. (DIR, the one
    positional, which argparse sets to its default when absent, defaults to None.)"""
    dests = {a.dest for a in parser._actions if a.dest is not argparse.SUPPRESS} | set(parser._defaults)
    ns = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests)))
    return {k: v for k, v in vars(ns).items() if v is not None}


def own_defaults(parser):
    """{dest: the value argparse fills in where its flag is not given}: the first action's default (then
    ``set_defaults``' values)."""
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
