"""ModelZoo's script arguments at our drivers (test/*.sh), each with its ModelZoo meaning: what it changes in the
main.py command line, in the ranks' environment, or which note it prints instead. Pure functions: modelzoo/plan.py
calls ``apply`` after its own argument checks. docs/MODELZOO.md "ModelZoo's script arguments -> what runs
here" lists them.
"""
import os

from trainer.errors import UsageError

# ModelZoo's --key=value switches (their scripts write True/False)
SWITCHES = ("over_dump", "data_dump_flag", "autotune", "hf32", "fp32")
# --precision_mode values (Ascend's precision modes, and ShuffleNetV2's "amp") -> our --precision
PRECISION_MODES = (("allow_mix_precision", "O2"), ("amp", "O2"), ("force_fp16", "O2"),
                   ("allow_fp32_to_fp16", "O1"), ("must_keep_origin_dtype", "fp32"))
PROFILE_TYPES = ("TORCH", "CANN", "GE", "True")
PROFILE_START_STEP = 10  # ModelZoo's main.py: Profile(start_step=int(os.getenv('PROFILE_START_STEP', 10)))
PROFILE_STEPS = 2
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "none")


def switch(name, value):
    """True / False (any case), 1 / 0: ModelZoo's switch values."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise UsageError("--{} takes True or False, got '{}'".format(name, value))


def precision_of(mode):
    if mode is None:
        return None
    for name, ours in PRECISION_MODES:
        if mode == name:
            return ours
    raise UsageError("--precision_mode must be one of {}, got '{}'".format(
        ", ".join(n for n, _ in PRECISION_MODES), mode))


def profile_window(value, env, total_steps):
    """--profiling=TYPE -> (start, end) global steps for main.py --profile-steps, or None (False / none)."""
    if value is None or value.strip().lower() in FALSE:
        return None
    if value.upper() not in (t.upper() for t in PROFILE_TYPES):
        raise UsageError("--profiling must be one of {} or False, got '{}'".format(", ".join(PROFILE_TYPES), value))
    raw = env.get("PROFILE_START_STEP") or str(PROFILE_START_STEP)
    if not raw.isdigit():
        raise UsageError("PROFILE_START_STEP='{}' is not a whole number: export the first profiled step, or unset "
                         "it (10)".format(raw))
    start = int(raw)
    if total_steps is not None and start + PROFILE_STEPS > total_steps:
        start = max(0, total_steps - PROFILE_STEPS)  # a bounded (performance) run: the window fits in it
    return start, start + PROFILE_STEPS


def ckpt_file(path):
    """--ckpt_path: a weights / checkpoint file, or a folder holding checkpoint.pth.tar or model_best.pth.tar."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for name in ("checkpoint.pth.tar", "model_best.pth.tar"):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise UsageError("--ckpt_path '{}' is a folder without checkpoint.pth.tar or model_best.pth.tar: give the "
                         "weights file".format(path))
    raise UsageError("--ckpt_path '{}' does not exist (give a weights or checkpoint file)".format(path))


def apply(a, p, env):
    """ModelZoo's arguments of ``a`` (parsed --key=value) into the plan ``p``: p.precision_given, p.env (variables
    for the ranks), p.extra (main.py flags), p.notes. Runs before the recipe is applied."""
    p.env, p.extra = {}, []
    hf32, fp32 = switch("hf32", a.hf32), switch("fp32", a.fp32)
    env_hf32 = hf32 is None and (env.get("ALLOW_HF32") or "").strip().lower() not in FALSE + ("",)
    env_fp32 = fp32 is None and (env.get("ALLOW_FP32") or "").strip().lower() not in FALSE + ("",)
    if (hf32 or env_hf32) and (fp32 or env_fp32):
        raise UsageError("--hf32 and --fp32 (ALLOW_HF32 and ALLOW_FP32) cannot be set at the same time: give one")
    mode_precision = precision_of(a.precision_mode)
    if a.precision and mode_precision and a.precision.lower() != mode_precision.lower():
        raise UsageError("--precision={} and --precision_mode={} ({}) disagree: give one".format(
            a.precision, a.precision_mode, mode_precision))
    p.precision_given = p.precision_given or mode_precision
    if a.precision_mode:
        p.notes.append("--precision_mode={}: precision {}".format(a.precision_mode, mode_precision))
    for name, on, var, what in (("hf32", hf32, "ALLOW_HF32", "HF32 convolutions and matmuls allowed"),
                                ("fp32", fp32, "ALLOW_FP32", "HF32 off: plain float32")):
        if on is None:
            continue
        if not on:
            p.env[var] = None  # --hf32=False: the variable is removed for the ranks
            continue
        if p.precision_given and p.precision_given != "fp32":
            raise UsageError("--{} trains in float32 (ModelZoo's main.py turns amp off under {}), but the precision "
                             "asked is {}: drop one".format(name, var, p.precision_given))
        p.precision_given = "fp32"
        p.env[var] = "True"
        p.notes.append("--{}: {}=True for the ranks; float32 training, {} (main.py says what the device does "
                       "with it)".format(name, var, what))
    lr2 = a.learning_rate
    if lr2 is not None:
        if a.lr is not None and a.lr != lr2:
            raise UsageError("--lr={} and --learning_rate={} disagree: give one".format(a.lr, lr2))
        a.lr = lr2
    if a.train_epochs is not None:
        if a.epochs is not None and a.epochs != a.train_epochs:
            raise UsageError("--epochs={} and --train_epochs={} disagree: give one".format(a.epochs, a.train_epochs))
        a.epochs = a.train_epochs
    if a.device_id is not None and p.scale != "1p":
        p.notes.append("--device_id={} is ignored by {} (as ModelZoo's multi-device scripts do); the devices are "
                       "--device_list (default 0..rank_size-1)".format(a.device_id, p.script))
        a.device_id = None
    if switch("over_dump", a.over_dump):
        p.notes.append("--over_dump: no overflow dump here; float16 steps with inf/NaN gradients are skipped and "
                       "counted in summary.json (amp); to find the module that overflows run python3 -m "
                       "tools.compare_precision -a ARCH --target-amp")
    if a.data_dump_step is not None and not a.data_dump_step.isdigit():
        raise UsageError("--data_dump_step must be a whole number, got '{}'".format(a.data_dump_step))
    if switch("data_dump_flag", a.data_dump_flag):  # --data_dump_step alone: ModelZoo's default "10", no dump
        p.notes.append("--data_dump_flag/--data_dump_step: no operator data dump here; python3 -m "
                       "tools.compare_precision -a ARCH compares every module's outputs and gradients of a "
                       "training step against the CPU, python3 -m tools.op_report -a ARCH lists every operator "
                       "with its shapes")
    if switch("autotune", a.autotune):
        p.notes.append("--autotune=True has no effect here (an Ascend graph-compiler option; main.py runs eagerly "
                       "unless --compile)")
    if a.ckpt_path is not None:
        if a.resume:
            raise UsageError("--ckpt_path (initial weights) and --resume (continue a run) exclude each other: "
                             "give one")
        p.extra += ["--pretrained", os.path.abspath(ckpt_file(a.ckpt_path))]
        p.notes.append("--ckpt_path: the run starts from the weights in {} (main.py --pretrained FILE; to "
                       "continue a run with its optimizer and epoch use --resume=PATH)".format(p.extra[-1]))
    if a.more_path1 is not None:
        p.notes.append("--more_path1={} is not used: these models read only --data_path".format(a.more_path1))
