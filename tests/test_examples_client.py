"""Arriving from pytorch/examples' imagenet/main.py: its CI commands run here as typed (a data set of one image
trains, its batch lowered), its --no-accel means the CPU, our checkpoints load in its --resume and -e --resume
(its load sequence, written out below), and ours resumes and evaluates its files, with or without ``module.``."""
import inspect
import os

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import (DOUBLE, FAKE_NPU, ONCE, RANKS, ROOT, SMALL, STACK, assert_one_line_error, read_checkpoint,
                      read_summary, run_main, trained)
from trainer.device import torch_load
from trainer.record.summary import EVAL_SUMMARY
from trainer.optim.schedule import Schedule

pytestmark = [ONCE, pytest.mark.clients, pytest.mark.timeout(240)]

TINY = ["-a", "tiny_cnn", "--epochs", "1"] + SMALL  # a quick run on 32x32 images


def sample(root, images=1, classes=1):
    """pytorch/examples' CI set (run_python_examples.sh, imagenet()): sample/train/n/x.jpg copied to sample/val/n/;
    here ``images`` photo-sized JPEGs per split, in ``classes`` folders."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for i in range(images):
            folder = os.path.join(str(root), "sample", split, "n" if classes == 1 else "n{}".format(i % classes))
            os.makedirs(folder, exist_ok=True)
            pixels = rng.integers(0, 256, size=(96, 128, 3)).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, "x{}.jpg".format(i)), quality=90)
    return os.path.join(str(root), "sample")


def notes(stdout):
    return [line for line in stdout.splitlines() if line.startswith("note: ")]


# -- 1. examples' CI commands, as typed ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [[], ["--gpu", "0"]], ids=["plain", "gpu0"])
def test_examples_ci_command_trains_on_one_image(tmp_path, extra):
    """`main.py --epochs 1 [--gpu 0] sample/` in the folder that holds sample/ (examples' CI, resnet50 at 224 px):
    the batch of 256 is lowered to the one image, with one note naming both; with --gpu 0 and no accelerator the
    run is a CPU run, as examples' is."""
    sample(tmp_path)
    proc = run_main(["--epochs", "1"] + extra + ["sample/"], cwd=str(tmp_path))
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    lowered = [n for n in notes(proc.stdout) if "batch" in n and "256" in n]
    assert len(lowered) == 1, proc.stdout[-3000:]
    assert "fewer than one batch of 256: the batch is lowered to 1 " in lowered[0]
    assert "batch 1 per device, 1 global" in proc.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["epochs_completed"] == 1 and s["global_batch_size"] == 1
    assert read_checkpoint(tmp_path)["config"]["batch_size"] == 1
    if not torch.cuda.is_available():
        assert s["device"] == "cpu"


def test_a_set_smaller_than_a_batch_trains_at_what_it_holds(tmp_path):
    """7 images and -b 32: the batch becomes 7, every step of the epoch full (fixed shapes), the note says 32 and 7."""
    data = sample(tmp_path, images=7, classes=2)
    out = tmp_path / "out"
    proc = trained(data, out, TINY + ["-b", "32"])
    (note,) = [n for n in notes(proc.stdout) if "lowered" in n]
    assert "train/ holds 7 images, fewer than one batch of 32: the batch is lowered to 7 (7 per process x 1 " \
           "process" in note
    s = read_summary(out)
    assert s["global_batch_size"] == 7 and s["status"] == "ok"
    assert "Epoch: [0][1/1]" in proc.stdout  # one full step of 7


def test_a_batch_that_fits_is_kept(tmp_path):
    data = sample(tmp_path, images=8, classes=2)
    proc = trained(data, tmp_path / "out", TINY + ["-b", "8"])
    assert not [n for n in notes(proc.stdout) if "lowered" in n]
    assert read_summary(tmp_path / "out")["global_batch_size"] == 8


@RANKS
def test_two_ranks_lower_the_batch_per_rank(tmp_path):
    """5 images over 2 processes at -b 64: 2 per process (4 global), the fifth image dropped as drop_last does."""
    data = sample(tmp_path, images=5, classes=2)
    out = tmp_path / "out"
    proc = trained(data, out, TINY + ["-b", "64", "--multiprocessing-distributed", "--device-list", "0,1",
                                      "--port", "0", "--device", "cpu"])
    (note,) = [n for n in notes(proc.stdout) if "lowered" in n]
    assert "fewer than one batch of 64: the batch is lowered to 4 (2 per process x 2 processes" in note
    assert read_summary(out)["global_batch_size"] == 4


def test_fewer_images_than_processes_is_one_error(tmp_path):
    """One image for two processes: one `error:` line before any process starts; the output folder untouched."""
    data = sample(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run_main([data, "--output-dir", str(out), "--multiprocessing-distributed", "--device-list", "0,1",
                     "--port", "0", "--device", "cpu", "-b", "2"] + TINY)
    assert_one_line_error(proc, "train/ has 1 image, fewer than the 2 processes")
    assert sorted(os.listdir(str(out))) == ["keep.txt"]


# -- 2. --no-accel --------------------------------------------------------------------------------------------------

def test_no_accel_trains_on_the_cpu(shapes, tmp_path):
    """examples' --no-accel: the CPU even where an accelerator is present (auto would pick it)."""
    trained(shapes, tmp_path, TINY + ["--no-accel", "--max-steps-per-epoch", "2"])
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["device"] == "cpu" and s["config"]["device"] == "cpu"


@pytest.mark.parametrize("device", ["npu", "cuda", "gpu"])
def test_no_accel_with_an_accelerator_device_is_one_error(shapes, tmp_path, device):
    proc = run_main([shapes, "--output-dir", str(tmp_path), "--device", device, "--no-accel"] + TINY)
    assert_one_line_error(proc, "--device {} and --no-accel contradict each other".format(device))
    assert os.listdir(str(tmp_path)) == []


@STACK
@DOUBLE
def test_no_accel_passes_over_an_npu(shapes, tmp_path, npu_double):
    """On the torch_npu double (an NPU present): auto trains on npu:0, --no-accel on the CPU."""
    env = dict(PYTHONPATH=os.pathsep.join([FAKE_NPU, ROOT]), FAKE_NPU_DEVICE_COUNT="1")
    for name, extra, device in (("auto", [], "npu:0"), ("cpu", ["--no-accel"], "cpu")):
        out = tmp_path / name
        proc = run_main([shapes, "--output-dir", str(out), "--max-steps-per-epoch", "2"] + TINY + extra, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert read_summary(out)["device"] == device


# -- 3. checkpoints both ways ---------------------------------------------------------------------------------------

def examples_resume(path, arch="resnet18"):
    """pytorch/examples' imagenet/main.py --resume PATH (and -e --resume PATH: the same load, then validate), as it
    reads a checkpoint on a CPU or with --gpu N: its model (torchvision's, 1000 classes), plain SGD over
    model.parameters(), StepLR(step_size=30, gamma=0.1), then torch.load with the installed torch's default
    weights_only, and the keys it reads. Returns (start_epoch, best_acc1, model, optimizer, scheduler)."""
    import torchvision
    from torch.optim.lr_scheduler import StepLR
    model = torchvision.models.__dict__[arch]()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    checkpoint = torch.load(path)
    start_epoch = checkpoint["epoch"]
    best_acc1 = checkpoint["best_acc1"]
    best_acc1 = best_acc1.to(0 if torch.cuda.is_available() else "cpu")  # examples' --gpu 0: best_acc1.to(args.gpu)
    model.load_state_dict(checkpoint["state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    return start_epoch, best_acc1, model, optimizer, scheduler


EXAMPLES_RUN = ["-a", "resnet18", "--num-classes", "1000", "--max-steps-per-epoch", "2", "-b", "8"] + SMALL


@pytest.fixture(scope="module")
def ours_at_30(shapes, tmp_path_factory):
    """Our resnet18 run (1000 classes, as examples builds it) through epoch 30 (--start-epoch 29): its checkpoint
    holds the LR of epoch 30, where examples' StepLR has divided it by 10."""
    out = tmp_path_factory.mktemp("ours")
    trained(shapes, out, EXAMPLES_RUN + ["--start-epoch", "29", "--epochs", "30"])
    return out


@STACK
def test_examples_resume_loads_our_checkpoint(ours_at_30):
    path = os.path.join(str(ours_at_30), "checkpoint.pth.tar")
    start_epoch, best_acc1, model, optimizer, scheduler = examples_resume(path)
    summary = read_summary(ours_at_30)
    assert start_epoch == 30
    assert float(best_acc1) == summary["best_acc1"]
    assert best_acc1.dim() == 0
    # examples' schedule continues ours: epoch 30 at 0.01, epoch 60 at 0.001 (--lr-schedule step, examples' rule)
    ours = Schedule(0.1, "step", 90, 0.0, 1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(ours(30, 0))
    for epoch in range(30, 61):  # examples' loop: train(epoch), validate, scheduler.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(ours(epoch, 0)), epoch
        optimizer.step()
        scheduler.step()
    # examples' model computes what ours saved
    ckpt = read_checkpoint(ours_at_30)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ckpt["state_dict"][k]), k


@STACK
@pytest.mark.skipif("weights_only" not in inspect.signature(torch.load).parameters,
                    reason="torch.load takes weights_only from torch 1.13 on (trainer.device.torch_load loads without)")
def test_our_checkpoint_loads_with_weights_only(ours_at_30):
    """Everything in our files is plain data and tensors: torch.load(path, weights_only=True), torch >= 2.6's
    default, reads them."""
    for name in ("checkpoint.pth.tar", "model_best.pth.tar"):
        ckpt = torch.load(os.path.join(str(ours_at_30), name), weights_only=True)
        assert {"epoch", "best_acc1", "state_dict", "optimizer", "scheduler"} <= set(ckpt)


def examples_checkpoint(path, prefix):
    """A checkpoint as examples' save_checkpoint writes it after one epoch of resnet18 (1000 classes): its model
    under DataParallel / DDP (``module.``) or bare (CPU, --gpu N), SGD after one step, StepLR stepped once,
    best_acc1 a tensor."""
    import torchvision
    from torch.optim.lr_scheduler import StepLR
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    scheduler.step()
    state_dict = {prefix + k: v for k, v in model.state_dict().items()}
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": state_dict, "best_acc1": torch.tensor(12.5),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, path)
    return model.state_dict()


@STACK
@pytest.mark.parametrize("prefix", ["module.", ""], ids=["ddp", "bare"])
def test_ours_resumes_and_evaluates_examples_checkpoint(shapes, tmp_path, prefix):
    path = str(tmp_path / "checkpoint.pth.tar")
    weights = examples_checkpoint(path, prefix)
    out = tmp_path / "resumed"
    proc = trained(shapes, out, EXAMPLES_RUN + ["--resume", path, "--epochs", "2"])
    assert "=> resumed '{}' at epoch 1 (best Acc@1 12.5)".format(path) in proc.stdout
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 2
    ours = torch_load(os.path.join(str(out), "checkpoint.pth.tar"))
    assert set(ours["state_dict"]) == set(weights)  # saved without module., whatever examples' file held
    proc = run_main([shapes, "--output-dir", str(tmp_path / "eval"), "-e", "--resume", path] + EXAMPLES_RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " *   Acc@1 " in proc.stdout
    e = read_summary(tmp_path / "eval", EVAL_SUMMARY)
    assert e["status"] == "ok" and e["checkpoint"] == path


@STACK
def test_examples_checkpoint_of_another_class_count_is_one_error(shapes, tmp_path):
    """examples' models have 1000 classes; on the 10 class folders here, without --num-classes 1000, one line
    naming the flag."""
    path = str(tmp_path / "checkpoint.pth.tar")
    examples_checkpoint(path, "module.")
    out = tmp_path / "out"
    proc = run_main([shapes, "--output-dir", str(out), "--resume", path, "-a", "resnet18", "--epochs", "2"] + SMALL)
    assert_one_line_error(proc, "its classifier has 1000 classes", "--num-classes 1000")
    assert not out.exists() or os.listdir(str(out)) == []
