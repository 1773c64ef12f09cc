"""Acceptance figures of a training run, computed from its summary.json (never grepped from logs).

    python3 -m tools.acceptance report --summary OUT/summary.json --network resnet50 --rank-size 8 \\
        --batch-size 4096 --mode acc --out-dir OUT [--baseline published|FILE --arch resnet50 \\
        --acc-tolerance 1.0 --fps-ratio 0.9]
    python3 -m tools.acceptance check --summary OUT/summary.json --baseline published [--arch resnet50 \\
        --rank-size 8 --mode acc --precision O2]
    python3 -m tools.acceptance baseline --baseline published --arch resnet50 --rank-size 8 --mode acc

report   prints ModelZoo's three result lines and writes ``<CaseName>.log`` (ModelZoo's keys, one
         ``key = value`` per line) and ``train_<CaseName>_loss.txt`` (the loss of every printed training step,
         from metrics.jsonl) next to summary.json; with --baseline it then runs the check.
check    one PASS / FAIL / SKIP line per metric against a baseline table; exit 3 on any FAIL. The run's arch,
         rank size, mode and precision are the summary's (``arch``, ``world_size``; ``perf`` for a run that did not
         validate, ``acc`` otherwise; ``fp32`` without --amp, else its opt level); flags given override them.
align    a run against a reference run (the guides' loss alignment: part of the epochs on the NPU against
         the GPU's): per common epoch, the mean training loss within --loss-rtol (0.05) of the reference's and
         Acc@1 at most --acc-tolerance below it; one PASS / FAIL line per epoch; exit 3 on any FAIL.
             python3 -m tools.acceptance align --run NPU_OUT --reference GPU_OUT [--epochs 5]
baseline checks, before a run, that the table has an entry for the arch x rank size.

Baseline tables are JSON (shipped: ``published`` names ``baselines/published.json``, ModelZoo's figures of
today; ``published-2023`` names ``baselines/published_2023.json``, those of its 2023 READMEs) or CSV with the
header ``arch,rank_size,acc1,fps`` (more columns are ignored, ``source`` is shown; ``precision`` picks among
entries of one arch x rank size, by the run's --precision).
``--baseline recipe`` judges a run trained with ``main.py --recipe NAME`` against the published result
trainer/recipes.json records for that recipe (its ``expect``: FFCV's top-1 for ``resnet50_ffcv_16`` and the others,
MLPerf's target for ``resnet50_mlperf_lars``; ``fast`` is judged against the FFCV recipe of the run's network and
epochs), whatever the rank size, with the published table's tolerances; ``recipe:NAME`` names the recipe (and,
with ``baseline``, checks before a run that it has a result). A run of other epochs or another network than the
recipe's result is bad input (exit 2).
Tolerances: accuracy passes when ``acc1 >= baseline - acc_tolerance`` (points, default 1.0); FPS
passes when ``fps >= fps_ratio x baseline`` (default 0.9). The command line wins over the table's
``tolerances``, which win over these defaults.

Exit codes: 0 success, 1 the run did not finish (summary status not ok), 2 bad input, 3 FAIL.
The tables and the recipes' results are read by modelzoo/baselines.py.
"""
import argparse
import collections
import json
import math
import os
import platform
import sys

from modelzoo.baselines import (DEFAULT_ACC_TOLERANCE, DEFAULT_FPS_RATIO, EXIT_FAIL, EXIT_OK, EXIT_RUN_FAILED,  # noqa: F401
                                EXIT_USAGE, PUBLISHED, RECIPE, ROOT, TABLES, AcceptanceError, RunFailed,
                                check_acc_tolerance, check_fps_ratio, find_baseline, is_recipe_spec, load_baselines,
                                normalize_arch, recipe_baseline, resolve_baseline_path)

# ModelZoo's ${CaseName}.log keys, in ModelZoo's order (CompileTime: the scripts that write it add it last)
CASE_KEYS = ("Network", "RankSize", "BatchSize", "DeviceType", "CaseName", "ActualFPS", "TrainingTime",
             "TrainAccuracy", "ActualLoss", "E2ETrainingTime", "CompileTime")
MODES = ("acc", "perf")
MISSING = "n/a"

# ---------------------------------------------------------------- summary.json


