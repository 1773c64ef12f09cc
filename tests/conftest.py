"""Shared by the test files: generated data sets, the child-process runners (each with a time limit)
and the one-line user-error contract."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.make_dataset import generate  # noqa: E402
from trainer.device import Device, torch_load  # noqa: E402

PY = sys.executable

# Threads for each test's torch work and its children's (OMP_NUM_THREADS): 2, or under pytest-xdist this
# process's share of the cores, so that the test processes' OpenMP threads do not outnumber the cores
# (spinning threads on a shared core cost the suite a third of its time).
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    THREADS = str(max(1, _cores // _XDIST_WORKERS))
    os.environ["OMP_NUM_THREADS"] = THREADS
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(THREADS))
else:
    THREADS = "2"


# Tests of a feature that the installed torch lacks skip with the device layer's own reason (the same words
# a user gets from main.py); a few at most, on the torch 2.1 lane (make test-compat).
CPU_FLOAT16 = Device("cpu", None).float16_missing()
needs_cpu_float16 = pytest.mark.skipif(CPU_FLOAT16 is not None, reason="float16 autocast {}".format(CPU_FLOAT16))


def dataset(tmp_path_factory, name, classes, train, val, seed, **kw):
    """A generated data set of 32x32 images in a fresh temporary folder ``name`` (tools/make_dataset.py)."""
    out = str(tmp_path_factory.mktemp("data") / name)
    return generate(out, classes=classes, train_per_class=train, val_per_class=val, size=32, seed=seed, **kw)


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """10 classes x 40 train / 10 val images of 32x32 drawn shapes (ImageNet layout)."""
    return dataset(tmp_path_factory, "shapes", 10, 40, 10, seed=0)


@pytest.fixture(scope="module")
def data70(tmp_path_factory):
    """70 validation images: not divisible by world (2) x batch per process (4)."""
    return dataset(tmp_path_factory, "d70", 10, 6, 7, seed=5)


def free_port():
    """A port free on 127.0.0.1 now (for a job of several ranks on localhost)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_layout(tmp_path_factory):
    return dataset(tmp_path_factory, "tiny", 4, 12, 5, seed=1, layout="tiny-imagenet")


# Tests that start a job of several ranks (gloo on localhost) share one pytest-xdist worker (make test runs
# with --dist loadgroup): two such jobs at once could race for the ports each picks free and then binds.
# They are also marked "ranks" (below), their own lane: make test-ranks.
RANKS = pytest.mark.xdist_group("ranks")
# Runs that train on the torch_npu double (tests/fake_npu) are their own lane, make test-npu: a module sets
# ``pytestmark = [DOUBLE, ...]``; its jobs of several ranks are RANKS as well (one worker) and stay in that lane.
DOUBLE = pytest.mark.double
FAKE_NPU = os.path.join(ROOT, "tests", "fake_npu")


