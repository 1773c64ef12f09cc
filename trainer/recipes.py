"""Recipes as data: ``trainer/recipes.json``, read by ``main.py --recipe`` and the shell drivers.

    python3 -m trainer.recipes list
    python3 -m trainer.recipes show resnet50_8p            # key=value lines
    python3 -m trainer.recipes get resnet50_8p batch_size  # one value
"""
import json
import os
import sys

from trainer.errors import UsageError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes.json")
# recipe keys that are not main.py flags
META = ("rank_size", "source")


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


def flag_defaults(name):
    """The recipe as main.py defaults (keys are argparse destinations)."""
    from trainer.config import parse_loss_scale
    values = {k: v for k, v in get(name).items() if k not in META}
    if "loss_scale" in values:
        values["loss_scale"] = parse_loss_scale(str(values["loss_scale"]))
    return values


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
