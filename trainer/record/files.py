"""The output folder's record: what a run may write in --output-dir (``outputs``), what it wrote there (``snapshot``
before, ``changed`` after: summary.json's "files", trainer/record/summary.py), and that list read back
(``read_record``: an earlier run's files, trainer/record/earlier.py)."""
import json
import os

from trainer.record import checkpoint, observe, profiling

SUMMARY = "summary.json"
EVAL_SUMMARY = "eval_summary.json"
FILES = "files"  # the record's key: the files the run wrote in its folder
TB_EVENTS = "events.out.tfevents."  # TensorBoard's event file names (its own, never a person's)


def inside(path, folder):
    """``path`` relative to ``folder`` when it lies inside it (not the folder itself), else None."""
    return safe(os.path.relpath(os.path.realpath(path), os.path.realpath(folder)))


def outputs(plan):
    """What a run of ``plan`` may write in --output-dir (paths relative to it): its summary, the last and best
    checkpoints (--checkpoint-nameprefix), those of --checkpoint-freq, metrics.jsonl, step_losses.csv, every rank's
    profiler results, the TensorBoard folder (when it lies inside)."""
    run = plan.run
    if run.evaluate:
        return [EVAL_SUMMARY]
    names = [SUMMARY, checkpoint.last_name(run.checkpoint_prefix), checkpoint.BEST, observe.METRICS, observe.LOSSES]
    if run.checkpoint_freq:
        names += [checkpoint.epoch_name(run.checkpoint_prefix, e)
                  for e in range(run.checkpoint_freq, run.epochs + 1, run.checkpoint_freq)]
    if run.profile_steps is not None:  # every rank's (a spawning process's plan counts those it starts on every node)
        launch = plan.launch
        world = launch.nodes * len(launch.device_list) if launch.mode == "spawn" else launch.world_size
        names += [n for r in range(max(1, world)) for n in profiling.files_of(r)]
    tb = inside(run.tensorboard_dir, run.output_dir) if run.tensorboard_dir else None
    return names + ([tb] if tb else [])


def _identity(path):
    try:
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, st.st_size
    except OSError:
        return None


def snapshot(folder, names):
    """{name: the file's identity, or a folder's {entry: identity}} of those of ``names`` present in ``folder``."""
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            out[name] = {e: _identity(os.path.join(path, e)) for e in os.listdir(path)}
        elif os.path.lexists(path):
            out[name] = _identity(path)
    return out


def changed(folder, names, before):
    """Which of ``names`` in ``folder`` are new or rewritten since ``snapshot`` gave ``before``: a folder that was
    not there counts whole, in one that was its new or rewritten entries count."""
    out = []
    for name in names:
        path = os.path.join(folder, name)
        was = before.get(name)
        if isinstance(was, dict) and os.path.isdir(path):
            out += [os.path.join(name, e) for e in sorted(os.listdir(path))
                    if was.get(e) != _identity(os.path.join(path, e))]
        elif os.path.lexists(path) and (was is None or was != _identity(path)):
            out.append(name)
    return out


def safe(rel):
    """A record's entry as a path inside its folder, or None (absolute, or reaching outside it)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        return None
    rel = os.path.normpath(rel)
    return None if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def read_record(folder, name):
    """The summary ``name`` in ``folder``: (the files its run wrote there, whether it is an older version's summary
    without that list), or None without a readable one. An older version's files are found by the names it writes:
    its checkpoints (by its config), metrics.jsonl, its ranks' profiler results, its TensorBoard event files."""
    path = os.path.join(folder, name)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    listed = data.get(FILES)
    if isinstance(listed, list):
        return sorted(set(r for r in map(safe, listed + [name]) if r)), False
    cfg = data.get("config") if isinstance(data.get("config"), dict) else {}
    names = [name]
    if name == SUMMARY:
        prefix = cfg.get("checkpoint_prefix") or "checkpoint"
        names += [checkpoint.last_name(prefix), checkpoint.BEST, observe.METRICS, observe.LOSSES]
        freq, done = cfg.get("checkpoint_freq") or 0, data.get("epochs_completed") or 0
        if isinstance(freq, int) and isinstance(done, int) and freq > 0:
            names += [checkpoint.epoch_name(prefix, e) for e in range(freq, done + 1, freq)]
        if cfg.get("profile_steps"):
            ranks = data.get("world_size") if isinstance(data.get("world_size"), int) else 1
            names += [n for r in range(max(1, ranks)) for n in profiling.files_of(r)]
        tb, out = cfg.get("tensorboard_dir"), cfg.get("output_dir") or os.curdir
        tb = safe(os.path.relpath(tb, out)) if isinstance(tb, str) and isinstance(out, str) and \
            os.path.isabs(tb) == os.path.isabs(out) else None
        if tb and os.path.isdir(os.path.join(folder, tb)):
            names += [os.path.join(tb, e) for e in sorted(os.listdir(os.path.join(folder, tb)))
                      if e.startswith(TB_EVENTS)]
    return sorted(set(r for r in map(safe, names) if r)), True
