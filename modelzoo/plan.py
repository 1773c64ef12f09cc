"""What a ModelZoo-style driver decides before it starts a process: its --key=value arguments (and --help),
the recipe (trainer/recipes.py, the same rule as main.py --recipe), the baseline table (checked before the
run), the output folder, and the main.py command line of each rank. modelzoo/drivers.py runs the plan.
"""
import os
import re
import sys

from modelzoo import acceptance, zooargs
from trainer.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VALUE_KEYS = ("data_path", "arch", "batch_size", "epochs", "lr", "device", "device_id", "rank_size", "device_list",
              "workers", "precision", "resume", "output_dir", "baseline", "acc_tolerance", "fps_ratio", "steps",
              # ModelZoo's script arguments (modelzoo/zooargs.py)
              "precision_mode", "profiling", "over_dump", "data_dump_flag", "data_dump_step", "autotune",
              "learning_rate", "ckpt_path", "more_path1", "train_epochs", "hf32", "fp32",
              # nodes (train_full_16p.sh, train_performance_16p.sh, train_cluster.sh)
              "world_size", "node_rank", "master_addr")
NODE_SCALES = ("16p", "cluster")
SCALES = ("1p", "8p") + NODE_SCALES
# main.py destinations the drivers set themselves (their --key=value arguments say them instead)
OWNED = ("arch", "batch_size", "lr", "epochs", "workers", "device", "device_index", "device_list", "output_dir",
         "resume", "recipe", "amp", "amp_impl", "opt_level", "dummy", "data", "data_opt", "evaluate",
         "multiprocessing_distributed", "world_size", "rank", "local_rank")
PERF_STEPS = 1000
NPU_NETWORKS = ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0")


def usage(mode, scale):
    script = "train_cluster.sh" if scale == "cluster" else "train_{}_{}.sh".format(mode, scale)
    if scale == "1p":
        scale_args = "  --device_id=N          device index (default: $ASCEND_DEVICE_ID, else 0)"
    else:
        scale_args = ("  --rank_size=N          processes{}, one per device (default 8)\n"
                      "  --device_list=IDS      devices, e.g. 0-7, 0,1,2,3 or 0-3,6 (default: this host's devices in\n"
                      "                         $RANK_TABLE_FILE where exported, else 0..rank_size-1)\n"
                      "  --device_id=N          ignored, as in ModelZoo's multi-device scripts (a note says so)"
                      ).format(" on this node" if scale in NODE_SCALES else "")
    if scale in NODE_SCALES:
        scale_args += ("\n  --world_size=N         nodes (default {}); one driver per node, each with its --node_rank\n"
                       "  --node_rank=R          this node, 0..world_size-1 (default 0; node 0 writes the results)\n"
                       "  --master_addr=IP       node 0's address, the same on every node (required with 2+ nodes);\n"
                       "                         port 29688 unless -- --port N (the same on every node)").format(
                           "2" if scale == "16p" else "1")
    extra = "" if mode == "full" else (
        "\n  --steps=N              training steps per epoch (default {}); epochs default to 1".format(PERF_STEPS))
    return """usage: bash test/{script} --data_path=DIR [--key=value ...] [-- main.py flags]

{what} of main.py in the Ascend ModelZoo style, {where}.
Defaults come from the recipe <arch>_{rscale} in trainer/recipes.json, adapted to the device count (per-device
batch kept, lr linear in the batch); arguments given win.

  --data_path=DIR        ImageNet-style folder (train/, val/) or tiny-imagenet-200 (required unless --dummy)
  --dummy                synthetic data instead of --data_path
  --arch=NAME            model (default resnet50; shufflenet_v2_x1_0 runs shufflenet_v2_x1_0_npu)
  --batch_size=N         GLOBAL batch (default: the recipe's)
  --epochs=N             epochs (default: the recipe's); --train_epochs=N is the same
  --lr=X                 peak learning rate (default: the recipe's, scaled linearly when the batch differs);
                         --learning_rate=X is the same
  --device=KIND          auto | npu | cuda | cpu (default auto)
{scale_args}
  --workers=N            data loading workers per node (default: the recipe's)
  --precision=P          O2 | O1 | fp32 (default: the recipe's opt level; fp32 without a recipe)
  --resume=auto|PATH     continue a run (auto: the newest checkpoint in --output_dir)
  --output_dir=DIR       default test/output/${{ASCEND_DEVICE_ID:-0}}; an earlier run there is moved aside{extra}
  --baseline=TABLE       check the result: published (baselines/published.json, today's figures),
                         published-2023 (baselines/published_2023.json) or a JSON / CSV file
  --acc_tolerance=X      Acc@1 points allowed below the baseline (default 1.0)
  --fps_ratio=X          fraction of the baseline FPS required (default 0.9)
  -- ARGS                passed to main.py unchanged (e.g. -- --seed 60 --port 29688)

ModelZoo's script arguments (docs/MODELZOO.md "ModelZoo's script arguments -> what runs here"):
  --hf32 | --fp32        ALLOW_HF32=True | ALLOW_FP32=True for the ranks, float32 training (not both)
  --precision_mode=M     allow_mix_precision, amp, force_fp16 -> O2; allow_fp32_to_fp16 -> O1;
                         must_keep_origin_dtype -> fp32
  --profiling=TYPE       TORCH | CANN | GE | True: main.py --profile-steps over 2 steps from $PROFILE_START_STEP
                         (default 10); False: off
  --over_dump=, --data_dump_flag=, --data_dump_step=, --autotune=
                         accepted (True/False); a note says what to run instead
  --ckpt_path=PATH       initial weights (main.py --pretrained FILE; a folder: its checkpoint.pth.tar)
  --more_path1=DIR       accepted, unused (a note says so)""".format(
        script=script, scale_args=scale_args, extra=extra,
        rscale="8p" if scale in NODE_SCALES else scale,
        what="Accuracy run" if mode == "full" else "Performance (FPS) run",
        where="on one device" if scale == "1p" else (
            "one process per device (the guides' shell loop)" if scale == "8p" else
            "one driver per node, one process per device of the node"))


