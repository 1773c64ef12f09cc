#!/usr/bin/env python3
"""Precision alignment of two runs, on Ascend's msprobe (PyPI mindstudio-probe): a golden run (GPU or CPU) and a
target run (NPU), made on different machines with ``main.py --deterministic --seed N [--precision-dump DIR]``.

    python3 -m tools.align compare GOLDEN_DUMP TARGET_DUMP [-o DIR] [--top N] [--force]
    python3 -m tools.align losses RUN_A RUN_B [--rtol 0.01] [--plot FILE.png] [--force]
    python3 -m tools.align config RUN_A RUN_B

compare: msprobe's comparison (its ``msprobe compare``) of the two --precision-dump folders, step by step and rank
by rank (DIR/step<k>/rank<r>/dump.json; a step folder may be given too), and a short verdict: the first API or
module, in execution order, that msprobe marks "error" (over its thresholds: statistics, an output whose norm
relative error is above 0.5 while its inputs' is below 0.1; tensors, msprobe's cosine and error-ratio rules), the
worst N (msprobe's errors first, then its warnings, then the rest, each by relative error), and where the full
result (msprobe's CSV per step and rank) is. Its "warning"s (an output's error ten times its inputs', common with
float32 rounding alone) are counted, not failed. Without -o the results go to a new folder beside TARGET's dump
folder, compare_<golden>_vs_<target> (the dump folders' names; _2, _3, ... when it exists), so that each comparison
keeps its own; a given -o must be empty (or --force). A folder compare creates holds a .gitignore of "*".
losses: the training loss of every step of two runs (their step_losses.csv, whatever -p each ran with): the largest
relative gap |a - b| / |a|, the first step over --rtol, and a plot of both curves and the gap.
config: what differs between two runs' summary.json: hyper-parameters, seed, the initial weights' and first
batches' fingerprints (main.py --deterministic or --precision-dump records them), package versions and the
environment variables msprobe's config check compares (its pip and env checks, on the recorded lists).
Exit codes: 0 within the thresholds / nothing that matters differs; 1 something over / differs; 2 bad input (one
line on stderr).
"""
if not __package__:  # python3 tools/align.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import glob
import functools
import itertools
import json
import math
import os
import re
import shutil
import sys
import tempfile

from trainer import errors, options
from trainer.errors import UsageError
from tools.plot_runs import plot_gap

STEP_DIR = re.compile(r"step(\d+)$")
RANK_DIR = re.compile(r"(?:rank|proc)(\d+)$")
SEVERITY = {"error": 0, "warning": 1}  # msprobe's Result: the order of compare's worst list
# run-to-run settings that differ between machines without changing the numerics (config)
MACHINE_KEYS = ("data", "output_dir", "tensorboard_dir", "precision_dump", "dump_config", "device", "device_index",
                "device_list", "addr", "port", "dist_url", "dist_backend", "local_rank", "launch", "node_rank",
                "rank", "workers", "pin_memory", "cpu_binding", "jit_compile", "internal_format", "progress",
                "resume", "move_earlier_run", "data_backend", "channels_last", "dump_steps", "dump_level",
                "dump_task", "print_freq")


# ---------------------------------------------------------------- compare


def _steps(path, side):
    """{step: step folder} of a --precision-dump folder, or of one step folder given alone."""
    if not os.path.isdir(path):
        raise UsageError("{} '{}' is not a folder: give a --precision-dump folder (or one of its step<k>/)".format(
            side, path))
    if _is_step_folder(path):
        return {int(STEP_DIR.match(os.path.basename(os.path.normpath(path))).group(1)): path}
    out = {}
    for name in os.listdir(path):
        m = STEP_DIR.match(name)
        if m and os.path.isdir(os.path.join(path, name)):
            out[int(m.group(1))] = os.path.join(path, name)
    if not out:
        raise UsageError("{} '{}' holds no msprobe dump (no step<k>/rank<r>/dump.json): give the folder of main.py "
                         "--precision-dump".format(side, path))
    return out


