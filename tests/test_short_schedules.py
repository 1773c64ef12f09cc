"""Short schedules' techniques, each a flag: --norm-weight-decay (the norm parameters and biases in a parameter group
of their own), --lr-schedule triangular with --lr-peak-epoch, --model-ema. Real runs on generated data (CPU): each
flag's effect in the optimizer, metrics.jsonl, checkpoints and summary.json; a run resumed after epoch 1 equals the
uninterrupted one bit for bit, in one process and in two; bad values are one line."""
import json
import os
import subprocess

import pytest
import torch

import main as entry
from conftest import (IMPORTS_FAKE_NPU, ONCE, PY, RANKS, ROOT, SMALL, STACK, assert_call_error, assert_one_line_error,
                      read_summary, run_main, trained)
from conftest import read_checkpoint as ckpt, read_metrics as records
from test_train import epoch_losses

pytestmark = [ONCE, pytest.mark.timeout(600)]

CPU = ["--device", "cpu", "--seed", "3"] + SMALL
TINY = ["-a", "tiny_cnn", "-b", "16", "--lr", "0.2"] + CPU
RESNET = ["-a", "resnet18", "-b", "8", "--lr", "0.2"] + CPU


def norm_and_bias_tensors(arch):
    """The tensors a normalisation layer holds, and every bias, of ``arch`` as built here (not by the trainer)."""
    import models
    model = models.get_model(arch, num_classes=10)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    return (sum(len(list(m.parameters(recurse=False))) for m in norms)
            + sum(1 for m in model.modules() if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                  and getattr(m, "bias", None) is not None), len(list(model.parameters())))


# ---------------------------------------------------------------- --norm-weight-decay


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
def test_norm_weight_decay_puts_norms_and_biases_in_a_group_of_their_own(shapes, tmp_path, optimizer):
    trained(shapes, tmp_path, RESNET + ["--epochs", "1", "--max-steps-per-epoch", "2", "--optimizer", optimizer,
                                        "--wd", "1e-3", "--norm-weight-decay", "0.25"])
    norms, total = norm_and_bias_tensors("resnet18")
    groups = read_summary(tmp_path)["param_groups"]
    assert [(g["name"], g["tensors"], g["weight_decay"]) for g in groups] == \
        [("weights", total - norms, 1e-3), ("norm_and_bias", norms, 0.25)]
    saved = ckpt(tmp_path)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in saved] == [1e-3, 0.25] and [len(g["params"]) for g in saved] == \
        [total - norms, norms]
    if optimizer == "lars":  # the norm group also skips the trust ratio
        assert [g["lars_exclude"] for g in saved] == [False, True]


def test_norm_weight_decays_help_says_what_the_group_holds_and_where_ffcv_differs():
    # the group above holds the norms and every bias; FFCV exempts only its BatchNorm parameters (not its biases)
    from trainer.flags import build_parser
    text = " ".join(next(a.help for a in build_parser()._actions if a.dest == "norm_weight_decay").split())
    assert "every bias" in text and "as FFCV's" not in text
    assert "FFCV's recipes exempt only BatchNorm parameters" in text


def test_without_the_flag_sgd_keeps_one_group_at_wd_and_lars_its_exclusion(shapes, tmp_path):
    trained(shapes, tmp_path / "sgd", TINY + ["--epochs", "1", "--max-steps-per-epoch", "1", "--wd", "1e-3"])
    groups = read_summary(tmp_path / "sgd")["param_groups"]
    assert [(g["name"], g["tensors"], g["weight_decay"]) for g in groups] == [("all", 8, 1e-3)]
    trained(shapes, tmp_path / "lars", TINY + ["--epochs", "1", "--max-steps-per-epoch", "1", "--wd", "1e-3",
                                               "--optimizer", "lars"])
    groups = read_summary(tmp_path / "lars")["param_groups"]
    assert [(g["name"], g["tensors"], g["weight_decay"]) for g in groups] == \
        [("weights", 4, 1e-3), ("norm_and_bias", 4, 0.0)]  # tiny_cnn: 4 weights, 4 biases


