#!/usr/bin/env python3
"""Compute threads per rank on a CPU: a two-rank CPU job (spawn) as ranks ran it with torch's default thread count,
with each rank's share of the cores (the default now), and bound (``--cpu-binding on``); interleaved rounds on the
same machine.

    python3 -m bench.cpu_threads DATA [--arch tiny_cnn] [--batch-size 32] [--crop 64] [--workers 2] [--steps 40]
                                      [--rounds 3] [--json FILE]

Each round runs ``main.py DATA --device cpu --multiprocessing-distributed --device-list 0,1`` once per leg (the order
rotating), one epoch of ``--steps`` steps, JPEGs decoded by ``--workers`` data workers per node, no validation:

    torch_default  --cpu-binding off, OMP_NUM_THREADS = the cores this process may use (what torch gives each rank
                   by itself: every rank one compute thread per core)
    share          OMP_NUM_THREADS unset: each rank its share, max(1, cores // 2) (trainer/job/affinity.py)
    bound          --cpu-binding on, OMP_NUM_THREADS unset: each rank on its slice, one thread per core of it

and reads ``train_step_time_ms`` (the steps after the first) and the threads rank 0 ran (``cpu_binding.threads``)
from ``summary.json``. Prints the median seconds per step of each leg and their ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGS = ("torch_default", "share", "bound")


def one_run(a, leg, out):
    cmd = [sys.executable, os.path.join(ROOT, "main.py"), a.data, "--device", "cpu", "--multiprocessing-distributed",
           "--device-list", "0,1", "--port", "0", "-a", a.arch, "-b", str(a.batch_size), "--epochs", "1",
           "--max-steps-per-epoch", str(a.steps), "-j", str(a.workers), "--no-validate", "--seed", "0",
           "--train-crop-size", str(a.crop), "--output-dir", out, "-p", "1000",
           "--cpu-binding", "on" if leg == "bound" else "off"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if leg == "torch_default":
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit("error: the {} run failed: {}".format(leg, proc.stderr.strip()[-500:]))
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return s["train_step_time_ms"] / 1000.0, s["cpu_binding"]["threads"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--arch", default="tiny_cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seconds, threads = {leg: [] for leg in LEGS}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for leg in LEGS[r % 3:] + LEGS[:r % 3]:
                s, threads[leg] = one_run(a, leg, os.path.join(tmp, "{}{}".format(leg, r)))
                seconds[leg].append(s)
    med = {leg: statistics.median(v) for leg, v in seconds.items()}
    result = {"seconds_per_step": med, "runs": seconds, "threads_per_rank": threads,
              "ratios": {"torch_default/share": med["torch_default"] / med["share"],
                         "torch_default/bound": med["torch_default"] / med["bound"],
                         "share/bound": med["share"] / med["bound"]},
              "cores": sorted(os.sched_getaffinity(0)), "load_average": os.getloadavg(), "settings": vars(a)}
    for leg in LEGS:
        print("{:14s} {:.3f} s/step ({} thread(s) per rank; runs {})".format(
            leg, med[leg], threads[leg], ", ".join("{:.3f}".format(v) for v in seconds[leg])))
    print("torch_default / share {:.2f}, torch_default / bound {:.2f}, share / bound {:.2f} (medians of {} rounds)"
          .format(result["ratios"]["torch_default/share"], result["ratios"]["torch_default/bound"],
                  result["ratios"]["share/bound"], a.rounds))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
