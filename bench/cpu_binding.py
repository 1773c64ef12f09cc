#!/usr/bin/env python3
"""CPU core binding (``--cpu-binding``): a two-rank CPU job (spawn) with its ranks bound to their own cores and
unbound, interleaved rounds on the same machine.

    python3 -m bench.cpu_binding DATA [--arch tiny_cnn] [--batch-size 32] [--workers 2] [--steps 40]
                                      [--rounds 3] [--threads N] [--json FILE]

Each round runs ``main.py DATA --device cpu --multiprocessing-distributed --device-list 0,1`` once with
``--cpu-binding on`` and once with ``--cpu-binding off`` (order alternating), one epoch of ``--steps`` steps,
JPEGs decoded by ``--workers`` data workers per node, and reads the training images/s from ``summary.json``
(``train_fps``: the steps after the first). Without ``--threads`` OMP_NUM_THREADS is left unset, so that an unbound
rank runs torch's default thread count, as a user's run would (a bound one caps it at its cores); ``--threads N``
sets OMP_NUM_THREADS=N for both, which leaves only where the threads run to compare. Prints the median images/s
of each and their ratio (bound/unbound).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_job(a, binding, out, threads=None, label=None):
    """One two-rank CPU job (spawn) as ``a`` describes (``add_job_arguments``), ``--cpu-binding binding``,
    OMP_NUM_THREADS and MKL_NUM_THREADS unset unless ``threads``; its summary.json."""
    cmd = [sys.executable, os.path.join(ROOT, "main.py"), a.data, "--device", "cpu", "--multiprocessing-distributed",
           "--device-list", "0,1", "--port", "0", "-a", a.arch, "-b", str(a.batch_size), "--epochs", "1",
           "--max-steps-per-epoch", str(a.steps), "-j", str(a.workers), "--no-validate", "--seed", "0",
           "--train-crop-size", str(a.crop), "--cpu-binding", binding, "--output-dir", out, "-p", "1000"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit("error: the {} run failed: {}".format(label or binding, proc.stderr.strip()[-500:]))
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def add_job_arguments(p):
    """The job's arguments, shared with bench/cpu_threads.py."""
    p.add_argument("data")
    p.add_argument("--arch", default="tiny_cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)


def one_run(a, binding, out):
    return run_job(a, binding, out, threads=a.threads)["train_fps"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(p)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    fps = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for binding in (("on", "off") if r % 2 == 0 else ("off", "on")):
                fps[binding].append(one_run(a, binding, os.path.join(tmp, "{}{}".format(binding, r))))
    result = {"bound": statistics.median(fps["on"]), "unbound": statistics.median(fps["off"]), "runs": fps,
              "cores": sorted(os.sched_getaffinity(0)), "settings": vars(a)}
    result["ratio"] = result["bound"] / result["unbound"]
    print("bound {:.1f} img/s, unbound {:.1f} img/s: ratio {:.2f} (medians of {} rounds)".format(
        result["bound"], result["unbound"], result["ratio"], a.rounds))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