def _is_step_folder(path):
    """Whether ``path`` is one step<k>/ of a --precision-dump folder (it holds rank<r>/ folders)."""
    return bool(STEP_DIR.match(os.path.basename(os.path.normpath(path)))) and os.path.isdir(path) and \
        any(RANK_DIR.match(n) for n in os.listdir(path))


def _ranks(step_dir):
    return sorted(int(RANK_DIR.match(n).group(1)) for n in os.listdir(step_dir)
                  if RANK_DIR.match(n) and os.path.isfile(os.path.join(step_dir, n, "dump.json")))


def _number(text):
    """msprobe's cell (``12.5%``, ``0.3``, ``N/A``, ``inf``) as a float; None where it holds none."""
    if text is None:
        return None
    s = str(text).strip().rstrip("%")
    try:
        v = float(s)
    except ValueError:
        return None
    if math.isnan(v):
        return None
    return v / 100.0 if str(text).strip().endswith("%") else v


def _call_of(name):
    """msprobe's row name -> (its API or module call, a short name): 'Module.fc.Linear.forward.0.output.0' ->
    ('Module.fc.Linear.forward.0', 'fc'); 'Functional.conv2d.3.forward.input.0' -> ('Functional.conv2d.3.forward',
    'Functional.conv2d.3')."""
    m = re.match(r"(.*?\.(?:forward|backward)(?:\.\d+)?)(?:\.|$)", name)
    call = m.group(1) if m else name
    short = re.sub(r"\.(?:forward|backward)(?:\.\d+)?$", "", call)
    if short.startswith("Module."):
        parts = short.split(".")[1:]
        short = ".".join(parts[:-1]) if len(parts) > 1 else parts[0]  # the module's path, without its class
    return call, short


def _read_rows(csv_path, step, rank):
    import csv
    rows = []
    with open(csv_path, newline="") as f:
        for order, r in enumerate(csv.DictReader(f)):
            rel = None
            for col in ("NormRelativeErr", "MaxRelativeErr"):
                rel = _number(r.get(col))
                if rel is not None:
                    break
            rows.append({"step": step, "rank": rank, "order": order, "name": r.get("NPU Name", ""),
                         "bench": r.get("Bench Name", ""), "result": (r.get("Result") or "").strip().lower(),
                         "message": (r.get("Err_message") or "").strip(), "rel": rel})
    return rows


def _dump_folder(path):
    """The --precision-dump folder of ``path`` (itself, or the folder above a step<k>/ given alone)."""
    path = os.path.abspath(path)
    return os.path.dirname(path) if _is_step_folder(path) else path


