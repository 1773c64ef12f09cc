"""The CI lanes, in order, each timed: ``python3 .ci/lanes.py`` runs them all (``.ci/run``) and prints, after each
lane, its wall time and its five slowest tests, then a table of every lane; ``python3 .ci/lanes.py stress TARGET N``
repeats a lane (``test-more``, or any test-* target of the Makefile: ``test-ranks``) or a test
(``tests/test_stop.py::test_x``, on the pinned stack) N times and counts the outcomes (``make stress LANE=... N=...``,
``make stress TEST=... N=...``).

Standard library only: it runs under the machine's own Python before any lane has installed anything.
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(ROOT, ".ci-reports")

# lint first (seconds; it installs the pinned stack), then the README's test command, the rest of the pinned stack in
# one lane, the real Slurm, and the lanes of the users' older stacks (tests/README.md): torch 2.1 on Python 3.9 and
# torch 1.11 on the guides' Python 3.7, each every test whose outcome can depend on torch, and torch 1.11 on Python 3.9,
# the ways a user runs the trainer
LANES = ("lint", "test", "test-more", "test-slurm", "test-compat", "test-torch1.11-py37", "test-torch1.11")
# The other stacks' installs run in the background, one after another, from the end of the first lane (lint installs
# the pinned stack and the system packages every stack shares), beside the pinned stack's lanes; a lane of that stack
# waits for its install first (its output in .ci-reports/<install>.log, printed where it fails).
INSTALLS = {"install-compat": ("test-compat",),
            "install-torch1.11-py37": ("test-torch1.11-py37",),
            "install-torch1.11": ("test-torch1.11",)}


def slowest(xml_path, n=5):
    """[(seconds, test id)] of the ``n`` slowest tests in a junit XML report, slowest first."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return []
    cases = []
    for case in root.iter("testcase"):
        name = "{}::{}".format(case.get("classname", "").replace(".", "/") + ".py", case.get("name"))
        cases.append((float(case.get("time") or 0.0), name))
    return sorted(cases, reverse=True)[:n]