# ---------------------------------------------------------------- arguments


class Args:
    def __init__(self):
        for k in VALUE_KEYS:
            setattr(self, k, None)
        self.dummy = False
        self.passthrough = []


def parse(argv, mode, scale, script):
    a = Args()
    argv = list(argv)
    while argv:
        arg = argv.pop(0)
        if arg == "--":
            a.passthrough = argv
            break
        if arg == "--dummy":
            a.dummy = True
            continue
        if arg.startswith("--dummy="):
            raise UsageError("--dummy takes no value")
        if arg in ("--hf32", "--fp32"):  # ModelZoo's bare switches
            arg += "=True"
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else (arg, "", "")
        if not arg.startswith("--") or key not in VALUE_KEYS:
            raise UsageError("unknown argument '{}' for {} (see --help; main.py flags go after --)".format(
                "--" + key if eq else arg, script))
        if not eq or not value:
            raise UsageError("--{0} needs a value: --{0}=...".format(key))
        if key in ("world_size", "node_rank", "master_addr") and scale not in NODE_SCALES:
            raise UsageError("--{} is for train_full_16p.sh, train_performance_16p.sh and train_cluster.sh; {} runs "
                             "on one node".format(key, script))
        if key in ("rank_size", "device_list") and scale == "1p":
            raise UsageError("--{} is for the 8p, 16p and cluster scripts; {} runs one process (pick its device with "
                             "--device_id=N)".format(key, script))
        if key == "steps" and mode != "performance":
            raise UsageError("--steps is for the performance scripts; to shorten a full run pass -- "
                             "--max-steps-per-epoch N")
        setattr(a, key, value)
    return a


def whole(name, value, minimum):
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]+", value):
        raise UsageError("--{} must be a whole number, got '{}'".format(name, value))
    if int(value) < minimum:
        raise UsageError("--{} must be at least {}, got {}".format(name, minimum, int(value)))
    return int(value)


