"""A stopped run loses at most a step: real signals to real runs (trainer/job/stop.py). SIGTERM in the middle of
an epoch saves a mid-epoch checkpoint, and --resume auto ends exactly as the uninterrupted run (every step's loss,
Acc@1, the weights); the summary names the signal and the step; the lock is released."""
import os
import re
import signal
import subprocess

import pytest
import torch

from conftest import PY, ROOT, SMALL, child_env, finish, read_checkpoint, read_lines, read_metrics, read_summary
from conftest import trained

pytestmark = pytest.mark.timeout(300)

TINY = ["-a", "tiny_cnn", "-b", "16", "--lr", "0.1", "--epochs", "2", "--device", "cpu", "--seed", "5"] + \
    SMALL[:-2] + ["-p", "1"]


def stopped_at(data, out, args, sig, at):
    """main.py on ``data`` into ``out``, sent ``sig`` once its log shows the step ``at`` ("1][ 5"); returns the
    finished process's (code, stdout lines, stderr)."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(data), "--output-dir", str(out)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    lines = read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [{}/".format(at)), timeout=240)
    proc.send_signal(sig)
    out_text, err = finish(proc, timeout=240)
    return proc.returncode, lines + out_text.splitlines(), err


def per_step(out):
    """(global step, loss) of every step of a run, and its last epoch's Acc@1, from metrics.jsonl."""
    records = read_metrics(out)
    return [tuple(p) for r in records for p in r["step_losses"]], records[-1]["val_acc1"]


def same_weights(a, b):
    wa, wb = read_checkpoint(a)["state_dict"], read_checkpoint(b)["state_dict"]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigterm_mid_epoch_then_resume_auto_equals_the_uninterrupted_run(shapes, tmp_path, workers):
    args = TINY + ["-j", workers]
    trained(shapes, tmp_path / "whole", args)
    code, lines, err = stopped_at(shapes, tmp_path / "cut", args, signal.SIGTERM, "1][ 5")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    summary = read_summary(tmp_path / "cut")
    stop = summary["stopped"]
    assert summary["status"] == "interrupted" and stop["signal"] == "SIGTERM" and stop["epoch"] == 1, summary
    assert 5 <= stop["step"] < 25 and "SIGTERM" in summary["error"], summary
    assert err.strip().splitlines()[-1].startswith("interrupted by SIGTERM at global step {}".format(
        stop["global_step"])), err
    assert not os.path.exists(str(tmp_path / "cut" / "run.lock"))
    mid = read_checkpoint(tmp_path / "cut")["mid_epoch"]
    assert (mid["epoch"], mid["step"], mid["signal"]) == (1, stop["step"], "SIGTERM")

    resumed = trained(shapes, tmp_path / "cut", args + ["--resume", "auto"])
    assert "=> continuing epoch 1 at step {} of 25".format(stop["step"]) in resumed.stdout
    first = [line for line in resumed.stdout.splitlines() if line.startswith("Epoch: ")][0]
    assert re.match(r"Epoch: \[1\]\[\s*{}/25\]".format(stop["step"] + 1), first), first  # the next step
    summary = read_summary(tmp_path / "cut")
    assert summary["status"] == "ok" and summary["steps_redone"] == 0
    assert summary["resumed"]["global_step"] == stop["global_step"]
    whole, cut = per_step(tmp_path / "whole"), per_step(tmp_path / "cut")
    assert len(whole[0]) == 50 and cut == whole
    assert same_weights(tmp_path / "whole", tmp_path / "cut")