def _safe_name(path):
    """A run's name for a folder name: the dump folder's basename, letters, digits, '.', '-' and '_' only."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(_dump_folder(path))).strip("._") or "dump"
    return name[:60]


def ignore_all(folder):
    """A .gitignore of ``*`` in a folder compare created: nothing it writes shows in a git checkout."""
    with open(os.path.join(folder, ".gitignore"), "w") as f:
        f.write("*\n")


def new_results_dir(golden, target):
    """compare without -o: a new folder beside the target's dump folder, compare_<golden>_vs_<target>, with _2, _3,
    ... where that exists; git-ignored."""
    parent = os.path.dirname(_dump_folder(target))
    base = os.path.join(parent, "compare_{}_vs_{}".format(_safe_name(golden), _safe_name(target)))
    for n in itertools.count(1):
        path = base if n == 1 else "{}_{}".format(base, n)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError("cannot create '{}' beside the TARGET dump ({}): give -o DIR".format(
                path, exc.strerror or exc))
        ignore_all(path)
        return path


def _quiet():
    """msprobe's logger to warnings only (its INFO lines would bury the verdict)."""
    import logging
    for name in ("msprobe",):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_compare(golden, target, out_dir, top, force, log):
    gsteps, tsteps = _steps(golden, "GOLDEN"), _steps(target, "TARGET")
    common = sorted(set(gsteps) & set(tsteps))
    if not common:
        raise UsageError("GOLDEN '{}' (steps {}) and TARGET '{}' (steps {}) have no step in common: dump the same "
                         "--dump-steps on both".format(golden, sorted(gsteps), target, sorted(tsteps)))
    pairs = []
    for step in common:
        ranks = sorted(set(_ranks(gsteps[step])) & set(_ranks(tsteps[step])))
        if not ranks:
            raise UsageError("step {}: GOLDEN has rank(s) {} and TARGET rank(s) {}: no rank in common".format(
                step, _ranks(gsteps[step]), _ranks(tsteps[step])))
        pairs.append((step, ranks))
    if out_dir is not None and os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise UsageError("-o '{}' is a file: give a folder for msprobe's results".format(out_dir))
        if os.listdir(out_dir) and not force:
            raise UsageError("-o '{}' is not empty: pass --force to replace its results, or give another -o".format(
                out_dir))
    try:
        from msprobe.core.compare.utils import compare_distributed_inner
    except ImportError:
        raise UsageError("tools.align compare needs msprobe: pip install mindstudio-probe==26.2.0 (make install "
                         "installs it)")
    _quiet()
    made = out_dir is None or not os.path.isdir(out_dir)  # compare's own folder: its .gitignore covers it all
    if out_dir is None:
        out_dir = new_results_dir(golden, target)
    elif made:
        try:
            os.makedirs(out_dir)
        except OSError as exc:
            raise UsageError("-o '{}': cannot create it ({}): give another -o".format(out_dir, exc.strerror or exc))
        ignore_all(out_dir)
    log("=> results into {}".format(os.path.abspath(out_dir)))
    rows, files = [], []
    for step, ranks in pairs:
        step_out = os.path.join(out_dir, "step{}".format(step))
        if os.path.isdir(step_out):
            shutil.rmtree(step_out)  # --force: this step's earlier results
        os.makedirs(step_out)
        if not made:
            ignore_all(step_out)  # an -o that was there already: what compare writes in it is ignored all the same
        compare_distributed_inner(tsteps[step], gsteps[step], step_out)
        for path in sorted(glob.glob(os.path.join(step_out, "compare_result_*.csv"))):
            m = re.search(r"compare_result_(?:rank|proc)(\d+)_", os.path.basename(path))
            rank = int(m.group(1)) if m else ranks[0]
            files.append(path)
            rows.extend(_read_rows(path, step, rank))
    if not rows:
        raise UsageError("msprobe compared nothing between '{}' and '{}': were both dumped with the same --dump-level "
                         "and --dump-task?".format(golden, target))
    return verdict(rows, files, pairs, top, log)


def verdict(rows, files, pairs, top, log):
    rows.sort(key=lambda r: (r["step"], r["rank"], r["order"]))
    errors = [r for r in rows if r["result"] == "error"]
    warnings = sum(1 for r in rows if r["result"] == "warning")
    unmatched = sum(1 for r in rows if r["bench"] in ("", "N/A"))
    ranks = sorted({rank for _, rs in pairs for rank in rs})
    log("=> msprobe compare: {} step(s) ({}), rank(s) {}: {} tensors compared, {} over msprobe's thresholds "
        "(error), {} warning(s){}".format(
            len(pairs), ",".join(str(s) for s, _ in pairs), ",".join(map(str, ranks)), len(rows), len(errors),
            warnings, ", {} only in the target".format(unmatched) if unmatched else ""))
    worst = worst_rows(rows, top)
    if worst:
        width = max(len(r["name"]) for r in worst)
        log("worst {}: msprobe's errors first, then its warnings, then the rest; each by relative error, largest "
            "first:".format(len(worst)))
        for r in worst:
            log("  {:<{w}}  step {} rank {}  rel {}  {}".format(
                r["name"], r["step"], r["rank"], "{:.3e}".format(r["rel"]) if r["rel"] is not None else "N/A",
                r["result"] or "-", w=width))
    for path in files:
        log("=> full result: {}".format(os.path.abspath(path)))
    if not errors:
        log("=> within msprobe's thresholds: no API or module marked error")
        return 0
    first = errors[0]
    call, short = _call_of(first["name"])
    log("=> first over msprobe's thresholds in execution order: {} ({}, step {}, rank {}{}): {}".format(
        short, call, first["step"], first["rank"],
        ", relative error {:.3e}".format(first["rel"]) if first["rel"] is not None else "",
        _first_error(first["message"])))
    return 1


