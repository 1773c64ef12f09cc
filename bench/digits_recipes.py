#!/usr/bin/env python3
"""Time to accuracy on real images: pytorch/examples' recipe against ``--recipe fast``, and each technique's step cost.

    python3 -m bench.digits_recipes [--epochs 8] [--seeds 1 2 3] [--arch resnet18] [--size 96] [-b 64]
                                    [--threads 1] [--workers 1] [--steps 12] [--rounds 2]
                                    [--only accuracy|techniques|lr] [--fast-flags "FLAGS"] [--work-dir DIR]
                                    [--lr-batches 32 64 256] [--lr-grid 0.025 0.05 0.1 0.2 0.4] [--lr-epochs 6]
                                    [--lr-size 32]
                                    [--json FILE] [--smoke] [--data DIR]

Needs scikit-learn, whose package ships the digits (``pip install scikit-learn``; the trainer itself does not
need it, so it is not in requirements.txt).

The data: scikit-learn's handwritten digits (1,797 real 8x8 scans, 10 classes) written out by
``tools/make_dataset.py --digits`` as an image folder of --size px PNGs, split 80/20 per class with seed 0
(1,438 train, 359 val images). --data DIR uses an image folder already written instead (one of --size px
images: the tests' digit-like scans where scikit-learn is missing).

Accuracy: for each seed, main.py trains the same model with the same batch twice, in one process each:
``examples``, pytorch/examples' recipe as this trainer runs it without --recipe (SGD, momentum 0.9, weight decay
1e-4, lr 0.1 x batch / 256, the step schedule: x0.1 every 30 epochs) for 2 x --epochs epochs, and ``fast``,
``--recipe fast`` for --epochs epochs. The two alternate, and which goes first alternates from seed to seed, so
that a busy machine slows both alike. Both are given --train-crop-size --size: ``examples`` trains at that size
throughout and validates at --val-crop-size --size after --val-resize-size --size x 256 / 224; ``fast`` takes it
as the last size of its resolution ramp (from the multiple of 32 at or below FFCV's 160/192 of it: 64 px for 96)
and validates at the size the recipe scales to it (under 128 px the size itself).
Every run has OMP_NUM_THREADS=--threads and -j --workers: on a small machine shared with other work one compute
thread per process is much less exposed to the others than threads that wait for each other. A run that finished
ok in --work-dir with the same command and threads is read again, not rerun (so an interrupted bench continues).

The target of a seed is the Acc@1 that ``examples`` reaches after its last epoch (2 x --epochs); ``fast`` reaches
it at the end of the first of its epochs whose Acc@1 is at least the target. Times are training time only:
the sum of the epochs' ``seconds`` in metrics.jsonl (the trainer's epoch time, from the first batch to the end
of the last step), validation and checkpoints excluded, alike for both recipes. Reported per seed and as the
median over seeds: ``fast``'s time to the target and its whole run, each divided by ``examples``' whole run.
The claim under test: ``fast`` reaches the target within --epochs epochs in at most a third of the time.
--fast-flags adds main.py flags to the ``fast`` leg (they win over the recipe's), e.g. to validate it at
``examples``' sizes.

Techniques: short runs (one epoch of --steps steps, the first 4 left out of the step time, then one validation)
of the plain step, pytorch/examples' own (NCHW, float32, plain cross-entropy, fixed resolution, no average), and
of the plain step with one of ``--recipe fast``'s techniques added, each --rounds times in rotating order. A
technique's cost is its median step time (summary.json's train_step_time_ms) divided by the plain step's;
``--val-tta flip`` costs at validation, so its row compares validation batch times (the Test lines' times,
batches after the first). ``--model-ema`` updates its average every 32 steps (--model-ema-steps' default): its
run updates it every step, and the row for every 32 steps is derived from it (1 + (ratio - 1) / 32). The resolution
ramp's row is the plain step at each epoch's size of the ramp that ``--recipe fast --train-crop-size --size``
trains for --epochs epochs, averaged over the epochs. ``fast (all)`` is ``--recipe fast``'s own step at --size.

The LR at batches FFCV did not publish (``--only lr``, not part of the default run): ``--recipe fast --epochs
--lr-epochs --train-crop-size --lr-size`` (a size without a ramp: 32 px trains and validates at 32 px) at each batch
of --lr-batches, once with each LR of: the recipe's own rule at that batch (trainer/recipes.py), the linear rule
(FFCV's LR x batch / FFCV's batch), the square-root rule (FFCV's LR x sqrt(batch / FFCV's batch)), pytorch/examples'
default 0.1, and each of --lr-grid. Reported per batch and LR: Acc@1 after the last epoch and the best epoch's,
averaged over --seeds. The tuned LR of a batch is the best of all those tried, by the mean final Acc@1.

--smoke: the smallest run of every part (one seed, 1 and 2 epochs of 4 steps at 64 px; one round of 6-step
runs of the plain step, model-ema, val-tta, the ramp's sizes and fast) that checks the bench works; its figures
mean nothing. With ``--only lr``: batch 16, the rules' LRs and 0.1 (no grid), 1 epoch of 4 steps at 32 px.
"""
import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from tools.make_dataset import digits
from trainer import recipes
from trainer.config import FFCV_CROP_RATIO

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

