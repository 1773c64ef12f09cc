"""Shared by the test files: generated data sets, the child-process runners (each with a time limit)
and the one-line user-error contract."""
import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
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


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """This process's environment as before each test: main.py called in this process sets what a run needs before
    torch loads (TORCH_DEVICE_BACKEND_AUTOLOAD=0 for a CPU run), which later tests' children would inherit."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


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
    return run_python([os.path.join(ROOT, "main.py")] + list(args), e, timeout, cwd)


def run_python(argv, env, timeout, cwd=ROOT):
    """``python *argv`` (a script and its arguments, or ``-m module ...``) in a fresh process with exactly ``env``;
    CompletedProcess (text). The process is forked from a warm start of this test process (tests/warm_start.py:
    torch and torchvision imported, nothing of the project) started with what of ``env`` Python and torch read as
    they load (Warm.SETTLED); TESTS_COLD_START=1 makes every one a new interpreter."""
    argv, cwd = [str(a) for a in argv], str(cwd)
    done = Warm.run(argv, env, timeout, cwd)
    if done is not None:
        return done
    return subprocess.run([PY] + argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class Warm:
    """This test process's warm starts (tests/warm_start.py), one for each environment that torch and Python read
    while they load (SETTLED), started at its first run, the least recently used of more than LIMIT ended; one run
    at a time (a run asked for while another is under way starts cold)."""
    # read as Python, torch and its libraries load (OpenMP's threads, allocators, torch's own settings, the path)
    SETTLED = ("OMP_", "KMP_", "GOMP_", "MKL", "TORCH", "PYTORCH", "PYTHON", "LD_", "CUDA", "NVIDIA", "ASCEND",
               "TRITON", "MALLOC", "GLIBC", "LC_", "LANG")
    LIMIT = 3
    lock, pool, cold, broken = threading.Lock(), collections.OrderedDict(), set(), False

    @classmethod
    def key(cls, env):
        """What of ``env`` a warm start is started with (PYTHONUNBUFFERED aside: warm_start.run reads it)."""
        return tuple(sorted((k, v) for k, v in env.items() if k.startswith(cls.SETTLED) and k != "PYTHONUNBUFFERED"))

    @classmethod
    def run(cls, argv, env, timeout, cwd):
        """The CompletedProcess of ``python *argv`` forked from the warm start of ``env``'s key, or None where it
        starts cold (TESTS_COLD_START=1, another run under way, an environment where torch would load a device
        extension with itself, no warm start came up)."""
        if os.environ.get("TESTS_COLD_START") or cls.broken or not cls.lock.acquire(blocking=False):
            return None
        try:
            key = cls.key(env)
            proc = cls.pool.pop(key, None)
            if proc is None:
                if key in cls.cold:
                    return None
                try:
                    proc = cls._start(env)
                except OSError:
                    cls.broken = True
                    return None
                if proc is None:  # torch would load a device extension with itself: main.py decides that
                    cls.cold.add(key)
                    return None
            cls.pool[key] = proc
            while len(cls.pool) > cls.LIMIT:
                cls._end(cls.pool.popitem(last=False)[1])
            return cls._run(key, argv, env, timeout, cwd)
        finally:
            cls.lock.release()

    @classmethod
    def _start(cls, env):
        proc = subprocess.Popen([PY, os.path.join(ROOT, "tests", "warm_start.py")], cwd=ROOT,
                                env=dict(env, PYTHONUNBUFFERED="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                bufsize=0)  # raw: no read-ahead
        ready = cls._reply(proc, 300)
        if not ready or not ready.get("ready"):
            cls._end(proc)
            if ready and "why" in ready:
                return None
            raise OSError("the warm start did not come up")
        return proc

    @staticmethod
    def _end(proc):
        proc.kill()
        proc.wait()

    @staticmethod
    def _reply(proc, timeout):
        if not select.select([proc.stdout], [], [], timeout)[0]:
            return None
        line = proc.stdout.readline()  # raw, a byte at a time: the next reply stays in the pipe for select
        return json.loads(line.decode()) if line else None

    @classmethod
    def _run(cls, key, argv, env, timeout, cwd):
        proc = cls.pool[key]
        with tempfile.TemporaryDirectory(prefix="warm-run-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            started, late = None, None
            try:
                request = (json.dumps(dict(argv=argv, env=env, cwd=cwd, stdout=out, stderr=err)) + "\n").encode()
                while request:
                    request = request[proc.stdin.write(request):]
                started = cls._reply(proc, 60)
                assert started and "pid" in started, ("the warm start did not fork a run", proc.poll())
                ended = cls._reply(proc, timeout)
                if ended is None:
                    late = _process_state(started["pid"])
                    os.kill(started["pid"], signal.SIGKILL)
                    if cls._reply(proc, 60) is None:
                        cls._drop(key, started)
            except BaseException:  # the test's own time limit, a broken pipe: the run and its warm start go
                cls._drop(key, started)
                raise
            text = []
            for path in (out, err):
                with open(path, encoding="utf-8", errors="replace") as f:
                    text.append(f.read())
        if late is not None:
            raise subprocess.TimeoutExpired([PY] + argv, timeout, output=text[0], stderr=text[1] + late)
        return subprocess.CompletedProcess([PY] + argv, ended["status"], text[0], text[1])

    @classmethod
    def _drop(cls, key, started):
        """The run under way killed, and its warm start with it (the next run of its key starts another)."""
        if started and "pid" in started:
            with contextlib.suppress(OSError):
                os.kill(started["pid"], signal.SIGKILL)
        proc = cls.pool.pop(key, None)
        if proc is not None:
            cls._end(proc)


def _process_state(pid):
    """'pid N was in state S (wchan)' from /proc, for a failure message ('' where /proc has none)."""
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open("/proc/{}/wchan".format(pid)) as f:
            wchan = f.read().strip()
        return "\n[killed after the timeout: pid {} was in state {} ({})]".format(pid, state, wchan)
    except (OSError, IndexError):
        return "\n[killed after the timeout: pid {}]".format(pid)


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
    """tools/<name> in a fresh process (CompletedProcess, text), forked from the warm start as run_main's."""
    e = dict(os.environ, OMP_NUM_THREADS=THREADS)
    e.update(env or {})
    return run_python([os.path.join(ROOT, "tools", name)] + list(args), e, timeout)


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