def read_summary(path, require_ok=True):
    """The run's summary.json as a dict; RunFailed unless its status is ``ok``."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise AcceptanceError("no summary at '{}': the run wrote none (see its train_*.log)".format(path))
    except (OSError, ValueError) as exc:
        raise AcceptanceError("cannot read summary '{}': {}".format(path, str(exc).splitlines()[0]))
    if not isinstance(data, dict):
        raise AcceptanceError("summary '{}' is not a JSON object".format(path))
    if require_ok and data.get("status") != "ok":
        raise RunFailed("the run did not finish: '{}' has status '{}'{}".format(
            path, data.get("status"), ": {}".format(data["error"]) if data.get("error") else ""))
    return data


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _fmt(value, spec):
    number = _number(value)
    return MISSING if number is None else spec.format(number)


def device_type():
    """ModelZoo's DeviceType: ``uname -m`` of the host (aarch64, x86_64); summary.json's device says npu/cuda/cpu."""
    return platform.machine() or MISSING


def case_name(network, batch_size, rank_size, mode):
    if mode not in MODES:
        raise AcceptanceError("mode must be one of {}, got '{}'".format("/".join(MODES), mode))
    return "{}_bs{}_{}p_{}".format(network, batch_size, rank_size, mode)


def case_values(summary, network, rank_size, batch_size, mode):
    """ModelZoo's key -> value strings, taken from summary.json."""
    values = collections.OrderedDict()
    values["Network"] = network
    values["RankSize"] = str(rank_size)
    values["BatchSize"] = str(batch_size)
    values["DeviceType"] = device_type()
    values["CaseName"] = case_name(network, batch_size, rank_size, mode)
    values["ActualFPS"] = _fmt(summary.get("train_fps"), "{:.2f}")
    values["TrainingTime"] = _fmt(summary.get("train_step_time_ms"), "{:.2f}")  # ms per step
    values["TrainAccuracy"] = _fmt(summary.get("final_acc1"), "{:.3f}")
    values["ActualLoss"] = _fmt(summary.get("last_loss"), "{:.4f}")  # the last printed step's, as ModelZoo's
    e2e = _number(summary.get("e2e_seconds"))
    values["E2ETrainingTime"] = MISSING if e2e is None else str(int(round(e2e)))
    first = summary.get("first_steps_seconds")  # ModelZoo's CompileTime: the first two training steps
    first = [_number(t) for t in first[:2]] if isinstance(first, list) else []
    values["CompileTime"] = "{:.2f}".format(sum(first)) if first and None not in first else MISSING
    return values


def step_losses(folder):
    """[loss, ...] of every printed training step, in order, from the run's metrics.jsonl (each epoch record's
    ``step_losses``: [[global_step, loss], ...]); None without a metrics.jsonl."""
    from trainer.record.observe import METRICS, read_records
    path = os.path.join(folder, METRICS)
    if not os.path.isfile(path):
        return None
    steps = {}
    for r in read_records(path):
        for pair in r.get("step_losses") or ():
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and _number(pair[1]) is not None:
                steps[int(pair[0])] = float(pair[1])  # a resumed run's repeated step: the later record wins
    return [steps[k] for k in sorted(steps)]


def write_loss_file(out_dir, case, losses):
    """ModelZoo's ``train_<CaseName>_loss.txt``: one loss per printed training step."""
    path = os.path.join(out_dir, "train_{}_loss.txt".format(case))
    with open(path + ".tmp", "w") as f:
        f.write("".join("{:.4f}\n".format(v) for v in losses))
    os.replace(path + ".tmp", path)
    return path


def write_case_log(out_dir, values):
    """``<out_dir>/<CaseName>.log``: one ``key = value`` line per ModelZoo key."""
    path = os.path.join(out_dir, values["CaseName"] + ".log")
    text = "".join("{} = {}\n".format(k, values[k]) for k in CASE_KEYS)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def read_case_log(path):
    out = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            if " = " in line:
                key, value = line.rstrip("\n").split(" = ", 1)
                out[key] = value
    return out


def final_lines(values):
    """The result lines ModelZoo's scripts print."""
    return ["------------------ Final result ------------------",
            "Final Performance images/sec : {}".format(values["ActualFPS"]),
            "Final Train Accuracy : {}".format(values["TrainAccuracy"]),
            "E2E Training Duration sec : {}".format(values["E2ETrainingTime"])]


