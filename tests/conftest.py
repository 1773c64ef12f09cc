import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.make_dataset import generate  # noqa: E402

PY = sys.executable


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """10 classes x 40 train / 10 val images of 32x32 drawn shapes (ImageNet layout)."""
    out = str(tmp_path_factory.mktemp("data") / "shapes")
    return generate(out, classes=10, train_per_class=40, val_per_class=10, size=32, seed=0)


@pytest.fixture(scope="session")
def tiny_layout(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "tiny")
    return generate(out, classes=4, train_per_class=12, val_per_class=5, size=32, layout="tiny-imagenet", seed=1)


SMALL = ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-j", "0", "-p", "5"]


def run_main(args, env=None, timeout=600, cwd=ROOT):
    """Run main.py in a fresh process; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "2")
    e["PYTHONUNBUFFERED"] = "1"
    if env:
        e.update(env)
    return subprocess.run([PY, os.path.join(ROOT, "main.py")] + list(args), cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


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
    e = dict(os.environ, OMP_NUM_THREADS="2")
    e.update(env or {})
    return subprocess.run([PY, os.path.join(ROOT, "tools", name)] + list(args), cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)
