"""Which Python runs the project. main.py, the tools and the drivers (test/common.sh) are run as ``python3 ...``;
a Python that lacks the packages an entry point imports (torch, torchvision, ...) stops it in one ``error:`` line,
exit 2, naming the Python to use: the repository's .venv (made by ``make install``) where it exists, else
``make install``. It runs before anything that needs them is imported: the standard library only.

    python3 -m trainer.interpreter     # exit 0 where this Python has the trainer's packages, else the line
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
    lack = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            lack.append(name)
    return lack


def venv_python():
    """The repository's .venv/bin/python, or None where there is none or it is the Python running."""
    path = os.path.join(VENV, "bin", "python")
    if not os.access(path, os.X_OK) or os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return None
    return path


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
    """What to do about it: the Python to use."""
    use = venv_python()
    if use is not None:
        return "run it with {} (or `source {}` first)".format(use, os.path.join(VENV, "bin", "activate"))
    if os.path.isfile(os.path.join(ROOT, "Makefile")):
        return "run `make install` in {} (it makes .venv with them), then run it with {}".format(
            ROOT, os.path.join(VENV, "bin", "python"))
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
