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


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for frag in fragments:
        assert frag in err, (frag, err)
