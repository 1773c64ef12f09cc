"""What the porting guides' users do: one writer per output folder, their checkpoints, their device names."""
import json
import os
import re
import signal
import socket
import subprocess

import pytest
import torch

import models
from conftest import ONCE, PY, ROOT, SMALL, STACK, assert_one_line_error, read_lines, read_summary, run_main
from trainer.device import torch_load
from trainer.record import lock
from trainer.errors import UsageError

pytestmark = ONCE

RUN = ["-a", "tiny_cnn", "-b", "4", "--lr", "0.05", "--seed", "3", "--device", "cpu", "-p", "1",
       "--max-steps-per-epoch", "8", "--no-tensorboard"] + SMALL[:6] + ["-j", "0"]


def start(data, out, *extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data, "--output-dir", str(out), "--no-validate"]
                            + RUN + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def epoch_started(n):
    return lambda lines: re.match(r"Epoch: \[{}\]\[".format(n), lines[-1]) is not None


@pytest.mark.timeout(240)
def test_second_run_into_a_busy_folder_exits_2_and_the_first_finishes_untouched(shapes, tmp_path):
    a = start(shapes, tmp_path, "--epochs", "3")
    try:
        read_lines(a, epoch_started(0))
        a.send_signal(signal.SIGSTOP)  # paused mid-epoch, so that it is surely still running when tried
        holder = json.load(open(os.path.join(str(tmp_path), lock.LOCK)))
        assert holder["pid"] == a.pid and holder["host"] == socket.gethostname()
        for extra in ([], ["--resume", "auto"]):
            b = run_main([shapes, "--output-dir", str(tmp_path), "--epochs", "1"] + RUN + extra, timeout=120)
            line = assert_one_line_error(b, "--output-dir '{}' is in use by the run of pid {} on host {} started "
                                         .format(tmp_path, a.pid, socket.gethostname()), "choose another --output-dir")
            assert holder["started"] in line
        a.send_signal(signal.SIGCONT)
        out, err = a.communicate(timeout=180)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err[-2000:].decode()
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["epochs_completed"] == 3
    assert torch_load(s["checkpoint"], weights_only=True)["epoch"] == 3
    assert not os.path.exists(os.path.join(str(tmp_path), lock.LOCK))  # released at the end


@pytest.mark.timeout(240)
def test_a_lock_left_by_kill_9_does_not_block_resume_auto(shapes, tmp_path):
    a = start(shapes, tmp_path, "--epochs", "50")
    try:
        read_lines(a, epoch_started(1))  # epoch 0's checkpoint is written before epoch 1 starts
    finally:
        a.send_signal(signal.SIGKILL)
        a.communicate(timeout=60)
    assert os.path.exists(os.path.join(str(tmp_path), lock.LOCK))  # the file stays; nothing holds it
    b = run_main([shapes, "--output-dir", str(tmp_path), "--epochs", "2", "--resume", "auto", "--no-validate"] + RUN,
                 timeout=180)
    assert b.returncode == 0, b.stderr[-2000:]
    assert "note: took over the lock of the run of pid {}".format(a.pid) in b.stdout
    assert "=> resumed" in b.stdout
    assert read_summary(tmp_path)["epochs_completed"] == 2


def test_stale_lock_without_record_locks_is_judged_by_pid(tmp_path, monkeypatch):
    """A filesystem without POSIX record locks: a holder on this host is alive only if its pid (and start
    time) still run."""
    monkeypatch.setattr(lock, "fcntl", None)
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    with open(os.path.join(str(tmp_path), lock.LOCK), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": dead.pid, "started": "then"}, f)
    with lock.RunLock(str(tmp_path)) as held:
        assert "pid {}".format(dead.pid) in held.taken_over
        with open(held.path) as f:
            assert json.load(f)["pid"] == os.getpid()
        with pytest.raises(UsageError, match="is in use by the run of pid {}".format(os.getpid())):
            lock.RunLock(str(tmp_path)).acquire()  # our own pid is alive
    assert not os.path.exists(os.path.join(str(tmp_path), lock.LOCK))


# ---------------------------------------------------------------- the guides' checkpoints


def _guide_files(data, tmp_path):
    """What the Ascend guide's / pytorch/examples' main.py saves after one epoch of an 8p run: the DDP
    state dict ("module." keys), best_acc1 as a tensor, the optimizer, and apex's amp.state_dict()."""
    classes = len(os.listdir(os.path.join(data, "train")))
    torch.manual_seed(0)
    model = models.get_model("tiny_cnn", num_classes=classes)
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9, weight_decay=1e-4)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    sd = {"module." + k: v for k, v in model.state_dict().items()}
    ckpt = {"epoch": 1, "arch": "tiny_cnn", "state_dict": sd, "best_acc1": torch.tensor(12.5),
            "optimizer": opt.state_dict(), "amp": {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}}}
    path = str(tmp_path / "checkpoint.pth.tar")
    torch.save(ckpt, path)
    weights = str(tmp_path / "resnet_weights.pth")
    torch.save(sd, weights)
    return path, weights, model


@STACK
@pytest.mark.timeout(240)
def test_a_guide_checkpoint_resumes_and_its_weights_load(shapes, tmp_path):
    ckpt, weights, model = _guide_files(shapes, tmp_path)
    out = tmp_path / "run"
    proc = run_main([shapes, "--output-dir", str(out), "--epochs", "2", "--resume", ckpt] + RUN, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "=> resumed '{}' at epoch 1 (best Acc@1 12.5)".format(ckpt) in proc.stdout
    # the guide's "amp" entry is apex's loss scaler: this float32 run says it does not use it
    assert "its loss-scaler state is not restored" in proc.stdout
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 2
    mine = torch_load(s["checkpoint"], weights_only=True)
    assert mine["epoch"] == 2 and "amp" not in mine  # "amp" is written by apex runs only (apex's state)
    assert set(mine["optimizer"]["state"]) == set(torch_load(ckpt, weights_only=True)["optimizer"]["state"])
    # --pretrained: a state-dict-only .pth with DDP's "module." prefix
    out2 = tmp_path / "pre"
    proc = run_main([shapes, "--output-dir", str(out2), "--epochs", "1", "--pretrained", weights, "--evaluate"] + RUN,
                    timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_summary(out2, "eval_summary.json")["status"] == "ok"


def test_gpu_is_cuda_with_the_same_error_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    import main
    errs = []
    for name in ("gpu", "cuda"):
        rc = main.main(["--dummy", "--device", name, "--epochs", "1"])
        errs.append((rc, capsys.readouterr().err))
    assert errs[0] == errs[1] and errs[0][0] == 2 and "--device cuda" in errs[0][1]