THREADS = [1]  # OMP_NUM_THREADS of every run (--threads)
FPS_WARMUP = 4  # steps of each technique run left out of its step time
SMOKE_ROWS = ("plain", "model-ema, every step", "val-tta flip", "fast (all)")
EMA_STEPS = 32  # --model-ema-steps' default
FFCV_RECIPE = "resnet18_ffcv_16"  # what --recipe fast takes its values from for a resnet18
CONFIG_KEYS = ("lr", "epochs", "lr_schedule", "lr_peak_epoch", "warmup_epochs", "label_smoothing", "weight_decay",
               "norm_weight_decay", "momentum", "optimizer", "model_ema", "channels_last", "min_res", "max_res",
               "start_ramp", "end_ramp", "val_tta", "blurpool", "train_crop_size", "val_resize_size", "val_crop_size")
EXAMPLES_LR = 0.1  # pytorch/examples' default --lr
LR_GRID = (0.025, 0.05, 0.1, 0.2, 0.4)  # --lr-grid's default
LR_BATCHES = (32, 64, 256)  # --lr-batches' default
TEST_LINE = re.compile(r"^Test: \[\s*(\d+)/(\d+)\]\s+Time\s+([0-9.]+)")


def machine():
    """CPU model, cores, versions."""
    import torch
    model, flags = platform.processor() or "unknown", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", platform.machine()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores, "avx512": " avx512f" in flags, "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def train(data, out, args, log):
    """main.py DATA ARGS --output-dir OUT in a fresh process; (summary.json, metrics.jsonl records, stdout,
    wall seconds). A run that fails ends the bench."""
    cmd = [sys.executable, os.path.join(ROOT, "main.py"), data] + [str(a) for a in args] + [
        "--output-dir", out, "--no-tensorboard", "--progress", "lines"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(THREADS[0]))
    done = _finished(out, cmd, env["OMP_NUM_THREADS"])
    if done is not None:  # the same run finished in --work-dir before: read, not rerun
        proc, wall = done
    else:
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.time() - t0
        with open(out + ".log", "w") as f:
            f.write(" ".join(cmd) + "\n" + "OMP_NUM_THREADS={} wall_seconds={:.1f}\n".format(
                env["OMP_NUM_THREADS"], wall) + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit("{} failed (exit {}); log: {}.log\n{}".format(os.path.basename(out), proc.returncode, out,
                                                                      proc.stderr[-2000:]))
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    records = []
    path = os.path.join(out, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    log("  {:<28} {:6.1f} s{}".format(os.path.basename(out), wall, "  Acc@1 {:.1f}".format(summary["final_acc1"])
                                      if summary.get("final_acc1") is not None else ""))
    return summary, records, proc.stdout, wall


def _finished(out, cmd, threads):
    """(a stand-in for the finished process, its wall seconds) where ``out`` holds a run of the same command and
    thread count that ended ok (its log's first lines and summary.json say so), else None."""
    try:
        with open(out + ".log") as f:
            first, second = f.readline().rstrip("\n"), f.readline().split()
            rest = f.read()
        with open(os.path.join(out, "summary.json")) as f:
            status = json.load(f).get("status")
    except (OSError, ValueError):
        return None
    if first != " ".join(cmd) or status != "ok" or second[:1] != ["OMP_NUM_THREADS={}".format(threads)]:
        return None
    return subprocess.CompletedProcess(cmd, 0, rest, ""), float(second[1].split("=")[1])


def curve(records):
    """[{epoch, seconds (cumulative training time), acc1, ema_acc1}] of a run's epochs."""
    out, total = [], 0.0
    for r in records:
        total += r["seconds"]
        out.append({"epoch": r["epoch"] + 1, "seconds": total, "epoch_seconds": r["seconds"], "lr": r["lr"],
                    "acc1": r["val_acc1"], "ema_acc1": r.get("ema_val_acc1")})
    return out


def time_to(points, target, key="acc1"):
    """(epoch, cumulative training seconds) at the end of the first epoch whose ``key`` >= target, or (None, None)."""
    for p in points:
        if p.get(key) is not None and p[key] >= target:
            return p["epoch"], p["seconds"]
    return None, None


def val_batch_seconds(stdout):
    """The validation batch times of a run's Test lines (-p 1), batches after the first of each pass."""
    times = []
    for line in stdout.splitlines():
        m = TEST_LINE.match(line)
        if m and int(m.group(1)) > 1:
            times.append(float(m.group(3)))
    return times


def sizes(a):
    val_resize = int(round(a.size / FFCV_CROP_RATIO))
    return ["--train-crop-size", a.size, "--val-resize-size", val_resize, "--val-crop-size", a.size]


def accuracy(a, data, work, log):
    common = ["-a", a.arch, "-b", a.batch_size, "-j", a.workers, "-p", 1000] + a.extra
    examples = common + sizes(a) + ["--lr", "{:.6g}".format(0.1 * a.batch_size / 256.0), "--epochs", 2 * a.epochs]
    fast = common + ["--train-crop-size", a.size, "--recipe", "fast", "--epochs", a.epochs] + shlex.split(a.fast_flags)
    seeds = []
    for i, seed in enumerate(a.seeds):
        legs = [("examples", examples), ("fast", fast)]
        runs = {}
        for name, args in (legs if i % 2 == 0 else legs[::-1]):
            summary, records, _, wall = train(data, os.path.join(work, "{}-seed{}".format(name, seed)),
                                              args + ["--seed", seed], log)
            runs[name] = {"curve": curve(records), "wall_seconds": wall, "e2e_seconds": summary.get("e2e_seconds"),
                          "final_acc1": summary.get("final_acc1"), "lr": summary.get("lr"),
                          "config": {k: summary["config"][k] for k in CONFIG_KEYS if k in summary["config"]}}
        ex, fa = runs["examples"], runs["fast"]
        target = ex["curve"][-1]["acc1"]
        ex_seconds = ex["curve"][-1]["seconds"]
        epoch, seconds = time_to(fa["curve"], target)
        ema_epoch, ema_seconds = time_to(fa["curve"], target, "ema_acc1")
        seeds.append({
            "seed": seed, "target_acc1": target, "examples_seconds": ex_seconds,
            "fast_final_acc1": fa["curve"][-1]["acc1"], "fast_seconds": fa["curve"][-1]["seconds"],
            "fast_epochs_to_target": epoch, "fast_seconds_to_target": seconds,
            "ratio_to_target": seconds / ex_seconds if seconds is not None else None,
            "ratio_whole_run": fa["curve"][-1]["seconds"] / ex_seconds,
            "fast_ema_epochs_to_target": ema_epoch,
            "ratio_to_target_ema": ema_seconds / ex_seconds if ema_seconds is not None else None,
            "runs": runs})
    return seeds


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def techniques(a, data, work, log):
    """{row: {median ms, ratio}} of the plain step and of each technique added to it alone."""
    base = ["-a", a.arch, "-b", a.batch_size, "-j", a.workers, "--epochs", 1, "--max-steps-per-epoch", a.steps,
            "--fps-warmup-steps", FPS_WARMUP, "-p", 1, "--seed", 0, "--lr", "{:.6g}".format(0.1 * a.batch_size / 256.0),
            "--val-resize-size", int(round(a.size / FFCV_CROP_RATIO)), "--val-crop-size", a.size] + a.extra
    plain = ["--no-channels-last", "--train-crop-size", a.size]
    variants = [("plain", plain),
                ("channels-last", ["--channels-last", "--train-crop-size", a.size]),
                ("blurpool", plain + ["--blurpool"]),
                ("label smoothing", plain + ["--label-smoothing", recipes.get(FFCV_RECIPE)["label_smoothing"]]),
                ("model-ema, every step", plain + ["--model-ema", "--model-ema-steps", 1]),
                ("val-tta flip", plain + ["--val-tta", "flip"])]
    ramp = ramp_sizes(a.size, a.epochs)
    for size in sorted(set(ramp)):
        if size != a.size:
            variants.append(("plain at {} px".format(size), ["--no-channels-last", "--train-crop-size", size]))
    # the recipe's step at --size (a 1-epoch run of --train-crop-size --size would train at the ramp's low size)
    variants.append(("fast (all)", ["--recipe", "fast", "--min-res", a.size, "--max-res", a.size]))
    if a.smoke:
        variants = [v for v in variants if v[0] in SMOKE_ROWS or v[0].startswith("plain at ")]
    times = {name: [] for name, _ in variants}
    val_times = {name: [] for name, _ in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, extra in order:
            slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
            summary, _, stdout, _ = train(data, os.path.join(work, "step-{}-r{}".format(slug, r)), base + extra, log)
            times[name].append(summary["train_step_time_ms"])
            val_times[name].append(median_or_none(val_batch_seconds(stdout)))
    plain_ms, plain_val = statistics.median(times["plain"]), median_or_none(val_times["plain"])
    rows = {}
    for name, _ in variants:
        ms, val = statistics.median(times[name]), median_or_none(val_times[name])
        rows[name] = {"step_ms": ms, "step_ms_runs": times[name], "ratio": ms / plain_ms,
                      "val_batch_ms": 1000 * val if val is not None else None,
                      "val_ratio": val / plain_val if val and plain_val else None}
    every = rows["model-ema, every step"]
    rows["model-ema, every {} steps (derived)".format(EMA_STEPS)] = {
        "step_ms": plain_ms + (every["step_ms"] - plain_ms) / EMA_STEPS,
        "ratio": 1.0 + (every["ratio"] - 1.0) / EMA_STEPS, "derived_from": "model-ema, every step"}
    at = {s: (rows["plain at {} px".format(s)]["step_ms"] if s != a.size else plain_ms) for s in ramp}
    ms = statistics.mean(at[s] for s in ramp)
    rows["resolution ramp, {} epochs at {}".format(len(ramp), "/".join(
        "{} px x{}".format(s, ramp.count(s)) for s in sorted(set(ramp))))] = {
        "step_ms": ms, "ratio": ms / plain_ms, "sizes": ramp}
    return rows


def ramp_sizes(size, epochs):
    """The training size of each of ``epochs`` epochs of ``--recipe fast --train-crop-size size --epochs epochs``:
    the recipe's ramp up to ``size`` (trainer/recipes.py, ffcv_sizes and ffcv_ramp), or ``size`` throughout where
    it has none (one epoch)."""
    from trainer.data.resolution import ResolutionSchedule
    sizes, ramp = recipes.ffcv_sizes(size, recipes.get(FFCV_RECIPE)), recipes.ffcv_ramp(epochs)
    if sizes is None or ramp is None:
        return [size] * epochs
    schedule = ResolutionSchedule(sizes[0], sizes[1], *ramp)
    return [schedule(e) for e in range(epochs)]


def lr_candidates(arch, batch, grid):
    """[(LR, [names])] tried at ``batch``: the recipe's rule, the linear and square-root rules from FFCV's batch, the
    examples' default and the grid, each LR once."""
    source = recipes.get(recipes.base_of("fast", arch))
    rule = recipes.scale(recipes.base_of("fast", arch), 1, {"batch_size": batch})[0]["lr"]
    named = [("recipe rule", rule), ("linear", source["lr"] * batch / float(source["batch_size"])),
             ("square root", source["lr"] * (batch / float(source["batch_size"])) ** 0.5),
             ("examples' default", EXAMPLES_LR)] + [("grid", g) for g in grid]
    out = {}
    for name, lr in named:
        out.setdefault(float("{:.4g}".format(lr)), []).append(name)
    return sorted(out.items())


def lr_rule(a, data, work, log):
    """{batch: {"lrs": [{lr, names, final_acc1, best_acc1, per seed}], "tuned": lr, ...}}: --recipe fast at each
    batch with each candidate LR (``lr_candidates``)."""
    out = {}
    for batch in a.lr_batches:
        rows = []
        for lr, names in lr_candidates(a.arch, batch, a.lr_grid):
            finals, bests, seconds = [], [], []
            for seed in a.seeds:
                args = ["-a", a.arch, "-b", batch, "-j", a.workers, "-p", 1000, "--recipe", "fast", "--epochs",
                        a.lr_epochs, "--train-crop-size", a.lr_size, "--lr", "{:.4g}".format(lr),
                        "--seed", seed] + a.extra
                summary, records, _, _ = train(data, os.path.join(work, "lr-b{}-lr{:.4g}-seed{}".format(
                    batch, lr, seed)), args, log)
                points = curve(records)
                finals.append(points[-1]["acc1"])
                bests.append(max(p["acc1"] for p in points))
                seconds.append(points[-1]["seconds"])
            rows.append({"lr": lr, "names": names, "final_acc1": statistics.mean(finals), "best_acc1":
                         statistics.mean(bests), "final_acc1_seeds": finals, "best_acc1_seeds": bests,
                         "train_seconds": statistics.mean(seconds)})
        tuned = max(rows, key=lambda r: r["final_acc1"])
        pick = {name: next(r for r in rows if name in r["names"]) for name in ("recipe rule", "linear", "square root",
                                                                              "examples' default")}
        out[str(batch)] = {"lrs": rows, "tuned_lr": tuned["lr"], "tuned_final_acc1": tuned["final_acc1"],
                           "by_name": {k: {"lr": v["lr"], "final_acc1": v["final_acc1"], "best_acc1": v["best_acc1"]}
                                       for k, v in pick.items()}}
    return out


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def report(result, log):
    acc = result.get("accuracy")
    if acc:
        log("\n| seed | examples: epochs, Acc@1 (target), train s | fast: epochs, Acc@1, train s | "
            "fast: epochs to target, s | to target / examples | whole fast run / examples |")
        log("| --- | --- | --- | --- | ---: | ---: |")
        for s in acc["seeds"]:
            ex, fa = s["runs"]["examples"]["curve"], s["runs"]["fast"]["curve"]
            log("| {} | {}, {:.1f}, {:.0f} | {}, {:.1f}, {:.0f} | {}, {} | {} | {:.3f} |".format(
                s["seed"], len(ex), s["target_acc1"], s["examples_seconds"], len(fa), s["fast_final_acc1"],
                s["fast_seconds"], fmt(s["fast_epochs_to_target"], "{}"), fmt(s["fast_seconds_to_target"], "{:.0f}"),
                fmt(s["ratio_to_target"], "{:.3f}"), s["ratio_whole_run"]))
        log("median over seeds: to target / examples {}, whole fast run / examples {}; fast reached the target in {} "
            "of {} seeds; claim (at most 1/3, target reached in every seed): {}".format(
                fmt(acc["median_ratio_to_target"], "{:.3f}"), fmt(acc["median_ratio_whole_run"], "{:.3f}"),
                acc["reached"], len(acc["seeds"]), "holds" if acc["claim_holds"] else "does not hold"))
    lr = result.get("lr")
    if lr:
        log("\n| batch | lr | which | Acc@1 after the last epoch | best epoch's Acc@1 | train s |")
        log("| ---: | ---: | --- | ---: | ---: | ---: |")
        for batch, b in lr.items():
            for r in b["lrs"]:
                log("| {} | {:.4g} | {} | {:.1f} | {:.1f} | {:.0f} |".format(
                    batch, r["lr"], ", ".join(r["names"]) + (" (tuned)" if r["lr"] == b["tuned_lr"] else ""),
                    r["final_acc1"], r["best_acc1"], r["train_seconds"]))
    tech = result.get("techniques")
    if tech:
        log("\n| step | median ms | / plain | val batch ms | / plain |")
        log("| --- | ---: | ---: | ---: | ---: |")
        for name, r in tech.items():
            log("| {} | {:.1f} | {:.3f} | {} | {} |".format(name, r["step_ms"], r["ratio"],
                                                          fmt(r.get("val_batch_ms"), "{:.1f}"),
                                                          fmt(r.get("val_ratio"), "{:.3f}")))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8, help="fast's epochs; examples trains twice as many")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("-a", "--arch", default="resnet18")
    p.add_argument("--size", type=int, default=96, help="image size of the data set and the training crop")
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run")
    p.add_argument("--workers", type=int, default=1, help="-j of every run")
    p.add_argument("--steps", type=int, default=12, help="steps of each technique run")
    p.add_argument("--rounds", type=int, default=2, help="technique runs of each kind, in rotating order")
    p.add_argument("--only", choices=("accuracy", "techniques", "lr"), default=None,
                   help="one part (default: accuracy and techniques; lr runs only when named)")
    p.add_argument("--lr-batches", type=int, nargs="+", default=list(LR_BATCHES), help="--only lr: the batches")
    p.add_argument("--lr-grid", type=float, nargs="*", default=list(LR_GRID), help="--only lr: the LRs tried "
                                                                                     "besides the rules' and 0.1")
    p.add_argument("--lr-epochs", type=int, default=6, help="--only lr: the epochs of each run")
    p.add_argument("--lr-size", type=int, default=32, help="--only lr: the training and test size")
    p.add_argument("--fast-flags", default="", help="main.py flags added to the fast leg (they win over the recipe's)")
    p.add_argument("--work-dir", default=None, help="runs and the data set go here (default: a new temporary "
                                                    "folder)")
    p.add_argument("--json", default=None)
    p.add_argument("--data", default=None, help="an image folder of --size px images to use instead of the digits")
    p.add_argument("--smoke", action="store_true", help="the smallest run of every part; its figures mean nothing")
    a = p.parse_args(argv)
    a.extra = []
    if a.smoke:
        a.epochs, a.seeds, a.size, a.steps, a.rounds = 1, a.seeds[:1], 64, FPS_WARMUP + 2, 1
        a.extra, a.workers = ["--max-steps-per-epoch", 4], 0
        a.lr_batches, a.lr_grid, a.lr_epochs, a.lr_size = [16], [], 1, 32
    if a.only == "lr":
        a.size = a.lr_size  # the size of the digits written (or of --data) is the size trained
    for name in ("epochs", "size", "batch_size", "rounds", "threads", "lr_epochs", "lr_size"):
        if getattr(a, name) < 1:
            p.error("--{} must be at least 1".format(name.replace("_", "-")))
    if a.steps <= FPS_WARMUP:
        p.error("--steps must be above {} (the steps left out of the step time)".format(FPS_WARMUP))
    THREADS[0] = a.threads
    work = a.work_dir or tempfile.mkdtemp(prefix="digits-recipes-")
    os.makedirs(work, exist_ok=True)
    data = a.data or os.path.join(work, "digits-{}".format(a.size))
    try:
        if not os.path.isdir(data):
            digits(data, size=a.size)
    except ValueError as exc:
        sys.stderr.write("error: {}\n".format(exc))
        return 2

    def log(line):
        print(line, flush=True)

    t0 = time.time()
    command = ["python3 -m bench.digits_recipes"] + list(sys.argv[1:] if argv is None else argv)
    result = {"machine": machine(), "command": " ".join(command),
              "arch": a.arch, "size": a.size, "batch_size": a.batch_size, "threads": a.threads, "workers": a.workers,
              "epochs_fast": a.epochs, "fast_flags": a.fast_flags,
              "epochs_examples": 2 * a.epochs, "seeds": a.seeds, "smoke": a.smoke, "data": data,
              "time_excludes": "validation and checkpoints (sum of metrics.jsonl's epoch seconds)"}
    log("{} on {} cores, torch {}; {} at {} px, {}; work dir {}".format(
        result["machine"]["cpu"], result["machine"]["cores"], result["machine"]["torch"], a.arch, a.size,
        "batches {}, {} epochs of --recipe fast".format(" ".join(map(str, a.lr_batches)), a.lr_epochs)
        if a.only == "lr" else "batch {}; fast {} epochs, examples {}".format(a.batch_size, a.epochs, 2 * a.epochs),
        work))
    if a.only in (None, "accuracy"):
        seeds = accuracy(a, data, work, log)
        reached = sum(1 for s in seeds if s["ratio_to_target"] is not None)
        med = median_or_none([s["ratio_to_target"] for s in seeds])
        result["accuracy"] = {
            "seeds": seeds, "reached": reached, "median_ratio_to_target": med,
            "median_ratio_whole_run": median_or_none([s["ratio_whole_run"] for s in seeds]),
            "mean_target_acc1": statistics.mean(s["target_acc1"] for s in seeds),
            "mean_fast_final_acc1": statistics.mean(s["fast_final_acc1"] for s in seeds),
            "claim_holds": reached == len(seeds) and all(s["ratio_to_target"] <= 1 / 3.0 for s in seeds)}
    if a.only in (None, "techniques"):
        result["techniques"] = techniques(a, data, work, log)
    if a.only == "lr":
        result.update(lr_batches=a.lr_batches, lr_grid=a.lr_grid, lr_epochs=a.lr_epochs, lr_size=a.lr_size)
        result["lr"] = lr_rule(a, data, work, log)
    result["bench_seconds"] = time.time() - t0
    result["machine"]["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report(result, log)
    log("bench: {:.0f} s".format(result["bench_seconds"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