def worst_rows(rows, top):
    """The ``top`` worst rows by the verdict's rule: msprobe's errors, then its warnings, then the rest, each by
    relative error (largest first; an error or warning without one after those with one)."""
    listed = (r for r in rows if r["rel"] is not None or r["result"] in SEVERITY)
    return sorted(listed, key=lambda r: (SEVERITY.get(r["result"], len(SEVERITY)), r["rel"] is None,
                                         -(r["rel"] or 0.0)))[:top]


def _first_error(message):
    """The first "error: ..." of msprobe's Err_message cell (a list written as text)."""
    try:
        items = json.loads(message)
    except ValueError:
        items = [message]
    items = [str(i) for i in (items if isinstance(items, list) else [items])]
    return next((i for i in items if i.startswith("error")), items[0] if items else "error")


# ---------------------------------------------------------------- losses


def _run_folder(path):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return folder


def read_losses(path, log=None):
    """{global step: training loss} of every step, from a run folder's step_losses.csv (or that file); a run that
    has none (an earlier version's) gives the printed intervals' means of its metrics.jsonl, with a note."""
    from trainer.record.observe import LOSSES, METRICS, read_losses as read_steps, read_records
    f = os.path.join(path, LOSSES) if os.path.isdir(path) else path
    if os.path.basename(f) == LOSSES:
        losses = dict(read_steps(f))  # a step redone by a resumed run: its later value
        if losses:
            return losses
        if not os.path.isdir(path) or os.path.isfile(f):
            raise UsageError("'{}' records no training step yet: compare once a print step has passed".format(f))
    f = os.path.join(path, METRICS) if os.path.isdir(path) else path
    if not os.path.isfile(f):
        raise UsageError("'{}' has neither {} nor {}: give the --output-dir of a training run".format(
            path, LOSSES, METRICS))
    losses = {}
    for r in read_records(f):
        for step, loss in r.get("step_losses") or ():
            losses[int(step)] = float(loss)
    if not losses:
        raise UsageError("'{}' records no training losses yet: compare once an epoch has finished".format(f))
    if log is not None:
        log("note: '{}' has no {}: the means of its printed intervals (-p) are compared".format(path, LOSSES))
    return losses


