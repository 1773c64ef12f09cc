#!/usr/bin/env python3
"""A test's run of main.py started as a new interpreter and forked from the tests' warm start (tests/warm_start.py,
conftest.run_main), interleaved rounds on the same machine.

    python3 -m bench.test_starts [--rounds 5] [--arch tiny_cnn] [--json FILE]

Each round runs ``main.py DATA -a ARCH --epochs 1 -b 8`` (conftest.SMALL: 32 px, no workers) on a generated data set
of 4 classes x 8 images, once cold (``TESTS_COLD_START=1``) and once warm, the order alternating, and times each from
the call to its end; the warm start itself is started before the first round (once per pytest process in the
tests). Prints the median seconds of each and their ratio, with the interpreter's own start to torchvision imported.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tools.make_dataset import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location("conftest", os.path.join(ROOT, "tests", "conftest.py"))
conftest = importlib.util.module_from_spec(_SPEC)  # the tests' own runners, as the tests use them
_SPEC.loader.exec_module(conftest)


def timed(data, out, arch, cold):
    if cold:
        os.environ["TESTS_COLD_START"] = "1"
    else:
        os.environ.pop("TESTS_COLD_START", None)
    t0 = time.monotonic()
    proc = conftest.trained(data, out, ["-a", arch, "--epochs", "1", "-b", "8", "--device", "cpu"] + conftest.SMALL)
    seconds = time.monotonic() - t0
    assert "=> summary:" in proc.stdout, proc.stdout[-2000:]
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--arch", default="tiny_cnn")
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be 1 or more")
    work = tempfile.mkdtemp(prefix="bench-starts-")
    data = generate(os.path.join(work, "data"), classes=4, train_per_class=8, val_per_class=4, size=32, seed=0)
    timed(data, os.path.join(work, "first"), a.arch, cold=False)  # the warm start comes up
    legs = {"cold": [], "warm": []}
    for r in range(a.rounds):
        for leg in (("cold", "warm") if r % 2 == 0 else ("warm", "cold")):
            legs[leg].append(timed(data, os.path.join(work, "{}-{}".format(leg, r)), a.arch, leg == "cold"))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torchvision"], check=True,
                   env=dict(os.environ, OMP_NUM_THREADS=conftest.THREADS))
    imports = time.monotonic() - t0
    cold, warm = statistics.median(legs["cold"]), statistics.median(legs["warm"])
    result = {"rounds": a.rounds, "arch": a.arch, "cold_s": legs["cold"], "warm_s": legs["warm"],
              "cold_median_s": cold, "warm_median_s": warm, "ratio_warm_to_cold": warm / cold,
              "interpreter_to_torchvision_s": imports, "cores": len(os.sched_getaffinity(0))}
    print("| start | median s | runs (s) |\n|---|---|---|")
    for leg in ("cold", "warm"):
        print("| {} | {:.2f} | {} |".format(leg, statistics.median(legs[leg]),
                                            ", ".join("{:.2f}".format(t) for t in legs[leg])))
    print("warm / cold: {:.2f}; a new interpreter to torchvision imported: {:.2f} s".format(warm / cold, imports))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