def counts(xml_path):
    """{passed, failed, skipped} of a junit XML report (None where the lane wrote none)."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        out["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"] += 1
    return out


def run_lane(lane, tag=""):
    """Run ``make <lane>`` with its pytest report in .ci-reports/; (exit code, seconds, report path)."""
    os.makedirs(REPORTS, exist_ok=True)
    report = os.path.join(REPORTS, "{}{}.xml".format(lane, tag))
    if os.path.exists(report):
        os.remove(report)
    env = dict(os.environ)
    env["PYTEST_ADDOPTS"] = " ".join(filter(None, [env.get("PYTEST_ADDOPTS", ""),
                                                   "--junitxml=" + shlex.quote(report)]))
    t0 = time.monotonic()
    rc = subprocess.call(["make", "--no-print-directory", lane], cwd=ROOT, env=env)
    return rc, time.monotonic() - t0, report


def disk():
    """'N GB free' of the clone's disk, and of the temporary folder's where it is another (where the tests' runs
    write)."""
    seen, parts = set(), []
    for where in (ROOT, tempfile.gettempdir()):
        usage = shutil.disk_usage(where)
        if (usage.total, usage.free) not in seen:
            seen.add((usage.total, usage.free))
            parts.append("{:.1f} GB free{}".format(usage.free / 1e9, "" if where == ROOT else " in " + where))
    return ", ".join(parts)


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class Install:
    """``make <target>`` in the background, once ``after`` (an Install, or None) has ended, its output in
    .ci-reports/<target>.log: one install at a time beside the lanes."""

    def __init__(self, target, after=None):
        os.makedirs(REPORTS, exist_ok=True)
        self.target, self.log = target, os.path.join(REPORTS, target + ".log")
        self.rc, self.seconds, self.reported, self.done = None, None, False, threading.Event()
        threading.Thread(target=self._run, args=(after,), daemon=True).start()

    def _run(self, after):
        if after is not None:
            after.done.wait()
        t0 = time.monotonic()
        try:
            with open(self.log, "w") as out:
                self.rc = subprocess.call(["make", "--no-print-directory", self.target], cwd=ROOT, stdout=out,
                                          stderr=subprocess.STDOUT)
        except OSError as e:
            self.rc = 127
            with open(self.log, "a") as out:
                out.write("{}\n".format(e))
        self.seconds = time.monotonic() - t0
        self.done.set()

    def wait(self):
        """Its exit code, once it has ended (its log's tail printed where it failed)."""
        if not self.reported:
            waited = time.monotonic()
            self.done.wait()
            self.reported = True
            say("=== {} (in the background): {} in {:.0f} s, {:.0f} s of it waited for".format(
                self.target, "done" if self.rc == 0 else "FAILED (exit {})".format(self.rc), self.seconds,
                time.monotonic() - waited))
            if self.rc:
                with open(self.log) as f:
                    say(f.read()[-5000:])
        return self.rc


def all_lanes(lanes):
    rows, t_all, installs = [], time.monotonic(), {}
    say("=== disk at the start: {} (the stacks' venvs take 16 GB)".format(disk()))
    for i, lane in enumerate(lanes):
        if i == 1:  # the first lane has installed the pinned stack and the system packages
            installs, last = {}, None
            for target, served in INSTALLS.items():
                if set(served) & set(lanes[1:]):
                    installs[target] = last = Install(target, after=last)
        say("=== {} ===".format(lane))
        needs = [installs[target] for target, served in INSTALLS.items() if lane in served and target in installs]
        if any(install.wait() for install in needs):
            rows.append((lane, 2, 0.0, None))
            say("=== {}: FAILED (its stack did not install)".format(lane))
            continue
        rc, seconds, report = run_lane(lane)
        rows.append((lane, rc, seconds, counts(report)))
        say("=== {}: {} in {:.0f} s; disk: {}{}".format(lane, "passed" if rc == 0 else "FAILED (exit {})".format(rc),
                                                        seconds, disk(), "; slowest tests:" if slowest(report) else ""))
        for t, name in slowest(report):
            say("    {:7.1f} s  {}".format(t, name))
    say("\n| lane | result | tests | s |\n|---|---|---|---|")
    for lane, rc, seconds, c in rows:
        tests = "{passed} passed, {failed} failed, {skipped} skipped".format(**c) if c else "-"
        say("| {} | {} | {} | {:.0f} |".format(lane, "passed" if rc == 0 else "FAILED ({})".format(rc), tests,
                                               seconds))
    for target, install in sorted(installs.items()):
        if install.wait() is not None:
            say("| {} (background) | {} | - | {:.0f} |".format(target, "passed" if install.rc == 0 else
                                                             "FAILED ({})".format(install.rc), install.seconds))
    failed = [lane for lane, rc, _, _ in rows if rc]
    say("all lanes: {:.0f} s; {}".format(time.monotonic() - t_all,
                                         "failed: " + ", ".join(failed) if failed else "every lane passed"))
    return 1 if failed else 0


def stress(target, n):
    """``target`` a lane name or a pytest node id; run it ``n`` times and count."""
    outcomes = []
    for i in range(n):
        if target in LANES or target.startswith("test-"):
            rc, seconds, _ = run_lane(target, tag="-stress")
        else:
            t0 = time.monotonic()
            rc = subprocess.call([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "pytest", "-q", "-p",
                                  "no:cacheprovider", target], cwd=ROOT)
            seconds = time.monotonic() - t0
        outcomes.append(rc)
        say("=== stress {} run {}/{}: {} in {:.0f} s".format(target, i + 1, n, "passed" if rc == 0 else
                                                             "FAILED (exit {})".format(rc), seconds))
    failed = sum(1 for rc in outcomes if rc)
    say("stress {}: {} of {} runs passed{}".format(target, n - failed, n, "" if not failed else
                                                   "; failed runs: " + ", ".join(str(i + 1) for i, rc in
                                                                                 enumerate(outcomes) if rc)))
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog=".ci/lanes.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    every = sub.add_parser("all", help="every lane, in CI's order (the default)")
    every.add_argument("lanes", nargs="*", help="only these lanes (default: all of them)")
    st = sub.add_parser("stress", help="repeat a lane or a test")
    st.add_argument("target", help="a lane (test-ranks) or a pytest node id (tests/test_stop.py::test_x)")
    st.add_argument("n", type=int, help="how many runs")
    args = parser.parse_args(argv)
    if args.cmd == "stress":
        if args.n < 1:
            parser.error("N must be 1 or more")
        return stress(args.target, args.n)
    lanes = getattr(args, "lanes", None) or LANES
    unknown = [lane for lane in lanes if lane not in LANES]
    if unknown:
        parser.error("no lane {}: the lanes are {}".format(", ".join(unknown), " ".join(LANES)))
    return all_lanes(lanes)


if __name__ == "__main__":
    sys.exit(main())