def run_losses(a, b, rtol, plot_path, force, log):
    if plot_path is not None:
        if not plot_path.lower().endswith(".png"):
            raise UsageError("--plot '{}': the plot is a PNG file; name it *.png".format(plot_path))
        if os.path.exists(plot_path) and not force:
            raise UsageError("--plot '{}' exists: pass --force to overwrite it, or give another --plot".format(
                plot_path))
        if not os.path.isdir(os.path.dirname(os.path.abspath(plot_path))):
            raise UsageError("--plot '{}': its folder does not exist".format(plot_path))
    la, lb = read_losses(a, log), read_losses(b, log)
    steps = sorted(set(la) & set(lb))
    if not steps:
        raise UsageError("RUN_A and RUN_B record losses at no common step (A: {}..{}, B: {}..{}): train both with "
                         "the same -b, -p and data".format(min(la), max(la), min(lb), max(lb)))
    gaps = [abs(la[s] - lb[s]) / max(abs(la[s]), 1e-12) if math.isfinite(la[s]) and math.isfinite(lb[s])
            else (0.0 if la[s] == lb[s] else math.inf) for s in steps]
    worst = max(range(len(steps)), key=lambda i: gaps[i])
    over = [s for s, g in zip(steps, gaps) if g > rtol]
    log("=> losses: {} common step(s) ({}..{}); largest relative gap {:.3e} at step {} (A {:.6g}, B {:.6g})".format(
        len(steps), steps[0], steps[-1], gaps[worst], steps[worst], la[steps[worst]], lb[steps[worst]]))
    if plot_path is not None:
        plot_gap(steps, [la[s] for s in steps], [lb[s] for s in steps], gaps, rtol, plot_path, (a, b))
        log("=> plot: {}".format(os.path.abspath(plot_path)))
    if over:
        log("=> the gap first exceeds --rtol {:g} at step {} ({} of {} steps over)".format(rtol, over[0], len(over),
                                                                                         len(steps)))
        return 1
    log("=> within --rtol {:g} at every common step".format(rtol))
    return 0


# ---------------------------------------------------------------- config


def read_summary(path):
    f = os.path.join(path, "summary.json") if os.path.isdir(path) else path
    try:
        with open(f) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise UsageError("'{}' has no readable summary.json ({}): give the --output-dir of a run".format(
            path, str(exc).splitlines()[0][:120]))


def _msprobe_checks(ea, eb, pa, pb):
    """msprobe config check's env and pip comparisons of the recorded lists: [(what, name, A, B, level)]."""
    try:
        from msprobe.core.config_check.checkers import env_args_checker, pip_checker
    except ImportError:
        return None
    _quiet()
    tmp = tempfile.mkdtemp(prefix="align-config-")
    try:
        paths = {}
        for key, data in (("env_a", ea), ("env_b", eb)):
            paths[key] = os.path.join(tmp, key + ".json")
            with open(paths[key], "w") as f:
                json.dump(data, f)
        for key, data in (("pip_a", pa), ("pip_b", pb)):
            paths[key] = os.path.join(tmp, key + ".txt")
            with open(paths[key], "w") as f:
                f.write("".join("{}={}\n".format(k, v) for k, v in data.items()))
        out = []
        env = env_args_checker.compare_env_data(paths["env_b"], paths["env_a"])  # (cmp, bench)
        for r in env.itertuples(index=False):
            out.append(("environment", r[0] if r[0] else r[1], r[2], r[3], r[4]))
        pip = pip_checker.compare_pip_data(paths["pip_a"], paths["pip_b"])  # (bench, cmp)
        for r in pip.itertuples(index=False):
            out.append(("package", r[0], r[1], r[2], r[3]))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_config(a, b, log):
    sa, sb = read_summary(a), read_summary(b)
    xa, xb = sa.get("alignment") or {}, sb.get("alignment") or {}
    diffs = []  # (what, name, A, B, level)
    ca, cb = sa.get("config") or {}, sb.get("config") or {}
    for k in sorted(set(ca) | set(cb)):
        if k not in MACHINE_KEYS and ca.get(k) != cb.get(k):
            diffs.append(("hyper-parameter", k, ca.get(k), cb.get(k), "error"))
    for k in ("seed", "deterministic", "weights_sha256", "batches_sha256"):
        if xa.get(k) != xb.get(k):
            diffs.append(("alignment", k, xa.get(k), xb.get(k), "error"))
    for k in ("world_size", "global_batch_size"):
        if sa.get(k) != sb.get(k):
            diffs.append(("run", k, sa.get(k), sb.get(k), "error"))
    amp_a, amp_b = sa.get("amp") or {}, sb.get("amp") or {}
    for k in ("enabled", "dtype", "loss_scale"):  # the precision trained in (its implementation is the device's)
        if amp_a.get(k) != amp_b.get(k):
            diffs.append(("run", "amp " + k, amp_a.get(k), amp_b.get(k), "error"))
    va, vb = sa.get("versions") or {}, sb.get("versions") or {}
    for k in sorted(set(va) | set(vb)):
        if va.get(k) != vb.get(k):
            diffs.append(("version", k, va.get(k), vb.get(k), "warning"))
    checked = _msprobe_checks(xa.get("environment") or {}, xb.get("environment") or {}, xa.get("packages") or {},
                              xb.get("packages") or {})
    notes = []
    if not xa or not xb:
        notes.append("{} records no fingerprints: run it with --deterministic (or --precision-dump)".format(
            " and ".join(n for n, x in (("RUN_A", xa), ("RUN_B", xb)) if not x)))
    if checked is None:
        notes.append("msprobe is not installed: environment and packages not compared (pip install "
                     "mindstudio-probe==26.2.0)")
    else:
        diffs.extend(checked)
    log("=> config: RUN_A {} ({} on {}) vs RUN_B {} ({} on {})".format(
        a, sa.get("arch"), sa.get("device"), b, sb.get("arch"), sb.get("device")))
    for what, name, va_, vb_, level in diffs:
        log("  {:<8} {:<16} {:<24} A {}  B {}".format(level, what, name, _short(va_), _short(vb_)))
    for n in notes:
        log("note: " + n)
    errors = [d for d in diffs if d[4] == "error"]
    if errors:
        log("=> {} difference(s) that change the numerics ({} other)".format(len(errors), len(diffs) - len(errors)))
        return 1
    log("=> same hyper-parameters, seed, initial weights and first batches{}".format(
        " ({} other difference(s): versions, environment)".format(len(diffs)) if diffs else ""))
    return 0


