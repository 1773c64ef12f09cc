"""Which Python runs the project: a Python without the packages an entry point imports stops in one ``error:``
line, exit 2, naming the one to use (the repository's .venv, else ``make install``). The standard library only.
``python3 -m trainer.interpreter`` exits 0 where this Python has them.
"""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")  # make install's
PACKAGES = ("torch", "torchvision", "numpy", "PIL")  # what main.py imports (requirements.txt)
PROJECT = "trainer"  # importable from any folder once the project is installed (pip install -e ., make install)


def missing(names=PACKAGES):
    """The names of ``names`` this Python cannot import (found, not imported: milliseconds)."""
    return [name for name in names if not _found(name)]


def _found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def problem(names=PACKAGES):
    """The one line (without ``error:``) for a Python that lacks any of ``names``, or None."""
    lack = missing(names)
    if not lack:
        return None
    packages = ", ".join({"PIL": "Pillow"}.get(n, n) for n in lack if n != PROJECT)
    where = sys.executable or "this Python"
    if PROJECT not in lack:
        head = "{} has no {}".format(where, packages)
    else:
        head = "{} has no {}, and this project is not installed in it".format(where, packages) if packages else \
            "this project is not installed in {}".format(where)
    return "{}: {}".format(head, fix())


def fix():
    """What to do about it: the Python to use (the repository's .venv, where it is not the Python running)."""
    python = os.path.join(VENV, "bin", "python")
    if os.access(python, os.X_OK) and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        return "run it with {} (or `source {}` first)".format(python, os.path.join(VENV, "bin", "activate"))
    if os.path.isfile(os.path.join(ROOT, "Makefile")):
        return "run `make install` in {} (it makes .venv with them), then run it with {}".format(ROOT, python)
    return "install requirements.txt's packages into it, or run it with a Python that has them"


def require(names=PACKAGES):
    """Return where this Python has ``names``; else the one line on stderr and exit 2."""
    text = problem(names)
    if text is not None:
        sys.stderr.write("error: {}\n".format(text))
        sys.stderr.flush()
        raise SystemExit(2)


if __name__ == "__main__":
    require()
