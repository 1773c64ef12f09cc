"""Recipes as data (``trainer/recipes.json``) and the one rule that adapts a recipe to a device count, used by
``main.py --recipe`` and the ModelZoo drivers alike (``python3 -m trainer.recipes list | show NAME | get NAME KEY``).

``scale``, for a recipe written for ``rank_size`` devices run on N: the per-device batch is kept, the LR is linear in
the global batch, workers per node in proportion, the warm-up the recipe's unless the run is shorter (then the same
fraction). Recipes with ``"rule": "ffcv"`` (and ``fast``) are then placed for the run's epochs as FFCV's own
configurations are (``ffcv_rule``: LR peak, resolution ramp, sizes for a --train-crop-size given), and
``device_rule`` keeps --amp / --channels-last where the device gains from them. The rules, with FFCV's figures:
docs/MODELZOO.md, "Defaults: recipes as data" and "Short schedules". Values given explicitly always win.
"""
import fnmatch
import json
import math
import os
import sys

from trainer import device_names, errors
from trainer.options import parse_loss_scale
from trainer.errors import UsageError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes.json")
# recipe keys that are not main.py flags
META = ("rank_size", "source", "rule", "expect", "base")
# --recipe fast with a --train-crop-size below this: validation at the training size (ffcv_rule)
SCALED_TEST_FROM = 128
# FFCV's test size over its last training size: validation.resolution 256 after resolution.max_res 192 in every
# configuration (rn50_configs, rn18_configs); a --train-crop-size C given validates at round(C x this) (ffcv_rule)
FFCV_TEST_RATIO = 256.0 / 192.0
# what the digits showed of the linear LR rule at batches below FFCV's (scaled_lr; docs/BENCHMARKS.md, "The LR at
# batches FFCV did not publish")
BELOW_MEASURED = ("on the digits it trained better than pytorch/examples' 0.1 and the square-root rule at batches "
                  "32 and 64, and a lower --lr better still at 32, 64 and 256 (docs/BENCHMARKS.md, \"The LR at "
                  "batches FFCV did not publish\")")
ABOVE_UNMEASURED = ("not measured here; plain SGD loses accuracy at batches of roughly 8k and more, where --optimizer "
                    "lars is the choice")  # the linear LR rule at batches above FFCV's (scaled_lr)
# the resolution schedule's sizes: trainer/data/resolution.py's MULTIPLE, repeated here because importing
# trainer.data imports torch and this module is read before torch is (modelzoo/plan.py)
MULTIPLE = 32
RAMP = ("min_res", "max_res", "start_ramp", "end_ramp")  # the resolution schedule's keys


def _table():
    with open(PATH) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def names():
    return sorted(_table())


def get(name):
    table = _table()
    if name not in table:
        raise UsageError("unknown recipe '{}' (known: {})".format(name, ", ".join(sorted(table))))
    return dict(table[name])


def scale(name, ranks, explicit=None):
    """(values, notes): the recipe's batch_size, lr, workers, warmup_epochs, epochs for ``ranks`` processes;
    ``explicit``: values given, which win."""
    r, given = get(name), {k: v for k, v in (explicit or {}).items() if v is not None}
    r_ranks = int(r.get("rank_size", 1))
    notes = []
    batch = given.get("batch_size")
    if batch is None:
        if r["batch_size"] * ranks % r_ranks:
            raise UsageError("recipe {} has batch {} for {} device(s), which does not scale to {}: give the batch "
                             "size".format(name, r["batch_size"], r_ranks, ranks))
        batch = r["batch_size"] * ranks // r_ranks
        if ranks != r_ranks:
            notes.append("batch {}: recipe {} has {} for {} device(s); the per-device batch is kept".format(
                batch, name, r["batch_size"], r_ranks))
    lr = given.get("lr")
    if lr is None:
        lr, note = scaled_lr(name, batch)
        if note:
            notes.append(note)
    workers = given.get("workers")
    if workers is None and "workers" in r:
        workers = r["workers"] * ranks // r_ranks
    epochs = given.get("epochs", r["epochs"])
    warmup = given.get("warmup_epochs")
    r_warmup = r.get("warmup_epochs", 0)
    if warmup is None:
        warmup = r_warmup
        if r_warmup > epochs:
            warmup = float("{:.6g}".format(r_warmup * epochs / float(r["epochs"])))
            notes.append("warm-up {:g} epochs: the recipe's {:g} of {} epochs, in proportion to {} epoch(s)".format(
                warmup, r_warmup, r["epochs"], epochs))
    values = {"batch_size": batch, "lr": lr, "epochs": epochs, "warmup_epochs": warmup}
    if workers is not None:
        values["workers"] = workers
    return values, notes