def _short(v):
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- command line


def build_parser():
    p = options.UsageParser(prog="align.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="{compare,losses,config}")
    sub.required = True
    c = sub.add_parser("compare", help="msprobe's comparison of two --precision-dump folders, with a verdict")
    c.add_argument("golden", metavar="GOLDEN", help="the reference run's --precision-dump folder (GPU or CPU)")
    c.add_argument("target", metavar="TARGET", help="the compared run's --precision-dump folder (NPU)")
    c.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="msprobe's full results (a CSV per step and rank) go here (default: a new folder "
                        "compare_<golden>_vs_<target>[_N] beside TARGET's dump folder)")
    c.add_argument("--top", type=options.number(int, 1), default=10, help="rows of the worst list")
    c.add_argument("--force", action="store_true", help="replace the results in a non-empty -o")
    loss = sub.add_parser("losses", help="the per-step training losses of two runs")
    loss.add_argument("run_a", metavar="RUN_A", help="--output-dir (or step_losses.csv) of the reference run")
    loss.add_argument("run_b", metavar="RUN_B", help="--output-dir (or step_losses.csv) of the compared run")
    loss.add_argument("--rtol", type=options.number(float, 0.0), default=0.01,
                      help="largest relative gap |a - b| / |a| accepted at a step")
    loss.add_argument("--plot", default=None, metavar="FILE.png", help="both curves and the gap, as a PNG")
    loss.add_argument("--force", action="store_true", help="overwrite an existing --plot")
    cfg = sub.add_parser("config", help="what differs between two runs' configurations")
    cfg.add_argument("run_a", metavar="RUN_A", help="--output-dir (or summary.json) of the reference run")
    cfg.add_argument("run_b", metavar="RUN_B", help="--output-dir (or summary.json) of the compared run")
    return p


def run(args, out=None):
    log = functools.partial(print, file=out, flush=True)
    if args.command == "compare":
        return run_compare(args.golden, args.target, args.output, args.top, args.force, log)
    if args.command == "losses":
        return run_losses(args.run_a, args.run_b, args.rtol, args.plot, args.force, log)
    return run_config(args.run_a, args.run_b, log)


def main(argv=None):
    return errors.run(lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
