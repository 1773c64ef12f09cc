"""Options declared as dataclass fields (``setting``) and the argparse parser made from them (``make_parser``);
the flags' value parsers; ``UsageParser`` and ``number``, which the tools' parsers use too."""
import argparse
import dataclasses
import itertools
import math
import re

from trainer.errors import UsageError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, except a switch's and an unset option's."""

    def _get_help_string(self, action):
        if isinstance(action.const, bool) or action.default is None:
            return action.help
        return argparse.ArgumentDefaultsHelpFormatter._get_help_string(self, action)


class UsageParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage."""

    def error(self, message):
        switch = re.fullmatch(r"argument (--[\w-]+): ignored explicit argument '(.*)'", message)
        if switch:  # --blurpool=false: a switch takes no value; name the pair that turns it on and off
            flag, value = switch.groups()
            off = "--no-" + flag[2:]
            message = "{} is a switch and takes no value (got '{}'): give {} alone{}".format(
                flag, value, flag, ", or {} for the opposite".format(off) if off in self._option_string_actions
                else "")
        raise UsageError(message)


def number(cast, minimum, exclusive=False):
    """argparse type: ``cast(text)``, at least ``minimum`` (above it if ``exclusive``); nan rejected."""
    kind = "a whole number" if cast is int else "a number"
    bound = "{} {}".format("above" if exclusive else "at least", minimum)

    def parse(text):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError("must be {}, got '{}'".format(kind, text))
        if cast is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError("must be a finite number, got '{}'".format(text))
        if not (value > minimum if exclusive else value >= minimum):
            raise argparse.ArgumentTypeError("must be {} {}, got '{}'".format(kind, bound, text))
        return value
    return parse


DYNAMIC = "dynamic"  # --loss-scale dynamic (or -1): a dynamic loss scale asked for


def parse_loss_scale(text):
    """``dynamic`` or -1 (the Ascend guides') -> ``DYNAMIC``; a positive number -> float."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")  # not a number: refused below
    if str(text).lower() == DYNAMIC or value == -1:
        return DYNAMIC
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            "--loss-scale must be a positive number, or 'dynamic' (or -1), got '{}'".format(text))
    return value


def parse_device_list(text):
    """``0-7``, ``0,1,2,3``, ``0-3,6`` -> (0, 1, ...); duplicates and bad ranges rejected."""
    ids = []
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise argparse.ArgumentTypeError(
                "--device-list: '{}' is not a device id or range (use e.g. 0-7, 0,1,2,3 or 0-3,6)".format(part))
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise argparse.ArgumentTypeError(
                "--device-list: range '{}' runs backwards (write {}-{})".format(part, hi, lo))
        ids.extend(range(lo, hi + 1))
    twice = [i for n, i in enumerate(ids) if i in ids[:n]]
    if twice:
        raise argparse.ArgumentTypeError("--device-list '{}' names device {} twice".format(text, twice[0]))
    return tuple(ids)


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


_ORDER = itertools.count()  # the order of the declarations: the parser's, within each of its groups


def setting(*names, default=None, group, dest=None, off=None, flag_default=dataclasses.MISSING, **kwargs):
    """A dataclass field declared with its flag: ``names`` (none: a positional), its --help ``group``, ``dest`` where
    not the field's name, ``off`` (option, help) of the opposite switch, ``flag_default`` where argparse's default
    differs from the field's; the rest go to add_argument."""
    flag = dict(names=names, group=group, dest=dest, off=off, flag_default=flag_default, kwargs=kwargs,
                order=next(_ORDER))
    return dataclasses.field(default=default, metadata={"flag": flag})


def declared(*classes):
    """(dest, field, declaration) of each ``setting`` field of ``classes``, in declaration order (positional first)."""
    out = [(f.metadata["flag"]["dest"] or f.name, f, f.metadata["flag"])
           for cls in classes for f in dataclasses.fields(cls) if "flag" in f.metadata]
    return sorted(out, key=lambda d: (bool(d[2]["names"]), d[2]["order"]))  # a positional first


def make_parser(classes, groups, **kwargs):
    """A ``UsageParser`` of the flags ``classes`` declare, in ``groups`` ((key, title, description)) order."""
    p = UsageParser(formatter_class=HelpFormatter, **kwargs)
    made = {key: p.add_argument_group(title, description) for key, title, description in groups}
    rank = {key: n for n, (key, _, _) in enumerate(groups)}  # group by group: the usage line follows --help
    for dest, f, flag in sorted(declared(*classes), key=lambda d: rank[d[2]["group"]]):
        default = f.default if flag["flag_default"] is dataclasses.MISSING else flag["flag_default"]
        kwargs = dict(flag["kwargs"], default=default)
        if callable(kwargs.get("help")):  # a help that reads a data file: read when the parser is made
            kwargs["help"] = kwargs["help"]()
        if flag["names"]:
            made[flag["group"]].add_argument(*flag["names"], dest=dest, **kwargs)
        else:
            made[flag["group"]].add_argument(dest, **kwargs)
        if flag["off"]:
            name, text = flag["off"]
            made[flag["group"]].add_argument(name, dest=dest, action="store_false", help=text)
    return p