@STACK
def test_norm_weight_decay_changes_only_what_it_names(shapes, tmp_path):
    """One plain SGD step (no momentum, --wd 0) from the same start and batch: --norm-weight-decay 5 takes
    lr x 5 x the initial bias off each bias, and leaves the weights as --norm-weight-decay 0 does."""
    base = TINY + ["--epochs", "1", "--max-steps-per-epoch", "1", "--momentum", "0", "--wd", "0"]
    trained(shapes, tmp_path / "start", base + ["--norm-weight-decay", "0", "--lr", "0"])
    trained(shapes, tmp_path / "a", base + ["--norm-weight-decay", "0"])
    trained(shapes, tmp_path / "b", base + ["--norm-weight-decay", "5"])
    start, a, b = (ckpt(tmp_path / n)["state_dict"] for n in ("start", "a", "b"))
    assert sorted(k for k in a if k.endswith("bias")) == ["fc.bias", "features.0.bias", "features.2.bias",
                                                           "features.4.bias"]
    for k in a:
        if k.endswith("bias"):
            assert torch.allclose(b[k], a[k] - 0.2 * 5 * start[k], rtol=0, atol=1e-6), k
            assert not torch.equal(a[k], b[k]), k
        else:
            assert torch.equal(a[k], b[k]) and not torch.equal(a[k], start[k]), k


# ---------------------------------------------------------------- --lr-schedule triangular


def triangle(lr, x, peak, epochs):
    """The schedule as FFCV's recipes interpolate it, computed here with numpy."""
    import numpy as np
    return lr * float(np.interp(x, [0, peak, epochs], [1e-4, 1.0, 0.0]))


def test_the_triangle_is_a_function_of_the_position_per_step_and_per_epoch():
    from trainer.optim.schedule import Schedule
    s = Schedule(0.8, "triangular", 5, 0, 7, peak_epoch=2.5)
    assert [s(e, i) for e in range(5) for i in range(7)] == pytest.approx(
        [triangle(0.8, e + i / 7.0, 2.5, 5) for e in range(5) for i in range(7)], rel=1e-12, abs=1e-15)
    assert Schedule(0.8, "triangular", 5, 0, 7, peak_epoch=2.5)(3, 4) == s(3, 4)  # nothing kept between calls
    at_zero = Schedule(0.8, "triangular", 5, 0, 7, peak_epoch=0)
    assert at_zero(0, 0) == 0.8 and at_zero(4, 6) == pytest.approx(0.8 / 35)  # no rise: from the peak down
    per_epoch = Schedule(0.8, "triangular", 5, 0, 7, unit="epoch", peak_epoch=2)
    assert [per_epoch(e, 3) for e in range(5)] == pytest.approx([triangle(0.8, e, 2, 5) for e in range(5)])


def test_triangular_lr_rises_to_the_peak_epoch_and_falls_to_zero_every_step(shapes, tmp_path):
    trained(shapes, tmp_path, TINY + ["--epochs", "4", "--max-steps-per-epoch", "2", "-p", "1", "--lr-schedule",
                                      "triangular", "--lr-peak-epoch", "1.5", "--norm-weight-decay", "0"])
    recs = records(tmp_path)
    lrs = [lr for r in recs for _, lr in r["step_lrs"]]
    assert [s for r in recs for s, _ in r["step_lrs"]] == list(range(1, 9))  # every step printed (-p 1)
    assert lrs == pytest.approx([triangle(0.2, t / 2.0, 1.5, 4) for t in range(8)], rel=1e-12, abs=1e-15)
    assert max(lrs) == lrs[3] == pytest.approx(0.2)  # the peak at step 3: epoch 1.5
    assert lrs[0] == pytest.approx(0.2 * 1e-4) and lrs[-1] == pytest.approx(0.2 / 5)  # to zero after the last
    assert [r["lr"] for r in recs] == [r["step_lrs"][-1][1] for r in recs]
    saved = ckpt(tmp_path)
    # every group holds the LR the schedule starts the next epoch at (pytorch/examples' --resume goes on from it):
    # after the last epoch the triangle's end, 0
    assert {g["lr"] for g in saved["optimizer"]["param_groups"]} == {triangle(0.2, 4.0, 1.5, 4)} == {0.0}
    assert saved["lr_schedule"]["kind"] == "triangular" and saved["lr_schedule"]["peak_epoch"] == 1.5


# ---------------------------------------------------------------- --model-ema


def flat_ema(entry_):
    return {k[len("module."):]: v for k, v in entry_.items() if k.startswith("module.")}


