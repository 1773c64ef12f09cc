"""Errors that are the user's to fix: reported as one line, exit code 2."""


class UsageError(Exception):
    """Bad input: a flag, a path, a data set or an environment the user controls.

    The message is one line that names the problem and, where there is one, the fix.
    ``main.py`` prints it as ``error: <message>`` and exits with code 2.
    """

    exit_code = 2


class DataError(UsageError):
    """A problem with the data on disk (layout, classes, a corrupt image)."""