def published_batches(name):
    """(lowest, highest) global batch the source of a rule recipe published an LR for (FFCV: 1024, 4096), or None."""
    rule = get(name).get("rule")
    if rule is None:
        return None
    batches = sorted(r["batch_size"] for r in _table().values() if r.get("rule") == rule and "batch_size" in r)
    return batches[0], batches[-1]


def scaled_lr(name, batch):
    """(lr, note or None): ``name``'s LR at global ``batch``, linear in the batch (Goyal et al.; FFCV's own pair is
    0.5 at 1024, 1.7 at 4096), and the note naming the rule and what was measured of it."""
    r = get(name)
    if batch == r["batch_size"]:
        return r["lr"], None
    lr = float("{:.6g}".format(r["lr"] * batch / r["batch_size"]))
    note = "lr {:g}: recipe {} has {:g} for batch {}, scaled linearly to batch {}".format(
        lr, name, r["lr"], r["batch_size"], batch)
    published = published_batches(name)
    if published is None or published[0] <= batch <= published[1]:
        return lr, note
    side, what = ("below", BELOW_MEASURED) if batch < published[0] else ("above", ABOVE_UNMEASURED)
    return lr, note + " (the linear rule {} the batches FFCV published, {} to {}: {})".format(
        side, published[0], published[1], what)


def base_of(name, arch):
    """The recipe whose values ``name`` takes for ``arch``: itself, or its first ``base`` entry matching ``arch``."""
    bases = get(name).get("base")
    if not bases:
        return name
    for base, patterns in bases.items():
        if any(fnmatch.fnmatchcase(arch, pattern) for pattern in patterns):
            return base
    raise UsageError("recipe {} has no values for -a {}".format(name, arch))


def ffcv_ramp(epochs):
    """(start_ramp, end_ramp) for ``epochs`` as FFCV places them (round(3E/4) - 1, round(7E/8) - 1), at most
    E - 2 and E - 1 so the last epoch trains at the final size; None for one epoch (no ramp)."""
    def rounded(x):
        return max(0, int(math.floor(x + 0.5)))
    if epochs < 2:
        return None
    return (max(0, min(rounded(0.75 * epochs) - 1, epochs - 2)),
            max(0, min(rounded(0.875 * epochs) - 1, epochs - 1)))


def ffcv_peak(epochs, peak=2.0):
    """The LR peak of a run of ``epochs``: ``peak`` (FFCV's 2), or an eighth of the run when that is sooner."""
    return float(min(peak, epochs / 8.0))


