"""Ascend ModelZoo's two entries as main.py stands in for them (``--modelzoo``): ResNet50_ID4149's ``main.py`` and
Shufflenetv2's ``8p_main_med.py``, whose scripts type those flags, export RANK_SIZE and grep the logs. Their published
numbers were trained with their parsers' defaults (``DEFAULTS``: resnet50's lr_cosine_policy, warm-up lr x (e+1)/8;
shufflenetv2's adjust_learning_rate, lr x (e+1)/(N+1)), which differ from pytorch/examples'.

A run stands in for an entry when ``--modelzoo`` names it, or (``auto``, no ``--recipe``) when started as
``8p_main_med.py`` (shufflenetv2) or under a ModelZoo script (RANK_SIZE: resnet50): the entry's defaults fill the
flags not given, one note lists them, and the log adds the lines its scripts grep (record/metrics.py ``ZooLines``).
"""
import os

from trainer.errors import UsageError, counted

ENTRIES = ("resnet50", "shufflenetv2")
SHUFFLENET_ENTRY = "8p_main_med.py"  # the name Shufflenetv2's scripts start

# argparse destinations -> the entry parser's defaults where they differ from ours
DEFAULTS = {
    "resnet50": {"label_smoothing": 0.1, "mz_warmup": 8, "lr_schedule": "cosine", "loss_scale": 1024.0},
    "shufflenetv2": {"mz_warm_up_epochs": 0, "lr_schedule": "cosine", "eval_freq": 5, "loss_scale": 64.0},
}
SAID = {  # how the note says each default
    "label_smoothing": "label smoothing {:g}", "mz_warmup": "--warmup {} (lr x (epoch+1)/{} in warm-up epochs)",
    "mz_warm_up_epochs": "--warm_up_epochs {}", "lr_schedule": "{} schedule moved once per epoch",
    "eval_freq": "--eval-freq {}", "loss_scale": "loss scale {:g} (float16)",
}


def entry(choice, recipe, env, prog):
    """The entry a run stands in for (``resnet50`` / ``shufflenetv2``) or None."""
    if choice in ENTRIES:
        return choice
    if choice != "auto" or recipe is not None:
        return None
    if os.path.basename(prog or "") == SHUFFLENET_ENTRY:
        return "shufflenetv2"
    return "resnet50" if "RANK_SIZE" in env else None


def defaults(name, explicit):
    """(argparse defaults of entry ``name`` for the flags not in ``explicit``, the note naming them)."""
    values = {k: v for k, v in DEFAULTS[name].items() if k not in explicit}
    if explicit & {"mz_warmup", "mz_warm_up_epochs", "warmup_epochs"}:  # a warm-up given: the entry's default goes
        values = {k: v for k, v in values.items() if k not in ("mz_warmup", "mz_warm_up_epochs")}
    if not values:
        return values, None
    said = [SAID[k].format(v, v) if k == "mz_warmup" else SAID[k].format(v) for k, v in values.items()]
    why = "started as {}".format(SHUFFLENET_ENTRY) if name == "shufflenetv2" else "a ModelZoo script's run"
    return values, ("ModelZoo's {} entry ({}; --modelzoo off for pytorch/examples' defaults): {}".format(
        name, why, ", ".join(said)))


def warmup(ns, explicit):
    """(warm-up epochs, lr step unit, offset, lr schedule) from --warmup / --warm_up_epochs (their entry's per-epoch
    warm-up and cosine; flags given win), or None."""
    if ns.mz_warmup is not None and ns.mz_warm_up_epochs is not None:
        if "mz_warmup" in explicit and "mz_warm_up_epochs" in explicit:
            raise UsageError("--warmup and --warm_up_epochs are two entries' warm-ups: give one")
        if "mz_warm_up_epochs" in explicit:
            ns.mz_warmup = None
        else:
            ns.mz_warm_up_epochs = None
    value, offset = (ns.mz_warmup, 0) if ns.mz_warmup is not None else (ns.mz_warm_up_epochs, 1)
    if value is None:
        return None
    flag = "--warmup" if offset == 0 else "--warm_up_epochs"
    if "warmup_epochs" in explicit and ns.warmup_epochs != value:
        raise UsageError("{} {} and --warmup-epochs {:g} disagree: give one".format(flag, value, ns.warmup_epochs))
    unit = ns.lr_step_unit if "lr_step_unit" in explicit else "epoch"
    schedule = ns.lr_schedule if "lr_schedule" in explicit else "cosine"
    return float(value), unit, offset, schedule


def check_skip_steps(skip_steps, steps):
    """--skip_steps must leave steps of an epoch to time."""
    if skip_steps is not None and skip_steps >= steps:
        raise UsageError("--skip_steps {} leaves no step of an epoch of {} to time: use fewer (below {})".format(
            skip_steps, counted(steps, "step"), steps))
