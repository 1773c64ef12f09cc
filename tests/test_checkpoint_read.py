"""The files a run reads (--resume, --pretrained) are read from disk once per process: the plan (trainer/plan.py)
checks them and carries them, as checkpoint.File, to the run of the same process; a spawned rank gets the File
empty and reads it once itself."""
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from conftest import PY, PY38, ROOT, SMALL, STACK, read_summary, run_main
from trainer.record import checkpoint

pytestmark = [STACK, pytest.mark.timeout(300)]


def test_a_file_is_loaded_once_until_released_and_travels_empty(tmp_path):
    path = str(tmp_path / "c.pth.tar")
    checkpoint.save({"epoch": 1, "state_dict": {"w": torch.ones(2)}}, path)
    f = checkpoint.File(path)
    first = f.load()
    assert f.load() is first  # held: no second read
    copy = pickle.loads(pickle.dumps(f))  # what a spawned rank receives
    assert copy.path == path and copy._contents is None and copy.load()["epoch"] == 1
    checkpoint.save({"epoch": 2, "state_dict": {"w": torch.zeros(2)}}, path)
    assert f.load() is first  # the run keeps what it checked
    f.release()
    assert f.load()["epoch"] == 2


# main.main in a child process whose audit hook counts every open() of the checkpoint's path for reading
COUNT_OPENS = r"""
import json, os, sys
path = os.path.abspath(sys.argv[1])
opens = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.abspath(args[0]) == path and "r" in str(args[1]):
        opens.append(1)
sys.addaudithook(hook)
sys.path.insert(0, sys.argv[2])
import main
code = main.main(sys.argv[3:])
print("OPENS " + json.dumps({"code": code, "opens": len(opens)}))
"""


def _opens(path, args):
    r = subprocess.run([PY, "-c", COUNT_OPENS, path, ROOT] + args, capture_output=True, text=True, timeout=240,
                       cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("OPENS ")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[-1][6:])


@PY38
@pytest.mark.skipif(sys.version_info < (3, 8), reason="counts opens with an audit hook (sys.addaudithook: Python 3.8)")
def test_resuming_reads_the_checkpoint_from_disk_once(shapes, tmp_path):
    out = str(tmp_path / "run")
    args = [shapes, "-a", "resnet18", "--device", "cpu", "-b", "16", "--max-steps-per-epoch", "2"] + SMALL
    r = run_main(args + ["--epochs", "1", "--output-dir", out])
    assert r.returncode == 0, r.stderr[-2000:]
    ckpt = os.path.join(out, "checkpoint.pth.tar")
    # --no-validate: no best epoch, so no copy of the file to model_best.pth.tar (a read of its own)
    resumed = _opens(ckpt, args + ["--epochs", "2", "--output-dir", out, "--resume", "auto", "--no-validate"])
    assert resumed == {"code": 0, "opens": 1}  # checked by the plan, restored by the trainer: one read
    assert read_summary(out)["epochs_completed"] == 2
    weights = _opens(ckpt, args + ["--epochs", "1", "--output-dir", str(tmp_path / "ft"), "--pretrained", ckpt])
    assert weights == {"code": 0, "opens": 1}  # --pretrained FILE: checked and loaded, one read
    evaluated = _opens(ckpt, args + ["--evaluate", "--resume", ckpt, "--output-dir", str(tmp_path / "ev")])
    assert evaluated == {"code": 0, "opens": 1}