def the_runs(summary, args):
    """(arch, rank size, mode, precision) of the run ``check`` judges: each flag given, else what the summary
    holds (``arch``; ``world_size``; ``perf`` where the run did not validate, as the performance scripts' runs,
    else ``acc``; ``fp32`` without --amp, else its opt level, None where it had none)."""
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    amp = summary.get("amp") if isinstance(summary.get("amp"), dict) else {}
    validated = config.get("validate")
    held = {"arch": summary.get("arch") if isinstance(summary.get("arch"), str) else None,
            "rank_size": summary.get("world_size") if isinstance(summary.get("world_size"), int) else None,
            "mode": None if not isinstance(validated, bool) else "acc" if validated else "perf",
            "precision": None}
    if amp.get("enabled") is False:
        held["precision"] = "fp32"
    elif amp.get("enabled"):
        held["precision"] = amp.get("opt_level") or config.get("opt_level")
    found = []
    for dest in ("arch", "rank_size", "mode", "precision"):
        value = getattr(args, dest)
        if value is None and held[dest] is None and dest != "precision":
            raise AcceptanceError("the summary '{}' does not say the run's {} (a summary of this project's main.py "
                                  "does): give --{}".format(args.summary, dest.replace("_", " "),
                                                            dest.replace("_", "-")))
        found.append(held[dest] if value is None else value)
    if found[1] < 1:
        raise AcceptanceError("--rank-size must be at least 1, got {}".format(found[1]))
    return tuple(found)


def metrics_for(mode):
    """Accuracy runs are checked on accuracy and FPS, performance runs on FPS only."""
    return ("acc1", "fps") if mode == "acc" else ("fps",)


def require_checkable(entry, mode, path):
    if not any(entry[m] is not None for m in metrics_for(mode)):
        raise AcceptanceError("the baseline for {} {}p in '{}' has no {} figure to check a{} run against".format(
            entry["arch"], entry["rank_size"], path, " or ".join(metrics_for(mode)),
            "n accuracy" if mode == "acc" else " performance"))


def check(summary, entry, mode, acc_tolerance=DEFAULT_ACC_TOLERANCE, fps_ratio=DEFAULT_FPS_RATIO):
    """[(metric, 'PASS'|'FAIL'|'SKIP', line)] for the run against one baseline entry."""
    results = []
    if mode not in MODES:
        raise AcceptanceError("mode must be one of {}, got '{}'".format("/".join(MODES), mode))
    src = " [{}]".format(entry["source"]) if entry.get("source") else ""
    if "acc1" not in metrics_for(mode):
        results.append(("acc1", "SKIP", "SKIP Acc@1: not checked on a performance run"))
    elif entry["acc1"] is None:
        results.append(("acc1", "SKIP", "SKIP Acc@1: the baseline has no accuracy figure{}".format(src)))
    else:
        got = _number(summary.get("final_acc1"))
        floor = entry["acc1"] - acc_tolerance
        status = "PASS" if got is not None and got >= floor - 1e-9 else "FAIL"
        results.append(("acc1", status, "{} Acc@1 {} vs baseline {:.3f}: needs >= {:.3f} (tolerance {:g} "
                        "point(s) below){}".format(status, MISSING if got is None else "{:.3f}".format(got),
                                                   entry["acc1"], floor, acc_tolerance, src)))
    if entry["fps"] is None:
        results.append(("fps", "SKIP", "SKIP FPS: the baseline has no FPS figure{}".format(src)))
    else:
        got = _number(summary.get("train_fps"))
        floor = entry["fps"] * fps_ratio
        status = "PASS" if got is not None and got >= floor - 1e-9 else "FAIL"
        results.append(("fps", status, "{} FPS {} vs baseline {:.2f}: needs >= {:.2f} ({:g}% of the baseline){}"
                        .format(status, MISSING if got is None else "{:.2f}".format(got), entry["fps"], floor,
                                100 * fps_ratio, src)))
    return results


