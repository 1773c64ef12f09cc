"""End-to-end runs of main.py on generated data (CPU)."""
import math
import os
import re
import signal
import subprocess

import pytest
import torch

from conftest import ONCE, PY, ROOT, SMALL, STACK, WAYS, child_env, finish, read_lines, read_summary, run_main
from trainer.device import torch_load
from tools.make_dataset import generate

pytestmark = STACK

TRAIN = ["-a", "tiny_cnn", "--lr", "0.1", "-b", "16", "--wd", "0", "--crop-scale-min", "0.35", "--seed", "0"] + SMALL


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    """150 train / 10 val images per class: tiny_cnn learns it in 2 epochs."""
    out = str(tmp_path_factory.mktemp("data") / "learnable")
    return generate(out, classes=10, train_per_class=150, val_per_class=10, size=32, seed=3)


@pytest.fixture(scope="module")
def full_run(learnable, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "full"
    proc = run_main([learnable, "--epochs", "2", "--output-dir", str(out)] + TRAIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def epoch_losses(stdout):
    """Last printed running loss of each epoch, from examples-format lines."""
    last = {}
    for m in re.finditer(r"^Epoch: \[(\d+)\]\[\s*(\d+)/(\d+)\].*?Loss \S+ \((\S+)\)", stdout, re.M):
        last[int(m.group(1))] = float(m.group(4))
    return last


@WAYS
def test_two_epochs_learn_far_above_chance(full_run):
    out, proc = full_run
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 2
    assert s["final_acc1"] >= 30.0, s["final_acc1"]  # 10 classes: chance is 10 %
    assert s["val_images"] == 100
    assert s["train_fps"] > 0 and 0 <= s["data_time_fraction"] < 1
    assert os.path.isfile(s["checkpoint"]) and os.path.isfile(s["best_checkpoint"])
    # pytorch/examples' line formats, which acceptance tooling greps
    assert re.search(r"^Epoch: \[1\]\[\s*\d+/93\]\tTime +[\d.]+ \( *[\d.]+\)\tData +[\d.]+ \( *[\d.]+\)\t"
                     r"Loss [\d.e+-]+ \([\d.e+-]+\)\tAcc@1 +[\d.]+ \( *[\d.]+\)\tAcc@5 +[\d.]+ \( *[\d.]+\)$",
                     proc.stdout, re.M), proc.stdout[:2000]
    assert re.search(r"^ \*   Acc@1 [\d.]+ Acc@5 [\d.]+$", proc.stdout, re.M)
    ck = torch_load(s["checkpoint"], map_location="cpu", weights_only=True)
    assert ck["epoch"] == 2 and ck["arch"] == "tiny_cnn" and torch.is_tensor(ck["best_acc1"])
    assert float(ck["best_acc1"]) == s["best_acc1"]
    for key in ("optimizer", "scheduler", "lr_schedule", "precision", "rng", "config", "state_dict"):
        assert key in ck


@WAYS
def test_resume_from_epoch_one_matches_uninterrupted_run(learnable, full_run, tmp_path):
    out_full, proc_full = full_run
    first = run_main([learnable, "--epochs", "1", "--output-dir", str(tmp_path)] + TRAIN)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_main([learnable, "--epochs", "2", "--resume", "auto", "--output-dir", str(tmp_path)] + TRAIN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "=> resumed" in resumed.stdout
    assert "Epoch: [0]" not in resumed.stdout  # continued at the next epoch
    full_losses, resumed_losses = epoch_losses(proc_full.stdout), epoch_losses(resumed.stdout)
    assert resumed_losses[1] == pytest.approx(full_losses[1], rel=1e-5, abs=1e-6)
    a = read_summary(out_full)
    b = read_summary(tmp_path)
    assert b["final_acc1"] == pytest.approx(a["final_acc1"], abs=1e-6)
    assert b["final_loss"] == pytest.approx(a["final_loss"], rel=1e-5)


def test_bf16_amp_on_cpu(shapes, tmp_path):
    proc = run_main([shapes, "--epochs", "1", "--amp", "--amp-dtype", "bfloat16", "--loss-scale", "128",
                     "--max-steps-per-epoch", "4",
                     "--output-dir", str(tmp_path), "-a", "resnet18", "-b", "8", "--channels-last"] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_summary(tmp_path)
    assert s["amp"]["enabled"] and s["amp"]["dtype"] == "bfloat16" and s["amp"]["impl"] == "native"
    assert s["channels_last"] is True
    assert "needs no loss scaling" in proc.stdout  # --loss-scale is explained, not silently dropped
    assert math.isfinite(s["final_loss"]) and s["val_images"] == 100


def test_validation_counts_every_image_once_with_odd_batch(shapes, tmp_path):
    # 100 val images, batch 7: 15 batches, the last padded with 5 masked images
    proc = run_main([shapes, "--epochs", "1", "--max-steps-per-epoch", "2", "-b", "7",
                     "--output-dir", str(tmp_path), "-a", "tiny_cnn"] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_summary(tmp_path)["val_images"] == 100
    assert "Test: [15/15]" in proc.stdout


def test_evaluate_checkpoint_writes_eval_summary(full_run, learnable):
    out, _ = full_run
    proc = run_main([learnable, "-e", "--resume", str(out / "model_best.pth.tar"), "--output-dir", str(out),
                     "-a", "tiny_cnn", "-b", "16"] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = read_summary(out, "eval_summary.json")
    best = read_summary(out)["best_acc1"]
    assert ev["status"] == "ok" and ev["val_images"] == 100
    assert ev["final_acc1"] == pytest.approx(best, abs=1e-6)


@ONCE
def test_dummy_data_run(tmp_path):
    proc = run_main(["--dummy", "-a", "tiny_cnn", "--epochs", "1", "--max-steps-per-epoch", "3", "-b", "64",
                     "--num-classes", "10", "--output-dir", str(tmp_path), "--fps-warmup-steps", "1"]
                    + SMALL[:6], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_summary(tmp_path)
    assert s["val_images"] == 50000 and s["data_layout"] == "synthetic" and s["train_fps"] > 0
    # the run's process set up its host memory (what it chose depends on this environment's MALLOC_*)
    assert s["host_memory"].startswith(("kept", "user's", "system allocator")), s["host_memory"]


@ONCE
def test_refuses_to_overwrite_an_existing_run(full_run, learnable):
    out, _ = full_run
    before = (out / "checkpoint.pth.tar").read_bytes()
    proc = run_main([learnable, "--epochs", "1", "--output-dir", str(out)] + TRAIN)
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert (out / "checkpoint.pth.tar").read_bytes() == before


def test_resuming_a_finished_run_changes_nothing(full_run, learnable):
    out, _ = full_run
    before = {f: (out / f).read_bytes() for f in ("summary.json", "checkpoint.pth.tar")}
    proc = run_main([learnable, "--epochs", "2", "--resume", "auto", "--output-dir", str(out)] + TRAIN)
    assert proc.returncode == 2 and "nothing left to train" in proc.stderr, proc.stderr[-2000:]
    assert {f: (out / f).read_bytes() for f in before} == before


def test_hard_crash_while_writing_checkpoint_keeps_previous(tmp_path):
    path = tmp_path / "checkpoint.pth.tar"
    code = (
        "import os, sys, torch\n"
        "sys.path.insert(0, {root!r})\n"
        "from trainer.record import checkpoint\n"
        "checkpoint.save({{'epoch': 1, 'w': torch.arange(10)}}, {path!r})\n"
        "def half(f):\n"
        "    f.write(b'PK' + b'x' * 1000); f.flush(); os._exit(9)\n"
        "checkpoint.atomic_write({path!r}, half)\n"
    ).format(root=ROOT, path=str(path))
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9
    ck = torch_load(str(path), weights_only=True)
    assert ck["epoch"] == 1 and torch.equal(ck["w"], torch.arange(10))


def test_exception_while_writing_checkpoint_keeps_previous_and_cleans_up(tmp_path):
    from trainer.record import checkpoint
    path = str(tmp_path / "checkpoint.pth.tar")
    checkpoint.save({"epoch": 1}, path)

    def broken(f):
        f.write(b"partial")
        raise OSError("disk full")
    with pytest.raises(OSError):
        checkpoint.atomic_write(path, broken)
    assert torch_load(path, weights_only=True)["epoch"] == 1
    assert os.listdir(str(tmp_path)) == ["checkpoint.pth.tar"]


@ONCE
def test_ctrl_c_writes_interrupted_summary(shapes, tmp_path):
    p = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), shapes, "-a", "resnet18", "--epochs", "50", "-b", "4",
                          "--output-dir", str(tmp_path), "-p", "1"] + SMALL[:6] + ["-j", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                         # a background job inherits SIGINT ignored; a terminal's Ctrl-C is not
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    read_lines(p, lambda lines: re.match(r"Epoch: \[0\]\[\s*2/", lines[-1]), timeout=120)
    p.send_signal(signal.SIGINT)
    out, err = finish(p, timeout=120)
    assert p.returncode == 130, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"interrupted by SIGINT at global step \d+: summary and checkpoints in "
                                            r"'{}'; continue with --resume auto".format(re.escape(str(tmp_path))),
                                            lines[0]), err
    summary = read_summary(tmp_path)
    assert summary["status"] == "interrupted" and summary["stopped"]["signal"] == "SIGINT"


def test_corrupt_image_stops_run_naming_file(tmp_path):
    root = generate(str(tmp_path / "d"), classes=2, train_per_class=8, val_per_class=2, size=16, seed=0)
    bad = os.path.join(root, "train", sorted(os.listdir(os.path.join(root, "train")))[1], "broken.JPEG")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not really a jpeg")
    proc = run_main([root, "-a", "tiny_cnn", "--epochs", "1", "-b", "17", "--output-dir", str(tmp_path / "o"),
                     "--train-crop-size", "16", "--val-resize-size", "16", "--val-crop-size", "16", "-j", "1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "broken.JPEG" in err[0] and err[0].startswith("error: cannot decode image"), err
    assert read_summary(tmp_path / "o")["status"] == "failed"
