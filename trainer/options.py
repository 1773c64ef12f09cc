"""Options declared as dataclass fields (``setting``: a field with its flag's option strings, type, help and --help
group) and the argparse parser made from them (``make_parser``: trainer/flags.py declares main.py's); the value
parsers of those flags; ``UsageParser`` and ``number``, which the tools' parsers use too."""
import argparse
import dataclasses
import itertools
import math
import re

from trainer.errors import UsageError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, except where it says nothing: a switch (``--amp``,
    ``--no-validate``: its help says what it does, "(default: True)" only confuses) and an option left unset."""

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
    """``dynamic`` (or -1, the Ascend guides' parser's "-1 means dynamic") -> ``DYNAMIC``; a positive number ->
    float."""
    if str(text).lower() == DYNAMIC:
        return DYNAMIC
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--loss-scale must be a positive number, or 'dynamic' (or -1), got '{}'".format(text))
    if value == -1:
        return DYNAMIC
    if not value > 0 or value == float("inf"):
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
    """A dataclass field declared with its flag: ``names``, the option strings (none: a positional, named by its
    dest); ``group``, the key of its --help group; ``dest``, the parsed name where it is not the field's; ``off``,
    (option string, help) of the switch that sets the opposite (``--no-amp``); ``flag_default``, what argparse
    fills in where the field's default is decided from other flags; the rest, add_argument's (type, choices,
    metavar, help, ...)."""
    flag = dict(names=names, group=group, dest=dest, off=off, flag_default=flag_default, kwargs=kwargs,
                order=next(_ORDER))
    return dataclasses.field(default=default, metadata={"flag": flag})


def declared(*classes):
    """(dest, field, declaration) of each field of ``classes`` declared with ``setting``, in declaration order (a
    positional first)."""
    out = [(f.metadata["flag"]["dest"] or f.name, f, f.metadata["flag"])
           for cls in classes for f in dataclasses.fields(cls) if "flag" in f.metadata]
    return sorted(out, key=lambda d: (bool(d[2]["names"]), d[2]["order"]))  # a positional first


def make_parser(classes, groups, **kwargs):
    """A ``UsageParser`` (``kwargs``: its prog, description, epilog) of the flags ``classes`` declare, in
    ``groups`` ((key, title, description) in --help order) and in declaration order within each."""
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