def run_check(summary, spec, arch, rank_size, mode, tolerances=(None, None), out=sys.stdout, precision=None):
    """Print the PASS/FAIL lines; return 0, or 3 when any metric fails. ``tolerances``: (--acc_tolerance,
    --fps_ratio) as given, None for the baseline's own."""
    acc_tolerance, fps_ratio = tolerances
    if is_recipe_spec(spec):
        entry, tol, path = recipe_baseline(spec, summary, arch, rank_size)
    else:
        entries, tol, path = load_baselines(spec)
        entry = find_baseline(entries, arch, rank_size, path, precision)
    require_checkable(entry, mode, path)
    acc_tol = check_acc_tolerance(acc_tolerance) if acc_tolerance is not None else tol.get(
        "acc_tolerance", DEFAULT_ACC_TOLERANCE)
    ratio = check_fps_ratio(fps_ratio) if fps_ratio is not None else tol.get("fps_ratio", DEFAULT_FPS_RATIO)
    results = check(summary, entry, mode, acc_tol, ratio)
    for _, _, line in results:
        out.write("acceptance: {}\n".format(line))
    failed = [m for m, status, _ in results if status == "FAIL"]
    out.write("acceptance: {} ({} {}p, {} run, baseline '{}')\n".format(
        "FAIL: " + ", ".join(failed) if failed else "PASS", normalize_arch(arch), rank_size,
        "accuracy" if mode == "acc" else "performance", path))
    out.flush()
    return EXIT_FAIL if failed else EXIT_OK


# ---------------------------------------------------------------- loss alignment with a reference run

DEFAULT_LOSS_RTOL = 0.05  # relative difference of an epoch's mean training loss


def _epoch_records(folder):
    from trainer import interpreter
    interpreter.require(("torch",))  # the trainer's reader imports it (report, check and baseline need no torch)
    from trainer.record.observe import METRICS, read_records  # the trainer's own reader (a torn last line is ignored)
    path = os.path.join(folder, METRICS)
    if not os.path.isfile(path):
        raise AcceptanceError("'{}' has no metrics.jsonl: give the --output-dir of a run".format(folder))
    return {r["epoch"]: r for r in read_records(path) if isinstance(r.get("epoch"), int)}


def run_align(run, reference, loss_rtol, acc_tolerance, epochs, out):
    """The porting guides' precision check (001: train part of the epochs and align the loss with the GPU's):
    per epoch both runs have, the mean training loss within ``loss_rtol`` of the reference's and, where both
    validated, Acc@1 at most ``acc_tolerance`` points below it. One line per epoch; exit 3 on any FAIL."""
    mine, ref = _epoch_records(run), _epoch_records(reference)
    common = sorted(set(mine) & set(ref))[:epochs]
    if not common:
        raise AcceptanceError("'{}' and '{}' have no epoch in common to compare".format(run, reference))
    failed = []
    for e in common:
        a, b = mine[e], ref[e]
        rel = abs(a["train_loss"] - b["train_loss"]) / max(abs(b["train_loss"]), 1e-12)
        parts, ok = ["train_loss {:.4f} vs {:.4f} (relative difference {:.3f}, limit {:g})".format(
            a["train_loss"], b["train_loss"], rel, loss_rtol)], rel <= loss_rtol
        if a.get("val_acc1") is not None and b.get("val_acc1") is not None:
            ok = ok and a["val_acc1"] >= b["val_acc1"] - acc_tolerance
            parts.append("Acc@1 {:.2f} vs {:.2f} (at most {:g} below)".format(a["val_acc1"], b["val_acc1"],
                                                                             acc_tolerance))
        if not ok:
            failed.append(e)
        out.write("align: epoch {}: {} {}\n".format(e, "PASS" if ok else "FAIL", "; ".join(parts)))
    out.write("align: {} ({} epoch(s) compared with '{}')\n".format(
        "FAIL: epoch(s) " + ", ".join(map(str, failed)) if failed else "PASS", len(common), reference))
    out.flush()
    return EXIT_FAIL if failed else EXIT_OK


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise AcceptanceError(message)