@STACK
def test_model_ema_averages_the_weights_is_validated_checkpointed_and_evaluated(shapes, tmp_path):
    """-b 8, an update every step, 2 epochs: decay 0.875 is adjusted to 1 - 0.125 x 8 x 1 / 2 = 0.5. With one
    step an epoch, the first update copies the weights w1 and the second gives (w1 + w2) / 2, BatchNorm statistics
    included; integer counters follow the model."""
    proc = trained(shapes, tmp_path, RESNET + ["--epochs", "2", "--max-steps-per-epoch", "1", "--model-ema",
                                               "--model-ema-steps", "1", "--model-ema-decay", "0.875",
                                               "--checkpoint-freq", "1"])
    assert "decay 0.5 per update" in proc.stdout
    first, last = ckpt(tmp_path, "checkpoint_epoch1.pth.tar"), ckpt(tmp_path)
    assert int(first["model_ema"]["n_averaged"]) == 1 and int(last["model_ema"]["n_averaged"]) == 2
    w1, w2 = first["state_dict"], last["state_dict"]
    e1, e2 = flat_ema(first["model_ema"]), flat_ema(last["model_ema"])
    assert e1.keys() == w1.keys() and all(torch.equal(e1[k], w1[k]) for k in w1)
    moved = 0
    for k in w2:
        if w2[k].is_floating_point():
            assert torch.allclose(e2[k], (w1[k] + w2[k]) / 2, rtol=1e-6, atol=1e-6), k
            moved += not torch.equal(e2[k], w2[k])
        else:
            assert torch.equal(e2[k], w2[k]), k  # num_batches_tracked
    assert moved > 50  # the average is not the weights
    s = read_summary(tmp_path)
    ema = s["model_ema"]
    assert (ema["decay"], ema["decay_per_update"], ema["every_steps"], ema["updates"]) == (0.875, 0.5, 1, 2)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(" *   ")]
    assert len(lines) == 4 and lines[1].startswith(" *   EMA Acc@1 ") and lines[3] == \
        " *   EMA Acc@1 {:.3f} Acc@5 {:.3f}".format(ema["final_acc1"], ema["final_acc5"])
    assert lines[2] == " *   Acc@1 {:.3f} Acc@5 {:.3f}".format(s["final_acc1"], s["final_acc5"])
    assert [r["ema_val_acc1"] for r in records(tmp_path)][-1] == ema["final_acc1"]
    assert any(line.startswith("Test EMA: [") for line in proc.stdout.splitlines())
    evaluated = run_main([shapes, "-e", "--model-ema", "--resume", os.path.join(str(tmp_path), "checkpoint.pth.tar"),
                          "--output-dir", str(tmp_path / "eval"), "-a", "resnet18", "-b", "8"] + CPU)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    e = read_summary(tmp_path / "eval", "eval_summary.json")
    assert (e["final_acc1"], e["final_acc5"]) == (ema["final_acc1"], ema["final_acc5"])


@STACK
def test_model_ema_copies_the_weights_during_warm_up(shapes, tmp_path):
    trained(shapes, tmp_path, TINY + ["--epochs", "2", "--max-steps-per-epoch", "1", "--warmup-epochs", "1",
                                      "--model-ema", "--model-ema-steps", "1", "--model-ema-decay", "0.9"])
    saved = ckpt(tmp_path)
    ema = flat_ema(saved["model_ema"])
    assert int(saved["model_ema"]["n_averaged"]) == 1  # reset during the warm-up; the epoch after copied once
    assert all(torch.equal(ema[k], v) for k, v in saved["state_dict"].items())


@STACK
def test_model_ema_updates_on_every_nth_step_of_an_epoch_also_without_validation(shapes, tmp_path):
    proc = trained(shapes, tmp_path, TINY + ["--epochs", "2", "--max-steps-per-epoch", "5", "--model-ema",
                                             "--model-ema-steps", "2", "--no-validate"])
    assert int(ckpt(tmp_path)["model_ema"]["n_averaged"]) == 6  # steps 0, 2, 4 of each epoch
    s = read_summary(tmp_path)
    assert s["model_ema"]["updates"] == 6 and s["model_ema"]["final_acc1"] is None
    assert any("--model-ema with --no-validate" in n for n in s["notes"]) and "Test EMA" not in proc.stdout