def _fake_npu_missing():
    """None where the double can be imported under this torch, else its own reason (torch_npu/_release.py: torch
    before 2.1 has no PrivateUse1 backend to rename to "npu"), read without importing the double here."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_fake_npu_release", os.path.join(FAKE_NPU, "torch_npu",
                                                                                    "_release.py"))
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except ImportError as e:
        return str(e)
    return None


# Tests marked fake_npu import the double; under a torch that cannot host it (the 1.11 stack) they skip with its reason
FAKE_NPU_MISSING = _fake_npu_missing()
IMPORTS_FAKE_NPU = pytest.mark.fake_npu


@pytest.fixture(scope="session")
def npu_double():
    """The double's C++ part built (or loaded) once, in a child process, before a test that trains on it; without
    a C++ compiler the test skips with the double's reason (tests/fake_npu/README.md)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_NPU, ROOT]))
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([PY, "-c", "import json, torch, torch_npu; print(json.dumps(torch_npu._double.unavailable))"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    why = json.loads(proc.stdout.strip().splitlines()[-1])
    if why:
        pytest.skip(why)


# Which stacks a test runs on (tests/README.md, "One stack or every stack"): every test module declares one of the
# two in its pytestmark, and a test that differs from its module carries the other (the closest one counts).
# STACK: its outcome can depend on the torch it runs on (an API, a dtype or autocast rule, DDP, serialization, the
# double's kernels, compiling, ONNX export): every stack's lanes run it. ONCE: the project's own logic (flags, plans,
# errors, records, docs, shell drivers' parsing): the pinned stack's lanes run it, the other stacks' skip it.
STACK = pytest.mark.stack
ONCE = pytest.mark.once
# WAYS (with STACK): one of the ways a user runs the trainer, trained end to end: one process trains, resumes and runs
# --amp; spawn, torchrun, the shell loops of the guides and ModelZoo, a ModelZoo driver, the guide's launch command.
# A stack's second Python runs these (make test-torch1.11: torch 1.11 on Python 3.9), its first every STACK test.
WAYS = pytest.mark.ways
# PY38 (with STACK): it needs Python 3.8 or newer (msprobe has no Python 3.7 release; audit hooks), so torch 1.11's
# Python 3.7 lane skips it, and its Python 3.9 lane (make test-torch1.11) runs it
PY38 = pytest.mark.py38


def stack_marker(item):
    """"stack" or "once": the closest of the two markers on ``item``, or None where neither is declared."""
    for mark in item.iter_markers():
        if mark.name in ("stack", "once"):
            return mark.name
    return None


def pytest_addoption(parser):
    parser.addoption("--stack-only", action="store_true",
                     help="run only the tests marked stack (a second torch's lanes: make test-compat and the others)")


def pytest_collection_modifyitems(config, items):
    undeclared = sorted({item.nodeid.split("::")[0] for item in items if stack_marker(item) is None})
    if undeclared:
        raise pytest.UsageError("{} declare(s) neither conftest.STACK nor conftest.ONCE: add one to the module's "
                                "pytestmark (tests/README.md, \"One stack or every stack\")".format(
                                    ", ".join(undeclared)))
    ways_once = sorted(item.nodeid for item in items
                       if item.get_closest_marker("ways") and stack_marker(item) != "stack")
    if ways_once:
        raise pytest.UsageError("{}: marked ways but not stack: a way to run trains on every stack, so it is "
                                "conftest.STACK as well".format(", ".join(ways_once)))
    for item in items:
        if any(m.args == ("ranks",) for m in item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.ranks)
        if FAKE_NPU_MISSING and (item.get_closest_marker("fake_npu") or item.get_closest_marker("double") or
                                 "npu_double" in item.fixturenames):
            item.add_marker(pytest.mark.skip(reason="torch_npu double: " + FAKE_NPU_MISSING))
    if config.getoption("--stack-only"):
        once = [item for item in items if stack_marker(item) == "once"]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [item for item in items if stack_marker(item) != "once"]

SMALL = ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-j", "0", "-p", "5"]


def run_main(args, env=None, timeout=600, cwd=ROOT):
    """Run main.py in a fresh process; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", THREADS)
    e["PYTHONUNBUFFERED"] = "1"
    if env:
        e.update(env)
    return subprocess.run([PY, os.path.join(ROOT, "main.py")] + list(args), cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


def trained(data, out, args):
    """main.py on ``data`` into ``out`` with ``args``, which must succeed; the finished process."""
    proc = run_main([str(data), "--output-dir", str(out)] + list(args))
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def read_checkpoint(out, name="checkpoint.pth.tar"):
    return torch_load(os.path.join(str(out), name))


def read_metrics(out):
    """The records of a run's metrics.jsonl."""
    with open(os.path.join(str(out), "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def read_summary(out_dir, name="summary.json"):
    with open(os.path.join(str(out_dir), name)) as f:
        return json.load(f)


def assert_one_line(rc, err, *fragments, out=""):
    """The user-error contract: exit code 2, one line on stderr starting with 'error: ', no traceback,
    each fragment in that line. Returns the line."""
    assert rc == 2, (rc, out[-2000:], err[-2000:])
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


def assert_one_line_error(proc, *fragments):
    """The user-error contract for a finished child process."""
    return assert_one_line(proc.returncode, proc.stderr, *fragments, out=proc.stdout)


def call(main_fn, argv, capsys):
    """``main_fn(argv)`` in this process: (exit code, stdout, stderr)."""
    rc = main_fn([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def assert_call_error(main_fn, argv, capsys, *fragments):
    """The user-error contract for an entry point called in this process."""
    rc, out, err = call(main_fn, argv, capsys)
    return assert_one_line(rc, err, *fragments, out=out)


def run_tool(name, args, env=None, timeout=300):
    """tools/<name> in a fresh process (CompletedProcess, text)."""
    e = dict(os.environ, OMP_NUM_THREADS=THREADS)
    e.update(env or {})
    return subprocess.run([PY, os.path.join(ROOT, "tools", name)] + list(args), cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def read_lines(proc, until, timeout=120):
    """A running child's stdout, line by line, until ``until(lines)`` holds; fails the test if the child
    ends or ``timeout`` seconds pass first (a child that prints nothing cannot hang the test)."""
    fd, lines, buf = proc.stdout.fileno(), [], b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, ("no awaited line within {} s".format(timeout), lines[-20:])
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        assert chunk, ("the child ended first", proc.poll(), lines[-20:])
        parts = (buf + chunk).split(b"\n")
        buf = parts.pop()
        for raw in parts:
            lines.append(raw.decode("utf-8", "replace"))
            if until(lines):
                return lines


def finish(proc, timeout=120):
    """``proc.communicate()`` within ``timeout`` seconds. A child still running then is made to print every
    thread's Python stack (it runs with PYTHONFAULTHANDLER=1, see ``child_env``; SIGABRT triggers the dump)
    and the test fails with that dump, so a hang says where it is."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail("the child did not end within {} s; its stacks:\n{}\nstdout tail:\n{}".format(
            timeout, (err or "")[-6000:], (out or "")[-2000:]))


def child_env(**extra):
    """The environment for a child started with Popen: unbuffered, THREADS threads, stacks dumped on SIGABRT."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=THREADS, PYTHONFAULTHANDLER="1", **extra)


def gone(pid, within=0.0):
    """The process has ended (a zombie counts), waiting up to ``within`` seconds for it."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open("/proc/{}/stat".format(pid)) as f:
                ended = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            ended = True
        if ended or time.monotonic() >= deadline:
            return ended
        time.sleep(0.05)
