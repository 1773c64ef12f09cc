"""Recipes as data (``trainer/recipes.json``) and the one rule that adapts a recipe to a device count,
used by ``main.py --recipe`` and by the ModelZoo drivers alike.

    python3 -m trainer.recipes list | show NAME | get NAME KEY

The rule (``scale``), for a recipe written for ``rank_size`` devices run on N:
  batch    the recipe's per-device batch is kept: global batch = recipe batch x N / rank_size
  lr       linear in the global batch: recipe lr x batch / recipe batch (unchanged at the recipe's batch)
  workers  per node, in proportion: recipe workers x N / rank_size (the same number per process)
  warm-up  the recipe's epochs, unless a run is shorter than them: then the same fraction of the run
Values given explicitly always win; the rule fills in only what was not given.
"""
import json
import os
import sys

from trainer.cli import parse_loss_scale
from trainer.errors import UsageError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes.json")
# recipe keys that are not main.py flags
META = ("rank_size", "source")
SCALED = ("batch_size", "lr", "workers", "warmup_epochs", "epochs")


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
    """(values, notes): the recipe's batch_size, lr, workers, warmup_epochs and epochs for ``ranks``
    processes; ``explicit`` maps those keys to values given explicitly, which win."""
    r, given = get(name), dict(explicit or {})
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
        lr = r["lr"] if batch == r["batch_size"] else float("{:.6g}".format(r["lr"] * batch / r["batch_size"]))
        if batch != r["batch_size"]:
            notes.append("lr {:g}: recipe {} has {:g} for batch {}, scaled linearly to batch {}".format(
                lr, name, r["lr"], r["batch_size"], batch))
    workers = given.get("workers")
    if workers is None and "workers" in r:
        workers = r["workers"] * ranks // r_ranks
    epochs = given.get("epochs")
    if epochs is None:
        epochs = r["epochs"]
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


def flag_defaults(name, ranks, explicit=None):
    """(main.py defaults from the recipe scaled to ``ranks``, notes); keys are argparse destinations."""
    values = {k: v for k, v in get(name).items() if k not in META}
    scaled, notes = scale(name, ranks, explicit)
    values.update(scaled)
    if "loss_scale" in values:
        values["loss_scale"] = parse_loss_scale(str(values["loss_scale"]))
    return values, notes


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
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as exc:
        sys.stderr.write("error: {}\n".format(exc))
        sys.exit(2)
