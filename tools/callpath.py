#!/usr/bin/env python3
"""Follow one run of main.py through its calls, as a reader does: the project's files in the order they are met.

    python3 -m tools.callpath [--json FILE] -- MAIN.PY ARGS...

Runs ``main.main(ARGS)`` in this process under a profiler hook and records the functions of main.py, trainer/
and models/ at their first call (a reader reads a function once, where the run first calls it; comprehensions,
lambdas and module bodies are not functions a reader opens). By default only the functions the run's
configuration flows through: those called with the command line (``argv``), with an object of trainer/flags.py,
trainer/config.py or trainer/plan.py (a section, the ``Config``, the ``Plan``), or with an object that holds one
as its own attribute (a trainer, a job); ``--all`` records every function. The files of those functions, in that
order, with repeats in a row merged, are the path a reader walks. Two counts of going back:

  re-entries        a call from another file into a file the reader had met before (the caller is the nearest
                    project function on the stack: a file's calls to its own functions are reading that file)
  path re-entries   a step of the path (in first-call order, callers aside) into a file met before

Prints the path, then ``files: N, functions: M, re-entries: K, path re-entries: P`` and each re-entered file's
count; ``--json`` writes the same numbers for machines.

Example (a tiny data set from tools/make_dataset.py)::

    python3 -m tools.make_dataset /tmp/d --classes 4 --train-per-class 8 --val-per-class 4 --size 32
    python3 -m tools.callpath -- /tmp/d -a resnet50 --amp --epochs 1 -b 8 -j 0 --output-dir /tmp/out
"""
if not __package__:  # python3 tools/callpath.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import argparse
import collections
import json
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project_file(path):
    """The file's path relative to the project when it is main.py or under trainer/ or models/, else None."""
    path = os.path.abspath(path)
    if not path.startswith(ROOT + os.sep):
        return None
    rel = os.path.relpath(path, ROOT)
    if rel == "main.py" or rel.split(os.sep)[0] in ("trainer", "models"):
        return rel
    return None


CONFIG_MODULES = ("trainer.flags", "trainer.config", "trainer.plan")  # the sections, the Config, the Plan


def _is_config(value):
    return type(value).__module__ in CONFIG_MODULES and not isinstance(value, type)


def _carries_config(frame, argv):
    """Whether the call's arguments include ``argv``, a config object, or an object holding one."""
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if value is argv or _is_config(value):
            return True
        own = getattr(value, "__dict__", None)
        if isinstance(own, dict) and not isinstance(value, type) and any(_is_config(v) for v in own.values()):
            return True
    return False


def _caller(frame):
    """The project file of the nearest project function that called ``frame``'s, or None."""
    frame = frame.f_back
    while frame is not None:
        rel = _project_file(frame.f_code.co_filename)
        if rel is not None and not frame.f_code.co_name.startswith("<"):
            return rel
        frame = frame.f_back
    return None


def trace(fn, argv, follow_all=False):
    """(fn(argv)'s result, the (file, function, caller's file) of the project's functions in first-call order):
    every function with ``follow_all``, else those the configuration flows through (``_carries_config``)."""
    seen, order = set(), []

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_name.startswith("<") or code in seen:
            return
        rel = _project_file(code.co_filename)
        if rel is None or not (follow_all or _carries_config(frame, argv)):
            return
        seen.add(code)
        order.append((rel, code.co_name, _caller(frame)))

    sys.setprofile(hook)
    try:
        result = fn(argv)
    finally:
        sys.setprofile(None)
    return result, order


def walk(order):
    """(the files in the order met, repeats in a row merged; re-entries per file; path re-entries per file)."""
    path, left, path_reentries = [], set(), collections.Counter()
    met, reentries = set(), collections.Counter()
    for rel, _, caller in order:
        if caller is not None and caller != rel and rel in met:
            reentries[rel] += 1
        met.add(rel)
        if path and path[-1] == rel:
            continue
        if path:
            left.add(path[-1])
        if rel in left:
            path_reentries[rel] += 1
        path.append(rel)
    return path, reentries, path_reentries


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the counts here")
    p.add_argument("--all", action="store_true", help="every function of the project, not only those the "
                   "configuration flows through")
    p.add_argument("--functions", action="store_true", help="list the functions (file and name) in order")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then main.py's arguments")
    ns = p.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    entry = runpy.run_path(os.path.join(ROOT, "main.py"), run_name="callpath")  # main.py's functions, not run
    code, order = trace(entry["main"], args, ns.all)
    path, reentries, path_reentries = walk(order)
    if ns.functions:
        for rel, name, caller in order:
            print("{}  {}  (from {})".format(rel, name, caller))
    print(" -> ".join(path))
    files = sorted(set(path))
    print("files: {}, functions: {}, re-entries: {}, path re-entries: {} (exit code {})".format(
        len(files), len(order), sum(reentries.values()), sum(path_reentries.values()), code))
    for rel, n in reentries.most_common():
        print("  {} re-entered {} time(s)".format(rel, n))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"follow": "all" if ns.all else "config", "files": files, "path": path,
                       "functions": len(order), "reentries": dict(reentries),
                       "total_reentries": sum(reentries.values()), "path_reentries": dict(path_reentries),
                       "total_path_reentries": sum(path_reentries.values()), "exit_code": code}, f, indent=1)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
