"""Errors that are the user's to fix: reported as one line on stderr (``report``, ``run``), exit code 2, in
messages that count as English does (``counted``)."""
import sys


class UsageError(Exception):
    """Bad input the user controls: one line naming the problem and the fix; ``error: <message>``, exit 2."""

    exit_code = 2


class DataError(UsageError):
    """A problem with the data on disk (layout, classes, a corrupt image)."""


def one_line(exc):
    """The user-facing line of ``exc`` (a DataLoader worker's error carries its traceback: the last line's)."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return text
    last = lines[-1].strip()
    name = type(exc).__name__ + ": "
    return last[last.index(name) + len(name):] if name in last else last


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


def counted(n, word, many=None):
    """"1 image", "2 images", "3 classes" (``many``: an irregular plural)."""
    if n == 1:
        return "{} {}".format(n, word)
    return "{} {}".format(n, many or word + ("es" if word.endswith(("s", "x", "sh")) else "s"))