def _parser():
    p = _Parser(prog="python3 -m tools.acceptance", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    sub.required = True

    def baseline_args(q, required, summary=False):
        q.add_argument("--baseline", required=required, help="'published' (today's figures), 'published-2023', a "
                       "JSON / CSV table, or 'recipe' (the published result of the run's --recipe; recipe:NAME names "
                       "one)")
        q.add_argument("--precision", default=None, help="the run's O1 / O2 / fp32: picks among entries of the "
                       "same arch x rank size" + (" (default: the summary's)" if summary else ""))
        q.add_argument("--arch", required=required and not summary, help="arch to look up" + (
            " (default: the summary's)" if summary else "" if required else " (default: --network)"))
        q.add_argument("--acc-tolerance", default=None, help="points below the baseline Acc@1 (default 1.0)")
        q.add_argument("--fps-ratio", default=None, help="fraction of the baseline FPS (default 0.9)")

    r = sub.add_parser("report", help="write <CaseName>.log and print the result lines")
    r.add_argument("--summary", required=True)
    r.add_argument("--network", required=True)
    r.add_argument("--rank-size", type=int, required=True)
    r.add_argument("--batch-size", type=int, required=True)
    r.add_argument("--mode", choices=MODES, required=True)
    r.add_argument("--out-dir", default=None, help="where <CaseName>.log goes (default: next to the summary)")
    baseline_args(r, required=False)

    c = sub.add_parser("check", help="PASS/FAIL lines against a baseline; exit 3 on FAIL")
    c.add_argument("--summary", required=True)
    c.add_argument("--rank-size", type=int, default=None, help="default: the summary's world_size")
    c.add_argument("--mode", choices=MODES, default=None,
                   help="default: the summary's (perf for a run that did not validate, else acc)")
    baseline_args(c, required=True, summary=True)

    a = sub.add_parser("align", help="a run's loss epoch by epoch against a reference run's; exit 3 on FAIL")
    a.add_argument("--run", required=True, help="the run's --output-dir (its metrics.jsonl)")
    a.add_argument("--reference", required=True, help="the reference run's --output-dir, e.g. the GPU's")
    a.add_argument("--loss-rtol", type=float, default=DEFAULT_LOSS_RTOL,
                   help="relative difference allowed in an epoch's mean training loss (default 0.05)")
    a.add_argument("--acc-tolerance", default=None, help="points of Acc@1 below the reference (default 1.0)")
    a.add_argument("--epochs", type=int, default=None, help="compare only the first N common epochs")

    b = sub.add_parser("baseline", help="check before a run that the table has an entry to compare with")
    b.add_argument("--rank-size", type=int, required=True)
    b.add_argument("--mode", choices=MODES, required=True)
    baseline_args(b, required=True)
    return p


def main(argv=None, out=sys.stdout):
    args = _parser().parse_args(argv)
    if args.acc_tolerance is not None:
        check_acc_tolerance(args.acc_tolerance)
    if getattr(args, "fps_ratio", None) is not None:
        check_fps_ratio(args.fps_ratio)
    if args.command == "align":
        if not args.loss_rtol >= 0 or (args.epochs is not None and args.epochs < 1):
            raise AcceptanceError("--loss-rtol must be at least 0 and --epochs at least 1")
        return run_align(args.run, args.reference, args.loss_rtol,
                         DEFAULT_ACC_TOLERANCE if args.acc_tolerance is None else float(args.acc_tolerance),
                         args.epochs, out)
    if args.command == "baseline":
        if is_recipe_spec(args.baseline):
            if args.baseline == RECIPE:
                raise AcceptanceError("before a run, name the recipe: --baseline recipe:NAME")
            entry, _, path = recipe_baseline(args.baseline, None, args.arch, args.rank_size)
        else:
            entries, _, path = load_baselines(args.baseline)
            entry = find_baseline(entries, args.arch, args.rank_size, path, args.precision)
        require_checkable(entry, args.mode, path)
        return EXIT_OK
    summary = read_summary(args.summary)
    if args.command == "check":
        arch, rank_size, mode, precision = the_runs(summary, args)
        return run_check(summary, args.baseline, arch, rank_size, mode, (args.acc_tolerance, args.fps_ratio), out,
                         precision)
    values = case_values(summary, args.network, args.rank_size, args.batch_size, args.mode)
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.summary))
    for line in final_lines(values):
        out.write(line + "\n")
    path = write_case_log(out_dir, values)
    out.write("case log: {}\n".format(path))
    losses = step_losses(os.path.dirname(os.path.abspath(args.summary)))
    if losses is not None:
        out.write("loss log: {}\n".format(write_loss_file(out_dir, values["CaseName"], losses)))
    out.flush()
    if args.baseline:
        return run_check(summary, args.baseline, args.arch or args.network, args.rank_size, args.mode,
                         (args.acc_tolerance, args.fps_ratio), out, args.precision)
    return EXIT_OK


def cli(argv=None):
    """The command line (tools/acceptance.py): main's exit code; bad input is one ``error:`` line."""
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except AcceptanceError as exc:
        sys.stderr.write("error: {}\n".format(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
        return exc.exit_code