def ffcv_sizes(crop, recipe):
    """(min_res, max_res) of the ramp up to a --train-crop-size ``crop``: FFCV's min_res / max_res of it, down to a
    multiple of 32; None where that leaves no ramp."""
    low = int(crop * recipe["min_res"] // recipe["max_res"]) // MULTIPLE * MULTIPLE
    if crop % MULTIPLE or low < MULTIPLE or low >= crop:
        return None
    return low, crop


def ffcv_rule(recipe, values, given):
    """``values`` (a rule-ffcv recipe's, scaled) placed for the run: LR peak, ramp, sizes for a crop size given."""
    values = dict(values)
    epochs = values["epochs"]
    if epochs != recipe["epochs"]:
        values["lr_peak_epoch"] = ffcv_peak(epochs, recipe.get("lr_peak_epoch", 2.0))
        ramp = ffcv_ramp(epochs)
        if ramp is None:  # one epoch: no ramp, the last size throughout
            values["train_crop_size"] = values["max_res"]
            values = {k: v for k, v in values.items() if k not in RAMP}
        else:
            values["start_ramp"], values["end_ramp"] = ramp
    if "train_crop_size" in given:
        crop = int(given["train_crop_size"])
        sizes = ffcv_sizes(crop, recipe) if "start_ramp" in values else None
        if sizes is None:
            values = {k: v for k, v in values.items() if k not in RAMP}
        else:  # the ramp scaled to end at the size given (trainer/config.py keeps a recipe's schedule ending there)
            values["min_res"], values["max_res"] = sizes
        # FFCV's higher test size scaled with the training size; below SCALED_TEST_FROM px (a stride-32 network's
        # last map under 4 x 4) the test size is the training size: on the digits at 32 px a model validated at
        # 37 px scored 62.4 % Acc@1, at 32 px 91.4 % (docs/BENCHMARKS.md, "Why 96 px")
        values["val_crop_size"] = int(math.floor(crop * FFCV_TEST_RATIO + 0.5)) if crop >= SCALED_TEST_FROM else crop
    return values


def device_rule(values, kind, given=()):
    """A recipe's --amp kept on NPU and CUDA, its --channels-last on CUDA. Returns (values, notes)."""
    values, notes = dict(values), []
    if kind not in device_names.AMP_KINDS and values.pop("amp", None) and "amp" not in given:
        notes.append("the recipe's --amp is for NPU and CUDA devices: this {} run trains in float32 (--amp asks "
                     "for it)".format(kind or "device's"))
    if kind not in device_names.CHANNELS_LAST_KINDS:
        values.pop("channels_last", None)
    return values, notes


def _flag_text(dest, value):
    flag = {"batch_size": "-b", "arch": "-a"}.get(dest, "--" + dest.replace("_", "-"))
    if value is True:
        return flag
    return "{} {}".format(flag, "{:g}".format(value) if isinstance(value, float) else value)


def flag_defaults(name, ranks, explicit=None, ns=None):
    """(main.py defaults from the recipe scaled to ``ranks``, by dest; notes). ``explicit``: the flags given, which
    win; ``ns``: the parsed flags as they stand (-a, --device)."""
    given = dict(explicit or {})
    recipe = get(name)
    source = base_of(name, getattr(ns, "arch", None) or recipe.get("arch", "")) if recipe.get("base") else name
    values = {k: v for k, v in get(source).items() if k not in META}
    scaled, notes = scale(source, ranks, given)
    values.update(scaled)
    if source != name:
        values.pop("arch", None)  # fast: the network is the run's
    if values.get("blurpool") and "blurpool" not in given and ns is not None and \
            not _blurpool_applies(given.get("arch") or values.get("arch") or ns.arch, ns):  # -a given wins
        values.pop("blurpool")
        notes.append("the recipe's --blurpool is for ResNets: -a {} trains without it".format(ns.arch))
    if recipe.get("rule") == "ffcv":
        values = ffcv_rule(get(source), values, given)
    if "amp" in values or "channels_last" in values:
        values, more = device_rule(values, _device_kind(ns), given)
        notes.extend(more)
    if recipe.get("rule") or recipe.get("expect"):  # one line naming what the recipe set
        shown = " ".join(_flag_text(k, v) for k, v in sorted(values.items()) if k not in given and v is not False)
        notes.insert(0, "recipe {}{} set: {}; flags given win".format(
            name, " (from {})".format(source) if source != name else "", shown))
    if "loss_scale" in values:
        values["loss_scale"] = parse_loss_scale(str(values["loss_scale"]))
    return values, notes


def _blurpool_applies(arch, ns):
    import models
    return models.blurpool_applies(models.resolve(arch, getattr(ns, "model_impl", "auto")))


def _device_kind(ns):
    """The device kind ``--device`` (and ``--no-accel``) resolve to, or None where it cannot be told (the plan then
    says why). A kind asked by name is taken as asked: only ``auto`` probes the machine."""
    if ns is None:
        return None
    asked = device_names.asked_kind(getattr(ns, "device", "auto"), getattr(ns, "no_accel", False))
    if asked != "auto":
        return asked
    from trainer.device import Device
    try:
        return Device.resolve_kind(asked)
    except UsageError:
        return None


def expectation(name, arch, epochs):
    """(recipe name, its "expect" entry) for ``arch`` and ``epochs`` trained with --recipe ``name`` (for ``fast``:
    the named recipe of its rule, network and epochs); UsageError where no published figure applies."""
    recipe = get(name)
    if recipe.get("base"):
        table = _table()
        for other, r in sorted(table.items()):
            if (r.get("expect") and r.get("rule") == recipe.get("rule") and r.get("arch") == arch
                    and r.get("epochs") == epochs):
                return other, dict(r["expect"])
        raise UsageError("recipe {} has no published result for -a {} at {} epochs (FFCV published {}): give a "
                         "baseline table".format(name, arch, epochs, ", ".join(
                             "{} ({} epochs)".format(k, v["epochs"]) for k, v in sorted(table.items())
                             if v.get("expect") and v.get("rule") == recipe.get("rule"))))
    if not recipe.get("expect"):
        raise UsageError("recipe {} records no published result to judge a run against".format(name))
    if recipe.get("arch") != arch or recipe.get("epochs") != epochs:
        raise UsageError("recipe {}'s published result is for -a {} and {} epochs; this run trained -a {} for {} "
                         "epochs".format(name, recipe.get("arch"), recipe.get("epochs"), arch, epochs))
    return name, dict(recipe["expect"])


def main(argv):
    if len(argv) >= 1 and argv[0] == "list":
        print("\n".join(names()))
        return 0
    if len(argv) == 2 and argv[0] == "show":
        for k, v in get(argv[1]).items():
            print("{}={}".format(k, v))
        return 0
    if len(argv) == 3 and argv[0] == "get":
        recipe = get(argv[1])
        if argv[2] not in recipe:
            raise UsageError("recipe '{}' has no key '{}'".format(argv[1], argv[2]))
        print(recipe[argv[2]])
        return 0
    raise UsageError("usage: python3 -m trainer.recipes list | show NAME | get NAME KEY")


if __name__ == "__main__":
    sys.exit(errors.run(main, sys.argv[1:]))
