"""Command-line plumbing shared by main.py and the tools: argparse's help and one-line parse errors, the value types
of flags, and the lines a stopped run ends with."""
import argparse
import math
import re

from trainer.errors import UsageError, counted


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


def interrupted_line(plan):
    if plan.run.evaluate:
        return "interrupted: the evaluation stopped; nothing in '{}' was changed but its summary".format(
            plan.run.output_dir)
    return "interrupted: summary and checkpoints in '{}'; continue with --resume auto".format(plan.run.output_dir)


def out_of_memory_line(plan, device):
    """The one line for a run that ran out of device (or host) memory: where, at which batch, what to change."""
    per_device = plan.run.batch_size // max(1, plan.launch.world_size)
    fixes = ["lower -b (now {} global{})".format(plan.run.batch_size, ", {} per device".format(per_device)
                                                  if plan.launch.world_size > 1 else "")]
    if not plan.precision.amp and device.resolve_amp_dtype("auto")[0] is not None:
        fixes.append("add --amp (half-size activations)")
    return ("out of memory on {} at {} per device ({}, {} px): {}; the checkpoints are those of the last "
            "finished epoch".format(device.name, counted(per_device, "image"), plan.model.arch,
                                    plan.data.train_crop_size, ", or ".join(fixes)))