def non_negative(name, value):
    if value is None:
        return None
    if not re.fullmatch(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", value):
        raise UsageError("--{} must be a non-negative number, got '{}'".format(name, value))
    return float(value)


def check_passthrough(tokens, mode, script):
    """main.py flags after --: those the driver sets are refused; returns a --port given there (or None)."""
    from trainer.config import build_parser
    actions = [a for a in build_parser()._actions if a.dest in OWNED]
    longs = [(o, a) for a in actions for o in a.option_strings if o.startswith("--")]
    shorts = {o for a in actions for o in a.option_strings if not o.startswith("--")}
    port = None
    for i, tok in enumerate(tokens):
        if tok.startswith("--") and len(tok) > 2:
            name = tok.split("=", 1)[0]
            for option, _ in longs:
                if option.startswith(name):
                    raise UsageError("'{}' after --: {} sets {} itself (use its --key=value arguments, see "
                                     "--help)".format(tok, script, option))
            if mode == "performance" and len(name) >= 4 and "--max-steps-per-epoch".startswith(name):
                raise UsageError("'{}' after --: the performance scripts set --max-steps-per-epoch (use "
                                 "--steps=N)".format(tok))
            if name == "--port":
                port = tok.split("=", 1)[1] if "=" in tok else (tokens[i + 1] if i + 1 < len(tokens) else "")
        elif re.match(r"-[a-zA-Z]", tok) and tok[:2] in shorts:
            raise UsageError("'{}' after --: {} sets {} itself (use its --key=value arguments, see --help)".format(
                tok, script, tok[:2]))
    return port


# ---------------------------------------------------------------- the plan of the run


class Plan:
    """Everything the driver decided before it starts a process."""


def within(path, folder):
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def resolve(a, mode, scale, script, env):
    """The driver's plan from its arguments ``a`` (``parse``'s), in the order a user's mistakes are answered: the
    values given, the ranks and devices, the run's values (recipe or main.py's defaults), the baseline, the output
    folder."""
    p = Plan()
    p.mode, p.scale, p.script, p.notes = mode, scale, script, []
    given = _given(a, p, mode, script, env)
    _ranks(a, p, scale, env, given)
    _values(a, p, mode, scale, env, given)
    p.baseline = a.baseline  # checked now, not after hours of training
    p.acc_tolerance, p.fps_ratio = a.acc_tolerance, a.fps_ratio
    if a.baseline:
        run_acceptance(["baseline", "--baseline", a.baseline, "--arch", p.network, "--rank-size", str(p.world),
                        "--mode", p.case_mode, "--precision", p.precision] + tolerances(p), usage=True)
    _output(a, p, scale, env)
    p.args = a
    return p


def _given(a, p, mode, script, env):
    """The values given, checked (torch-free: they are answered before torch is imported): a dict of the typed
    numbers and the --port passed to main.py; ``p`` takes the device and the precision asked."""
    if a.dummy and a.data_path:
        raise UsageError("give --data_path=DIR or --dummy, not both")
    if not a.dummy:
        if not a.data_path:
            raise UsageError("--data_path=DIR is required (an ImageNet-style folder or tiny-imagenet-200; or --dummy)")
        if not os.path.isdir(a.data_path):
            raise UsageError("--data_path '{}' is not a folder".format(a.data_path))
    given = dict(workers=whole("workers", a.workers, 0), steps=whole("steps", a.steps, 1))
    precision = {"o1": "O1", "o2": "O2", "fp32": "fp32"}.get((a.precision or "").lower()) if a.precision else None
    if a.precision and precision is None:
        raise UsageError("--precision must be O2, O1 or fp32, got '{}'".format(a.precision))
    p.precision_given = precision
    zooargs.apply(a, p, env)  # ModelZoo's arguments: --learning_rate, --train_epochs, --device_id on 8p, ...
    given.update(batch=whole("batch_size", a.batch_size, 1),
                 epochs=whole("epochs" if a.train_epochs is None else "train_epochs", a.epochs, 1),
                 device_id=whole("device_id", a.device_id, 0),
                 lr=non_negative("lr" if a.learning_rate is None else "learning_rate", a.lr))
    non_negative("acc_tolerance", a.acc_tolerance)
    non_negative("fps_ratio", a.fps_ratio)
    if (a.acc_tolerance or a.fps_ratio) and not a.baseline:
        raise UsageError("--acc_tolerance / --fps_ratio apply to a baseline check: add --baseline=published or "
                         "--baseline=FILE")
    from trainer.device_names import KINDS
    p.device = a.device or "auto"
    kinds = ("auto",) + KINDS
    if p.device not in kinds:
        raise UsageError("--device must be {} or {}, got '{}'".format(", ".join(kinds[:-1]), kinds[-1], p.device))
    if a.resume and a.resume != "auto" and not os.path.isfile(a.resume):
        raise UsageError("--resume '{}' is not a file (give a checkpoint file, or auto)".format(a.resume))
    given["port"] = check_passthrough(a.passthrough, mode, script)
    if a.profiling is not None and any(t.startswith("--profile-steps") for t in a.passthrough):
        raise UsageError("--profiling and -- --profile-steps both set the profiled steps: give one")
    return given


def _ranks(a, p, scale, env, given):
    """This node's ranks and devices, the job's size and rank numbers, the device of a 1p run, the port."""
    p.nodes, p.node_rank, p.master_addr, p.table = 1, 0, None, None
    device_id, port = given["device_id"], given["port"]
    if scale == "1p":
        p.ranks, p.devices = 1, None
        if device_id is None:
            device_id = whole("device_id (or ASCEND_DEVICE_ID)", env.get("ASCEND_DEVICE_ID") or "0", 0)
    else:
        p.devices = _devices(a, p, env, whole("rank_size", a.rank_size, 1))
        p.ranks = len(p.devices)
        if port is not None and not (re.fullmatch(r"[0-9]+", port) and 1 <= int(port) <= 65535):
            raise UsageError("--port '{}' after --: the ranks need one fixed port, 1-65535".format(port))
        if scale in NODE_SCALES:
            nodes(a, p, scale)
            if p.nodes > 1 and port is None:
                from trainer.job.placement import DEFAULT_PORT
                port = str(DEFAULT_PORT)  # every node must name the same port
    p.world = p.nodes * p.ranks
    p.rank_ids = tuple(p.node_rank * p.ranks + r for r in range(p.ranks))  # this node's ranks, slot by slot
    if p.table is not None:  # the table numbers the job's ranks, and its server of rank 0 is the master
        p.world, p.rank_ids, p.master_addr = p.table["world_size"], p.table["ranks"], p.table["master"]
        if p.table["servers"] > 1 and port is None:
            from trainer.job.placement import DEFAULT_PORT
            port = env.get("MASTER_PORT") or str(DEFAULT_PORT)  # every server must name the same port
    p.device_id, p.port = device_id, port


def _devices(a, p, env, rank_size):
    """The devices of this node's ranks: --device_list, else this host's in RANK_TABLE_FILE (``p.table``), else
    0..--rank_size-1 (8 by default)."""
    if a.device_list:
        from trainer.config import parse_device_list
        try:
            devices = parse_device_list(a.device_list)
        except Exception as exc:  # argparse.ArgumentTypeError: its message is the one line
            raise UsageError(str(exc).replace("--device-list", "--device_list"))
        if rank_size is not None and rank_size != len(devices):
            raise UsageError("--rank_size={} but --device_list={} names {} device(s)".format(
                rank_size, a.device_list, len(devices)))
        return devices
    if env.get("RANK_TABLE_FILE"):  # the job's rank table: this host's devices, in its order
        from trainer.job.clusters import host_ranks
        from trainer.job.rendezvous import is_local_address
        p.table = host_ranks(env, is_local_address)  # a job of several servers: one driver on each
        if rank_size is not None and rank_size != len(p.table["devices"]):
            raise UsageError("--rank_size={} but RANK_TABLE_FILE '{}' lists {} device(s) for this host ({}): "
                             "give --rank_size={}, or leave it out".format(
                                 rank_size, env["RANK_TABLE_FILE"], len(p.table["devices"]),
                                 ",".join(map(str, p.table["devices"])), len(p.table["devices"])))
        return p.table["devices"]
    return tuple(range(rank_size or 8))


def _values(a, p, mode, scale, env, given):
    """The network, the recipe (``<network>_<scale>``, the 8p one for several nodes) and the run's values, scaled
    to the job, or main.py's defaults with the values given; the performance steps and the profiled window."""
    from trainer import recipes  # torch-free
    batch, lr, workers, epochs = given["batch"], given["lr"], given["workers"], given["epochs"]
    arch = a.arch or "resnet50"
    p.network = arch[:-len("_npu")] if arch.endswith("_npu") else arch
    p.model = p.network + "_npu" if p.network in NPU_NETWORKS else arch
    name = "{}_{}".format(p.network, "8p" if scale in NODE_SCALES else scale)  # 16p / cluster: the 8p recipe
    if mode == "performance" and epochs is None:
        epochs = 1
    if name in recipes.names():
        p.recipe = name
        recipe = recipes.get(name)
        p.model = recipe.get("arch", p.model)
        values, notes = recipes.scale(name, p.world, {k: v for k, v in (("batch_size", batch), ("lr", lr),
                                                                         ("workers", workers), ("epochs", epochs))
                                                      if v is not None})
        p.notes += notes
        p.batch, p.lr, p.epochs = values["batch_size"], values["lr"], values["epochs"]
        p.workers = values.get("workers")
        if p.workers is not None and workers is None and p.nodes > 1:
            p.workers //= p.nodes  # the recipe's workers are per node: the node's share of them
        p.warmup = values["warmup_epochs"] if values["warmup_epochs"] != recipe.get("warmup_epochs", 0) else None
        p.precision = p.precision_given or recipe.get("opt_level", "O2")
    else:
        from trainer.config import build_parser
        defaults = build_parser()
        p.recipe, p.warmup = None, None
        p.batch = batch or defaults.get_default("batch_size")
        p.lr = lr if lr is not None else defaults.get_default("lr")
        p.epochs = epochs or defaults.get_default("epochs")
        p.workers = workers if workers is not None else defaults.get_default("workers")
        p.precision = p.precision_given or "fp32"
        p.notes.append("no recipe {} in trainer/recipes.json: main.py's defaults plus the arguments given".format(name))
    if p.batch % p.world:
        raise UsageError("--batch_size {} (global) does not divide over {} ranks: use a multiple of {}".format(
            p.batch, p.world, p.world))
    p.steps = (given["steps"] or PERF_STEPS) if mode == "performance" else None
    window = zooargs.profile_window(a.profiling, env, p.steps * p.epochs if p.steps else None)
    if window:
        p.extra += ["--profile-steps", "{}:{}".format(*window)]
        p.notes.append("--profiling={}: main.py's step profiler records global steps {}..{} into the output "
                       "folder (ModelZoo's profile types share it)".format(a.profiling, window[0], window[1] - 1))
    p.case_mode = "perf" if mode == "performance" else "acc"


def _output(a, p, scale, env):
    """The output folder and what becomes of what it holds: keep it (a resume), move it aside, or refuse."""
    if a.output_dir:
        p.output_dir = os.path.realpath(a.output_dir)
    else:
        p.output_dir = os.path.join(ROOT, "test", "output",
                                    str(p.device_id if scale == "1p" else env.get("ASCEND_DEVICE_ID") or 0))
    if os.path.exists(p.output_dir) and not os.path.isdir(p.output_dir):
        raise UsageError("--output_dir '{}' is a file, not a folder".format(p.output_dir))
    p.output_action = "new"
    from trainer.record import lock
    busy = lock.holder(p.output_dir) if os.path.isdir(p.output_dir) else None
    if busy:
        raise UsageError("--output_dir '{}' is in use by {}: wait for it to finish or stop it, or choose another "
                         "--output_dir".format(p.output_dir, busy))
    if os.path.isdir(p.output_dir) and os.listdir(p.output_dir):
        if a.resume and (a.resume == "auto" or within(os.path.realpath(a.resume), p.output_dir)):
            p.output_action = "keep"
        else:
            for guard in ["/", env.get("HOME") or "/", ROOT, os.getcwd()] + ([a.data_path] if a.data_path else []):
                if within(os.path.realpath(guard), p.output_dir):
                    raise UsageError("--output_dir '{}' holds files and contains {}: it cannot be moved aside; "
                                     "choose an empty or new folder".format(p.output_dir, guard))
            p.output_action = "move"


def nodes(a, p, scale):
    """--world_size (nodes), --node_rank, --master_addr of the 16p and cluster scripts."""
    if scale == "cluster" and a.world_size is None:
        raise UsageError("--world_size=N (the number of nodes) is required for train_cluster.sh")
    p.nodes = whole("world_size", a.world_size, 1) or 2
    p.node_rank = whole("node_rank", a.node_rank, 0) or 0
    if p.node_rank >= p.nodes:
        raise UsageError("--node_rank={} must be below --world_size={} (nodes 0..{})".format(
            p.node_rank, p.nodes, p.nodes - 1))
    if p.nodes > 1 and not a.master_addr:
        raise UsageError("--master_addr=IP (node 0's address, the same on every node) is required with {} "
                         "nodes".format(p.nodes))
    if a.master_addr and not re.fullmatch(r"[A-Za-z0-9.:_-]+", a.master_addr):
        raise UsageError("--master_addr '{}' is not a host name or address".format(a.master_addr))
    p.master_addr = a.master_addr or "127.0.0.1"


def tolerances(p):
    out = []
    if p.acc_tolerance is not None:
        out += ["--acc-tolerance", p.acc_tolerance]
    if p.fps_ratio is not None:
        out += ["--fps-ratio", p.fps_ratio]
    return out


def run_acceptance(argv, usage=False):
    """modelzoo/acceptance.py in this process; its errors become ours (exit 2, or its own code)."""
    try:
        return acceptance.main(argv)
    except acceptance.AcceptanceError as exc:
        if usage:
            raise UsageError(str(exc).splitlines()[0])
        sys.stderr.write("error: {}\n".format(str(exc).splitlines()[0]))
        return exc.exit_code


def precision_flags(p):
    """main.py flags for O1 / O2 / fp32: apex at that level where the device has it, else native autocast."""
    from trainer.device import Device, apex_amp
    if p.precision == "fp32":
        return []
    if p.device != "auto" and not Device.of(p.device).supports_apex:
        return ["--amp", "--opt-level", p.precision]  # main.py's --amp decides the dtype there
    kind_cls = Device.of(Device.resolve_kind(p.device))
    if kind_cls.supports_apex and apex_amp() is not None:
        return ["--amp", "--amp-impl", "apex", "--opt-level", p.precision]
    if kind_cls.supports_apex:
        p.notes.append("precision {}: apex is not installed, so mixed precision is native autocast with a loss "
                       "scaler".format(p.precision))
    return ["--amp", "--opt-level", p.precision]


def command(p):
    cmd = [sys.executable, "-u", os.path.join(ROOT, "main.py")]
    cmd += ["--dummy"] if p.args.dummy else [p.args.data_path]
    cmd += ["-a", p.model, "-b", str(p.batch), "--lr", "{:g}".format(p.lr), "--epochs", str(p.epochs)]
    if p.workers is not None:
        cmd += ["-j", str(p.workers)]
    cmd += ["--device", p.device, "--output-dir", p.output_dir]
    if p.recipe:
        cmd += ["--recipe", p.recipe]
    else:  # main.py's own defaults, as the note says (not ModelZoo's ResNet50 entry that RANK_SIZE would pick)
        cmd += ["--modelzoo", "off"]
    if p.warmup is not None:
        cmd += ["--warmup-epochs", "{:g}".format(p.warmup)]
    if p.steps:
        cmd += ["--max-steps-per-epoch", str(p.steps), "--no-validate"]
    if p.args.resume:
        cmd += ["--resume", p.args.resume]
    cmd += precision_flags(p)
    from trainer.device import Device
    if p.scale == "1p":
        if Device.of(p.device).numbered:
            cmd += ["--gpu", str(p.device_id)]
    else:
        cmd += ["--device-list", ",".join(str(d) for d in p.devices)]
    if p.nodes > 1:  # the guide's loop on each node: LOCAL_RANK per process, node rank x processes + local rank
        cmd += ["--multiprocessing-distributed", "--world-size", str(p.nodes), "--rank", str(p.node_rank)]
    return cmd + p.extra + list(p.args.passthrough)
