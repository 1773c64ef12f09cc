#!/usr/bin/env python3
"""From a stop signal to the run's exit: how long a stopped run takes to stop, on this machine.

    python3 -m bench.stop_latency [--arch resnet50 shufflenet_v2_x1_0] [--batch-size 8] [--image-size 112]
                                  [--signal TERM] [--after 3] [--repeats 2] [--workers 0] [--device cpu] [--json FILE]

Each run is main.py on a generated data set (tools/make_dataset.py, 10 classes) with ``-p 1``, sent the signal
once its log shows step ``--after`` + 1 of its first epoch. Reported per arch: the median step time (the gaps
between the progress lines before the signal), the seconds from the signal to the "stopped at" line (the rest of
the step under way, and the agreement), from there to the exit (the mid-epoch checkpoint's write, the summary, the
process's teardown), the whole signal-to-exit time, and the checkpoint's size. A run must exit with 128 + the
signal's number and leave a mid-epoch checkpoint, or the bench fails.
"""
import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from tools.make_dataset import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_lines(proc, until, timeout):
    """(monotonic time, line) of the child's stdout until ``until(line)`` holds (or the child ends)."""
    fd, buf, out = proc.stdout.fileno(), b"", []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 1.0)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return out
        now = time.monotonic()
        parts = (buf + chunk).split(b"\n")
        buf = parts.pop()
        for raw in parts:
            out.append((now, raw.decode("utf-8", "replace")))
            if until(out[-1][1]):
                return out
    raise SystemExit("error: no awaited line within {} s".format(timeout))


def one_run(data, out, args, sig, after, timeout):
    cmd = [sys.executable, os.path.join(ROOT, "main.py"), data, "--output-dir", out, "-p", "1", "--epochs", "1"]
    proc = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    mark = "Epoch: [0][{:>{w}}/".format(after + 1, w=0)
    lines = timed_lines(proc, lambda ln: ln.replace(" ", "").startswith(mark.replace(" ", "")), timeout)
    steps = [t for t, ln in lines if ln.startswith("Epoch: [0][")]
    t_sig = time.monotonic()
    proc.send_signal(sig)
    rest = timed_lines(proc, lambda ln: ": stopped at epoch" in ln, timeout)
    t_stopped = rest[-1][0] if rest and ": stopped at epoch" in rest[-1][1] else None
    proc.communicate(timeout=timeout)
    t_exit = time.monotonic()
    if proc.returncode != 128 + sig or t_stopped is None:
        raise SystemExit("error: the run exited {} (expected {}) without a mid-epoch stop".format(
            proc.returncode, 128 + sig))
    path = os.path.join(out, "checkpoint.pth.tar")
    gaps = [b - a for a, b in zip(steps[1:], steps[2:])]  # the first step's line is left out (it warms up)
    return {"step_seconds": statistics.median(gaps) if gaps else None, "to_stop_seconds": t_stopped - t_sig,
            "to_exit_after_stop_seconds": t_exit - t_stopped, "signal_to_exit_seconds": t_exit - t_sig,
            "checkpoint_mb": os.path.getsize(path) / 1e6}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", default=["resnet50", "shufflenet_v2_x1_0"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--signal", default="TERM", choices=("TERM", "INT", "USR1"))
    p.add_argument("--after", type=int, default=3, help="the signal comes after this many steps")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    sig = getattr(signal, "SIG" + a.signal)
    tmp = tempfile.mkdtemp(prefix="stop-latency-")
    try:
        per_class = max(2, (a.after + 8) * a.batch_size // 10 + 1)
        data = generate(os.path.join(tmp, "data"), classes=10, train_per_class=per_class, val_per_class=1,
                        size=a.image_size)
        size = str(a.image_size)
        args = ["-b", str(a.batch_size), "--device", a.device, "-j", str(a.workers), "--seed", "0",
                "--train-crop-size", size, "--val-resize-size", size, "--val-crop-size", size]
        results = {}
        for arch in a.arch:
            runs = [one_run(data, os.path.join(tmp, "{}-{}".format(arch, r)), ["-a", arch] + args, sig, a.after,
                            a.timeout) for r in range(a.repeats)]
            results[arch] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results[arch]["runs"] = runs
            print("{:<20} step {:.3f} s | signal -> stopped {:.3f} s | stopped -> exit {:.3f} s | signal -> exit "
                  "{:.3f} s | checkpoint {:.1f} MB".format(arch, results[arch]["step_seconds"],
                                                           results[arch]["to_stop_seconds"],
                                                           results[arch]["to_exit_after_stop_seconds"],
                                                           results[arch]["signal_to_exit_seconds"],
                                                           results[arch]["checkpoint_mb"]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(vars(a), results=results), f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
