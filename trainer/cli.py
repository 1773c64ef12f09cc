"""Command-line plumbing shared by main.py and the tools: one-line errors, exit code 2."""
import os
import stat
import sys

from trainer.errors import UsageError, one_line


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
