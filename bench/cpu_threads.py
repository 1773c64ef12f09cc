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
import sys
import tempfile

from bench.cpu_binding import add_job_arguments, run_job

LEGS = ("torch_default", "share", "bound")


def one_run(a, leg, out):
    threads = len(os.sched_getaffinity(0)) if leg == "torch_default" else None
    s = run_job(a, "on" if leg == "bound" else "off", out, threads=threads, label=leg)
    return s["train_step_time_ms"] / 1000.0, s["cpu_binding"]["threads"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(p)
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
