"""Command-line plumbing shared by main.py and the tools: one-line errors, exit code 2."""
import argparse
import math
import os
import re
import stat
import sys

from trainer.errors import UsageError, one_line


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


def report(exc):
    """Print a UsageError as ``error: <one line>`` on stderr (not one marked ``quiet``: another rank prints the
    same error); returns its exit code."""
    if not getattr(exc, "quiet", False):
        sys.stderr.write("error: {}\n".format(one_line(exc)))
        sys.stderr.flush()
    return exc.exit_code


def run(main_fn, argv=None):
    """Call ``main_fn(argv)``; a UsageError becomes its one-line report and exit code."""
    try:
        return main_fn(argv)
    except UsageError as exc:
        return report(exc)


def printer(out=None):
    """``log(msg)``: one flushed line on ``out`` (default: stdout at call time)."""
    def log(msg):
        stream = out or sys.stdout
        stream.write(msg + "\n")
        stream.flush()
    return log


def counted(n, word, many=None):
    """``n`` and ``word`` counted as English counts: "1 image", "2 images", "1 class", "3 classes" (``many``: the
    plural where adding -s, or -es after s, x and sh, does not make it)."""
    if n == 1:
        return "{} {}".format(n, word)
    return "{} {}".format(n, many or word + ("es" if word.endswith(("s", "x", "sh")) else "s"))


def check_arch(name):
    import models
    if not models.known(name):
        raise UsageError(models.unknown_message(name))


def append_to_shared_log():
    """Ascend ModelZoo's 8p loops start every rank with ``> train_0.log 2>&1``: each process has the file open
    at its own offset, so a line of one rank would overwrite another's. Where stdout / stderr are regular
    files, switch them to append mode (O_APPEND): every line lands at the end, whoever writes it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except (AttributeError, OSError, ValueError):
            continue


def interrupted_line(plan, signal_name=None, global_step=None):
    """The last line of a run a signal stopped (``global_step``: where its mid-epoch checkpoint continues)."""
    if plan.run.evaluate:
        return "interrupted: the evaluation stopped; nothing in '{}' was changed but its summary".format(
            plan.run.output_dir)
    by = " by {}".format(signal_name) if signal_name else ""
    at = " at global step {}".format(global_step) if global_step is not None else ""
    return "interrupted{}{}: summary and checkpoints in '{}'; continue with --resume auto".format(
        by, at, plan.run.output_dir)


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