@STACK
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.set_sync_debug_mode)")
def test_model_ema_updates_without_a_host_sync_on_cuda():
    import models
    from trainer.config import OptimConfig
    from trainer.optim.ema import ModelEMA
    model = models.get_model("resnet18", num_classes=10).cuda()
    ema = ModelEMA(model, OptimConfig(model_ema=True, model_ema_steps=1, model_ema_decay=0.9), 8, 2, 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
    try:
        for i in range(3):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            ema.update(0, i)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ema.updates == 3 and int(ema.averaged.n_averaged) == 3
    assert not torch.equal(ema.module.fc.weight, model.fc.weight)


NPU_SCRIPT = r"""
import json, torch
import torch_npu, apex  # the fakes
assert getattr(torch_npu, "FAKE", False)
from trainer.config import OptimConfig
from trainer.device import Device
from trainer.optim import build
from trainer.optim.ema import ModelEMA
from trainer.precision import amp as ampmod
dev = Device.create("npu", 0)
obs = {}
for impl in ("native", "apex"):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    prec = ampmod.Precision("float16", impl, torch.float16, 128.0, "O2" if impl == "apex" else None)
    section = OptimConfig(weight_decay=1e-3, norm_weight_decay=0.0, model_ema=True, model_ema_steps=1,
                          model_ema_decay=0.9)
    m, step = ampmod.wrap(build(section, m, dev, prec), prec, dev, m)
    ema = ModelEMA(m, section, 8, 1, 2)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for i in range(2):
        with step.autocast():
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        step.zero_grad()
        step(loss)
        ema.update(0, i)
    obs[impl] = {"name": step.name, "groups": [[len(g["params"]), g["weight_decay"]]
                                               for g in step.optimizer.param_groups],
                 "ema_updates": int(ema.averaged.n_averaged),
                 "ema_moved": not torch.equal(ema.module[0].weight, m[0].weight)}
print(json.dumps(obs))
"""


@STACK
@IMPORTS_FAKE_NPU
def test_norm_groups_and_the_average_on_the_npu_paths_native_and_apex():
    """On NPU, SGD is the device's NpuFusedSGD (apex's under Ascend apex.amp): it takes the two groups with their
    weight decay, and the average follows the steps."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests", "fake_npu"), ROOT]),
               FAKE_NPU_DEVICE_COUNT="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([PY, "-c", NPU_SCRIPT], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    obs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert obs["native"]["name"] == "torch_npu.optim.NpuFusedSGD"
    assert obs["apex"]["name"] == "apex.optimizers.NpuFusedSGD"
    for impl in ("native", "apex"):
        assert obs[impl]["groups"] == [[1, 1e-3], [3, 0.0]], obs  # Linear's weight; its bias, BN's weight and bias
        assert obs[impl]["ema_updates"] == 2 and obs[impl]["ema_moved"], obs


# ---------------------------------------------------------------- exact resume

SCHEDULE_AND_EMA = ["--lr-schedule", "triangular", "--lr-peak-epoch", "0.5", "--model-ema", "--model-ema-steps", "2",
                    "--model-ema-decay", "0.99"]
ALL = SCHEDULE_AND_EMA + ["--norm-weight-decay", "0"]


def assert_same_run(a, b):
    """Two output folders' last checkpoints and records equal bit for bit: weights, optimizer state and groups,
    the average; the resumed epoch's LRs and losses."""
    ca, cb = ckpt(a), ckpt(b)
    assert ca["epoch"] == cb["epoch"] == 2
    for key in ("state_dict", "model_ema"):
        assert ca[key].keys() == cb[key].keys()
        for k in ca[key]:
            assert torch.equal(ca[key][k], cb[key][k]), (key, k)
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]), k
    assert ca["optimizer"]["param_groups"] == cb["optimizer"]["param_groups"]
    ra, rb = records(a)[-1], records(b)[-1]
    assert ra["epoch"] == rb["epoch"] == 1
    for key in ("step_lrs", "step_losses", "train_loss", "val_acc1", "ema_val_acc1", "ema_val_loss"):
        assert ra[key] == rb[key], key


