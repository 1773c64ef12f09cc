"""An earlier run in an output folder, and how a new run moves it aside: one policy for main.py and the drivers.

An earlier run is the files its records list (``recorded``) and, for main.py, those in the lock of a run that died
before its summary and whatever lies where the new run writes (``earlier_run``). They go to a folder named by the
time of the move (``stamped``): main.py's ``previous_runs/STAMP/`` (``move_earlier_run``), the drivers'
``<dir>.prev-STAMP`` (``move_folder_aside``). The new run's inputs stay (other ranks read them there).
"""
import dataclasses
import os
import re
import shutil
import time

from trainer.record import checkpoint, files, lock, observe
from trainer.errors import UsageError

EARLIER = "previous_runs"  # where a new run in the default --output-dir moves the run it finds there
KEEP_EARLIER_RUNS = 5  # previous_runs/ keeps the newest 5 earlier runs: a move removes older STAMP folders
_STAMP = re.compile(r"^([0-9]{8}-[0-9]{6})(?:-([0-9]+))?$")


def recorded(folder):
    """(the paths, relative to ``folder``, that the summaries there list, whether one is an older version's, without
    a list: its files found by the names that version writes)."""
    records = [r for r in (files.read_record(folder, n) for n in (files.SUMMARY, files.EVAL_SUMMARY)) if r is not None]
    return set(p for r in records for p in r[0]), any(r[1] for r in records)


