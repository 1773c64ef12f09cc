"""Errors that are the user's to fix: reported as one line, exit code 2."""


class UsageError(Exception):
    """Bad input: a flag, a path, a data set or an environment the user controls.

    The message is one line that names the problem and, where there is one, the fix.
    ``main.py`` prints it as ``error: <message>`` and exits with code 2.
    """

    exit_code = 2


class DataError(UsageError):
    """A problem with the data on disk (layout, classes, a corrupt image)."""


def one_line(exc):
    """The user-facing line of ``exc``.

    An error raised inside a DataLoader worker reaches the main process re-raised with the
    worker's whole traceback as its message; its last line holds the original message.
    """
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return text
    last = lines[-1].strip()
    name = type(exc).__name__ + ": "
    return last[last.index(name) + len(name):] if name in last else last