@STACK
def test_a_run_resumed_after_epoch_one_equals_the_uninterrupted_run(shapes, tmp_path):
    length = ["--epochs", "2", "--max-steps-per-epoch", "3", "-p", "1"]
    args = RESNET + ALL + length
    full = trained(shapes, tmp_path / "full", args + ["--checkpoint-freq", "1"])
    kept = os.path.join(str(tmp_path / "full"), "checkpoint_epoch1.pth.tar")  # where an interrupted run stops
    resumed = trained(shapes, tmp_path / "part", args + ["--resume", kept])
    assert "=> resumed" in resumed.stdout and "Epoch: [0]" not in resumed.stdout
    assert epoch_losses(resumed.stdout)[1] == epoch_losses(full.stdout)[1]
    assert_same_run(tmp_path / "full", tmp_path / "part")
    assert read_summary(tmp_path / "part")["model_ema"]["updates"] == 4

    # the command line's weight decay wins over the checkpoint's, as its LR does, with a note
    changed = trained(shapes, tmp_path / "changed", RESNET + SCHEDULE_AND_EMA + length + [
        "--norm-weight-decay", "0.5", "--resume", kept])
    assert "note: the command line wins over the checkpoint's optimizer: norm_and_bias weight_decay 0.5 " \
        "(checkpoint 0.0)" in changed.stdout
    assert [g["weight_decay"] for g in ckpt(tmp_path / "changed")["optimizer"]["param_groups"]] == [1e-4, 0.5]

    # another split of the parameters does not fit the checkpoint's optimizer: one line, nothing written
    with open(kept, "rb") as f:
        before = f.read()
    other = RESNET + SCHEDULE_AND_EMA + length
    wrong = run_main([shapes, "--output-dir", str(tmp_path / "wrong"), "--resume", kept] + other)
    assert_one_line_error(wrong, "the checkpoint's optimizer has 2 parameter group(s) and this run's 1 (all)",
                          "resume as the checkpoint was trained (--norm-weight-decay 0)")
    with open(kept, "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.join(str(tmp_path / "wrong"), "checkpoint.pth.tar"))


@STACK
@RANKS
def test_two_ranks_resumed_after_epoch_one_equal_the_uninterrupted_job(shapes, tmp_path):
    args = ["-a", "tiny_cnn", "-b", "16", "--lr", "0.2"] + CPU + ALL + [
        "--epochs", "2", "--max-steps-per-epoch", "3", "-p", "1", "--multiprocessing-distributed",
        "--device-list", "0,1", "--port", "0", "--dist-timeout", "120"]
    trained(shapes, tmp_path / "full", args + ["--checkpoint-freq", "1"])
    kept = os.path.join(str(tmp_path / "full"), "checkpoint_epoch1.pth.tar")
    resumed = trained(shapes, tmp_path / "part", args + ["--resume", kept])
    assert "=> resumed" in resumed.stdout
    s = read_summary(tmp_path / "part")
    assert s["world_size"] == 2 and s["model_ema"]["updates"] == 4
    assert_same_run(tmp_path / "full", tmp_path / "part")


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize("argv,fragments", [
    (["--lr-schedule", "triangular", "--epochs", "2"], ("--lr-peak-epoch 2 (the default)", "below 2")),
    (["--lr-schedule", "triangular", "--epochs", "3", "--lr-peak-epoch", "4"], ("--lr-peak-epoch 4", "--epochs 3")),
    (["--lr-peak-epoch", "1"], ("--lr-peak-epoch applies to --lr-schedule triangular",)),
    (["--lr-schedule", "triangular", "--lr-peak-epoch", "1", "--warmup-epochs", "1"],
     ("triangular", "--warmup-epochs 0")),
    (["--lr-peak-epoch", "-1"], ("--lr-peak-epoch", "at least 0")),
    (["--norm-weight-decay", "-0.1"], ("--norm-weight-decay", "at least 0")),
    (["--model-ema-decay", "0.9"], ("--model-ema-decay needs --model-ema",)),
    (["--model-ema-steps", "4"], ("--model-ema-steps needs --model-ema",)),
    (["--model-ema", "--model-ema-decay", "1"], ("--model-ema-decay must be below 1",)),
    (["--model-ema", "--model-ema-steps", "0"], ("--model-ema-steps", "at least 1")),
    (["--model-ema", "-e"], ("--evaluate --model-ema", "--resume CHECKPOINT")),
    # FFCV's other techniques (tests/test_resolution.py): the schedule against --train-crop-size, BlurPool's archs
    (["--min-res", "32", "--max-res", "64", "--start-ramp", "0", "--end-ramp", "1"],
     ("--train-crop-size 32 and --min-res contradict",)),
    (["--blurpool"], ("--blurpool applies to torchvision's ResNets", "not to -a tiny_cnn")),
    (["--val-tta", "hflip"], ("--val-tta", "invalid choice")),
])
def test_a_bad_value_is_one_line(shapes, tmp_path, capsys, argv, fragments):
    assert_call_error(entry.main, [shapes, "--output-dir", str(tmp_path)] + TINY + argv, capsys, *fragments)
    assert not os.listdir(str(tmp_path))


def test_evaluating_the_average_of_a_run_without_one_is_one_line(shapes, tmp_path, capsys):
    trained(shapes, tmp_path / "plain", TINY + ["--epochs", "1", "--max-steps-per-epoch", "1"])
    path = os.path.join(str(tmp_path / "plain"), "checkpoint.pth.tar")
    assert_call_error(entry.main, [shapes, "-e", "--model-ema", "--resume", path, "--output-dir",
                                   str(tmp_path / "eval")] + TINY, capsys, "holds no weight average",
                      "without --model-ema")