def stamped(prefix):
    """A new path ``prefix`` + the time (STAMP, then STAMP-1, STAMP-2, ... where that exists)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = prefix + stamp, 1
    while os.path.exists(dest):
        dest, n = "{}{}-{}".format(prefix, stamp, n), n + 1
    return dest


def earlier_run(plan, stale=None):
    """What earlier runs wrote in --output-dir (paths relative to it): ``recorded``'s, the list in the lock of a run
    that died before its summary (``stale``: that lock's contents), what lies where this run writes. Returns
    (paths, whether a record is an older version's)."""
    folder = plan.run.output_dir
    paths, older = recorded(folder)
    listed = (stale or {}).get(files.FILES)
    if isinstance(listed, list):
        paths.update(r for r in map(files.safe, listed) if r)
    tb = files.inside(plan.run.tensorboard_dir, folder) if plan.run.tensorboard_dir else None
    paths.update(n for n in files.outputs(plan) if n != tb)  # a TensorBoard folder only takes new files
    return sorted(p for p in paths if p.split(os.sep)[0] not in (EARLIER, lock.LOCK) and
                  os.path.lexists(os.path.join(folder, p))), older


def holds(path, inp):
    """Whether ``path`` is the file ``inp`` or a folder holding it."""
    return _same(path, inp) or os.path.isdir(path) and not os.path.islink(path) and files.inside(inp, path) is not None


def move_earlier_run(plan, paths, older=False):
    """Move ``earlier_run``'s ``paths`` into ``previous_runs/STAMP/`` (ModelZoo's scripts run their entry twice in
    one folder, performance then full: the second must neither fail nor overwrite the first); returns (the plan, the
    notes). This run's inputs stay: an earlier file that is one is linked into STAMP (copied where links fail; the run
    reads it there, its own checkpoint may later replace the name in place), a folder holding one stays."""
    folder = plan.run.output_dir
    dest = stamped(os.path.join(folder, EARLIER, ""))
    inputs = [("--pretrained", plan.model.pretrained), ("--resume", plan.resume.path if plan.resume else None),
              ("the data", None if plan.data.dummy else plan.data.root)]
    inputs = [(what, path) for what, path in inputs if path and os.path.exists(path)]
    moved, notes = [], []
    os.makedirs(dest)
    for rel in paths:
        path, target = os.path.join(folder, rel), os.path.join(dest, rel)
        if not os.path.lexists(path):
            continue  # in a folder moved already
        read = [(what, inp) for what, inp in inputs if holds(path, inp)]
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if read and os.path.isdir(path):
                notes.append("{} is in the earlier run's {}, which stays in place".format(read[0][0], path))
            elif read:
                try:
                    os.link(path, target)
                    how = "the same file, linked"
                except OSError:
                    shutil.copy2(path, target)
                    how = "a copy"
                plan = _reads(plan, path, target)
                notes.append("{} '{}' is one of the earlier files: it stays in place, and is kept with them as "
                             "'{}' ({}), which this run reads{}".format(
                                 read[0][0], read[0][1], target, how, "; this run's own {} replaces it in place".format(
                                     rel) if rel in files.outputs(plan) else ""))
            else:
                os.rename(path, target)
                moved.append(rel)
        except OSError as exc:
            raise UsageError("cannot move the earlier run's {} aside into '{}' ({}): pass --output-dir DIR for the "
                             "new run".format(path, dest, exc.strerror or exc))
    older_note = " (an older version's run, whose summary.json lists no files: moved by the names that version writes)"
    notes.insert(0, "--output-dir '{}' held an earlier run: {} moved to {}{} (--output-dir DIR to write elsewhere)"
                 .format(folder, ", ".join(moved) or "nothing", dest, older_note if older else ""))
    notes += _prune(os.path.join(folder, EARLIER), dest, [inp for _, inp in inputs])
    return plan, tuple(notes)


def _same(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _reads(plan, path, kept):
    """The plan reading its input file ``path`` as ``kept`` (the same file, in previous_runs)."""
    for held in (plan.weights, plan.resume):
        if held is not None and _same(held.path, path):
            held.path = kept  # (this process's File: any contents it holds are those of the same file)
    if plan.model.pretrained and _same(plan.model.pretrained, path):
        plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, pretrained=kept))
    return plan


def _prune(root, newest, inputs):
    """previous_runs keeps the newest KEEP_EARLIER_RUNS STAMP folders (other entries stay): notes on those removed, or
    kept because this run reads from them."""
    stamps = sorted((m.group(1), int(m.group(2) or 0), name) for name, m in
                    ((name, _STAMP.match(name)) for name in os.listdir(root)) if m)
    removed, notes = [], []
    for _, _, name in stamps[:max(0, len(stamps) - KEEP_EARLIER_RUNS)]:
        path = os.path.join(root, name)
        if _same(path, newest) or not os.path.isdir(path) or os.path.islink(path):
            continue
        if any(files.inside(inp, path) for inp in inputs):
            notes.append("{} keeps {} beyond the newest {}: this run reads from it".format(
                root, name, KEEP_EARLIER_RUNS))
            continue
        try:
            shutil.rmtree(path)
            removed.append(name)
        except OSError as exc:
            notes.append("could not remove {} ({}): remove it by hand".format(path, exc.strerror or exc))
    if removed:
        notes.insert(0, "{} keeps the newest {} earlier runs: removed {}".format(
            root, KEEP_EARLIER_RUNS, ", ".join(removed)))
    return notes


def move_folder_aside(folder, inputs):
    """The drivers' move of ``folder``'s contents to ``<folder>.prev-STAMP``, but for ``inputs`` (paths the run reads)
    that are not the earlier run's own files (main.py's names, or its record's: its checkpoint as weights).
    Returns (the folder they went to, {input inside the folder: its path now})."""
    dest = stamped(folder + ".prev-")
    real = os.path.realpath(folder)
    held = [i for i in inputs if os.path.realpath(i) == real or os.path.realpath(i).startswith(real + os.sep)]
    try:
        if not held:
            os.rename(folder, dest)
            return dest, {}
        earlier = recorded(folder)[0] | {checkpoint.CHECKPOINT, checkpoint.BEST, files.SUMMARY,
                                         files.EVAL_SUMMARY, observe.METRICS, observe.LOSSES}
        rels = [os.path.relpath(os.path.realpath(i), real) for i in held]
        stays = [i for i, rel in zip(held, rels) if not any(rel == e or rel.startswith(e + os.sep) for e in earlier)]
        os.makedirs(dest)
        for entry in sorted(os.listdir(folder)):
            path = os.path.join(folder, entry)
            if not any(holds(path, i) for i in stays):
                os.rename(path, os.path.join(dest, entry))
    except OSError as exc:
        raise UsageError("cannot move '{}' aside to '{}' ({})".format(folder, dest, exc.strerror or exc))
    moved = {path: os.path.join(dest, rel) for path, rel in zip(held, rels)}
    return dest, {p: m if not os.path.exists(p) and os.path.exists(m) else p for p, m in moved.items()}
