"""Every single-process way to train on an NPU, run by main.py on the torch_npu double (tests/fake_npu): mixed
precision (torch_npu's native AMP and Ascend apex O1 and O2, static and dynamic loss scales, an overflow step
skipped), --resume auto after kill -9, --evaluate of a checkpoint an NPU run wrote, the device data backend
(DVPP through torchvision_npu) and --pretrained FILE. Where the computation is the same as on the CPU (float32),
the numbers are the --device cpu run's."""
import json
import math
import os
import re
import signal
import subprocess

import pytest
import torch

from conftest import DOUBLE, PY, ROOT, STACK, child_env, finish, read_lines, read_summary, run_main
from test_npu_double import COMPARED, TRAIN, assert_same_run, double, fake_env, first_loss  # noqa: F401 (fixture)

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(600)]

_AT = TRAIN.index("--epochs") + 1
TWO_EPOCHS = TRAIN[:_AT] + ["2"] + TRAIN[_AT + 1:]
NATIVE_SKIP = "Gradient overflow. Skipping step"  # torch_npu's GradScaler
APEX_SKIP = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to "  # apex's handle.py


def npu_run(data, out, *extra, epochs=1, **env):
    """main.py --device npu on the double: TRAIN's resnet18 for ``epochs`` (1 or 2), ``env`` added."""
    args = [data, "--device", "npu", "--output-dir", str(out)] + (TWO_EPOCHS if epochs == 2 else TRAIN)
    proc = run_main(args + list(extra), env=fake_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def cpu_run(data, out, *extra):
    proc = run_main([data, "--device", "cpu", "--output-dir", str(out)] + TRAIN + list(extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def calls(path):
    """The fake packages' calls a child made (FAKE_NPU_CALL_LOG), as (package, call) pairs."""
    with open(str(path)) as f:
        return [(r["pkg"], r["call"]) for r in map(json.loads, f)]


@pytest.fixture(scope="module")
def reference(shapes, tmp_path_factory):
    """Two float32 epochs on the double: (output folder, stdout); its checkpoints serve the tests below."""
    out = tmp_path_factory.mktemp("reference")
    return out, npu_run(shapes, out, epochs=2).stdout


def epoch_losses(log):
    """The running loss of each epoch's last printed step (pytorch/examples' lines)."""
    found = re.findall(r"^Epoch: \[(\d+)\]\[\s*\d+/\d+\].*?\tLoss \S+ \((\S+)\)", log, re.M)
    return {int(e): float(loss) for e, loss in found}


def assert_finite(summary):
    for key in ("final_loss", "val_loss", "final_acc1"):
        assert math.isfinite(summary[key]), (key, summary[key])


# ---------------------------------------------------------------- mixed precision, an overflow step skipped


BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def assert_skipped_last_step_changed_nothing(flags, skipped_out, tmp_path, data):
    """The run ``skipped_out`` skipped its last (4th) step: its weights, momentum (and apex's master weights) are
    those of the same run stopped after 3 steps. (The batch norms' running statistics are not: the skipped step's
    forward ran.)"""
    three = tmp_path / "three_steps"
    npu_run(data, three, *(list(flags) + ["--max-steps-per-epoch", "3"]))
    a = torch.load(str(skipped_out / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)
    b = torch.load(str(three / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)
    weights = [k for k in a["state_dict"] if not k.endswith(BN_BUFFERS)]
    assert weights and a["state_dict"].keys() == b["state_dict"].keys()
    for key in weights:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    momenta = [(x["momentum_buffer"], y["momentum_buffer"]) for x, y in
               zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values())]
    assert len(momenta) == len(weights) and all(torch.equal(x, y) for x, y in momenta)
    assert len(a["optimizer"].get("master_params", [])) == len(b["optimizer"].get("master_params", []))
    for x, y in zip(a["optimizer"].get("master_params", []), b["optimizer"].get("master_params", [])):
        assert torch.equal(x, y)


@pytest.mark.parametrize("scale", ["128", "dynamic"])
def test_native_amp_skips_the_overflow_step(shapes, tmp_path, reference, scale):
    """torch_npu's autocast and GradScaler on npu:5 (--gpu 5); one step's gradients hold an inf
    (FAKE_NPU_INF_GRAD_STEPS: the last step with the scale held at 128, the second with a dynamic one): that step is
    skipped, counted, and the scale held (128) or halved (dynamic, from 2**16, once per skipped step)."""
    log, out = tmp_path / "calls.jsonl", tmp_path / "run"
    inf_at = "4" if scale == "128" else "2"
    flags = ["--amp", "--loss-scale", scale, "--gpu", "5"]
    proc = npu_run(shapes, out, *flags, FAKE_NPU_INF_GRAD_STEPS=inf_at, FAKE_NPU_CALL_LOG=str(log))
    s = read_summary(out)
    assert s["status"] == "ok" and s["device"] == "npu:5"
    assert_finite(s)
    amp = s["amp"]
    assert (amp["impl"], amp["dtype"], amp["optimizer"]) == ("native", "float16", "torch_npu.optim.NpuFusedSGD")
    skipped = proc.stdout.count(NATIVE_SKIP)
    assert skipped == s["overflow_steps"] == amp["overflow_steps"] and skipped >= 1
    recorded = [c for pkg, c in calls(log) if pkg == "torch_npu"]
    assert recorded[0] == ["set_device", "npu:5"]  # before any other NPU call, and once
    assert sum(1 for c in recorded if c[0] == "set_device") == 1
    assert recorded[1:3] == [["set_compile_mode", False], ["allow_internal_format", False]]  # an Atlas A2's settings
    # torch_npu's GradScaler decides each step, and updates the scale after each
    scaler = [c[0] + ("" if c[0] != "GradScaler.step" else ":" + c[1]) for c in recorded if c[0][:10] == "GradScaler"]
    assert scaler[0] == "GradScaler" and scaler[2::2] == ["GradScaler.update"] * 4
    assert scaler[1::2].count("GradScaler.step:skipped") == skipped and len(scaler) == 9
    if scale == "128":
        assert scaler[1::2] == ["GradScaler.step:stepped"] * 3 + ["GradScaler.step:skipped"]
        assert skipped == 1 and amp["loss_scale"] == amp["final_loss_scale"] == 128.0
        assert_skipped_last_step_changed_nothing(flags, out, tmp_path, shapes)
    else:
        assert scaler[3] == "GradScaler.step:skipped"
        assert amp["loss_scale"] == "dynamic" and amp["final_loss_scale"] == 65536.0 / 2 ** skipped
    ckpt = torch.load(str(out / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)
    assert ckpt["scaler"]["scale"] == amp["final_loss_scale"] and "amp" not in ckpt  # "amp" is apex's entry
    assert ckpt["precision"] == {"impl": "native", "dtype": "float16", "overflow_steps": skipped}
    # the forward in float16: near float32's first loss, not equal to it
    assert first_loss(proc.stdout) == pytest.approx(first_loss(reference[1]), rel=1e-2)
    assert first_loss(proc.stdout) != first_loss(reference[1])


@pytest.mark.parametrize("level,scale", [("O1", None), ("O2", "dynamic"), ("O2", "128")])
def test_apex_amp_skips_the_overflow_step(shapes, tmp_path, reference, level, scale):
    """Ascend apex (the fake: O1 autocasts the forward, O2 trains a float16 model on float32 master weights) with
    the Ascend guide's loss scale (1024 held fixed), a dynamic one and 128 held fixed: the step whose gradients
    hold an inf (the second; the last with 128) is skipped as apex skips it, and counted."""
    log, out = tmp_path / "calls.jsonl", tmp_path / "run"
    flags = ["--amp", "--amp-impl", "apex", "--opt-level", level] + (["--loss-scale", scale] if scale else [])
    inf_at = "4" if scale == "128" else "2"
    proc = npu_run(shapes, out, *flags, FAKE_NPU_INF_GRAD_STEPS=inf_at, FAKE_NPU_CALL_LOG=str(log))
    s = read_summary(out)
    assert s["status"] == "ok"
    assert_finite(s)
    amp = s["amp"]
    assert (amp["impl"], amp["dtype"], amp["opt_level"]) == ("apex", "float16", level)
    assert amp["optimizer"] == "apex.optimizers.NpuFusedSGD"
    recorded = [c for pkg, c in calls(log) if pkg == "apex"]
    [init] = [c[1] for c in recorded if c[0] == "initialize"]
    assert init["opt_level"] == level and init["combine_grad"] is True and init["loss_scale"] == "dynamic"
    assert sum(1 for c in recorded if c[0] == "scale_loss") == 4  # every step's backward through amp.scale_loss
    skipped = proc.stdout.count(APEX_SKIP)
    assert skipped == s["overflow_steps"] == amp["overflow_steps"] and skipped >= 1
    assert sum(1 for c in recorded if c[0] == "skip_step") == skipped
    held = {None: 1024.0, "128": 128.0}.get(scale)
    if held:  # apex's dynamic scaler held by min = max: its static mode would never skip a step
        assert skipped == 1 and amp["loss_scale"] == amp["final_loss_scale"] == held
        assert init["min_loss_scale"] == init["max_loss_scale"] == held
    else:
        assert amp["final_loss_scale"] == 65536.0 / 2 ** skipped
    assert first_loss(proc.stdout) == pytest.approx(first_loss(reference[1]), rel=1e-2)
    assert first_loss(proc.stdout) != first_loss(reference[1])  # computed in float16
    ckpt = torch.load(str(out / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)
    assert {v.dtype for v in ckpt["state_dict"].values() if v.is_floating_point()} == {torch.float32}
    assert ("master_params" in ckpt["optimizer"]) == (level == "O2")  # Ascend apex saves O2's master weights
    assert set(ckpt["amp"]) == {"loss_scaler0"}
    if scale == "128":
        assert_skipped_last_step_changed_nothing(flags, out, tmp_path, shapes)


# ---------------------------------------------------------------- --resume auto after kill -9


APEX_O2 = ["--amp", "--amp-impl", "apex", "--opt-level", "O2", "--loss-scale", "128"]


@pytest.mark.parametrize("flags", [[], APEX_O2], ids=["float32", "apex-O2"])
def test_resume_auto_after_kill_9_ends_as_the_uninterrupted_run(shapes, tmp_path, reference, flags):
    """kill -9 in the second epoch (the first epoch's checkpoint written): --resume auto continues with that
    epoch and ends with the uninterrupted run's numbers (the project's resume is exact), in float32 and with apex
    O2 (its loss scaler and float32 master weights in the checkpoint)."""
    full, full_log = reference
    if flags:
        full = tmp_path / "full"
        full_log = npu_run(shapes, full, *flags, epochs=2).stdout
    out = tmp_path / "killed"
    cmd = [PY, os.path.join(ROOT, "main.py"), shapes, "--device", "npu", "--output-dir", str(out)] + TWO_EPOCHS + \
        flags  # -p 5: each epoch's first step is printed
    env = child_env(**fake_env())
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        read_lines(proc, lambda lines: re.match(r"Epoch: \[1\]\[\s*1/", lines[-1]), timeout=300)
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert torch.load(str(out / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)["epoch"] == 1
    resumed = run_main([shapes, "--device", "npu", "--output-dir", str(out), "--resume", "auto"] + TWO_EPOCHS +
                       flags, env=fake_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "=> resumed" in resumed.stdout
    assert "Epoch: [0]" not in resumed.stdout and "Epoch: [1]" in resumed.stdout
    assert epoch_losses(resumed.stdout)[1] == pytest.approx(epoch_losses(full_log)[1], rel=1e-6, abs=1e-7)
    a, b = read_summary(full), read_summary(out)
    assert b["status"] == "ok" and b["epochs_completed"] == 2
    assert b["final_acc1"] == a["final_acc1"]
    for key in COMPARED:
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), key


# ---------------------------------------------------------------- an NPU run's checkpoint: --evaluate, --pretrained


def test_evaluate_a_checkpoint_of_an_npu_run_on_npu_and_on_cpu(shapes, tmp_path, reference):
    ckpt = str(reference[0] / "checkpoint.pth.tar")
    ran = read_summary(reference[0])
    for device in ("npu", "cpu"):
        out = tmp_path / device
        proc = run_main([shapes, "--device", device, "--output-dir", str(out), "--evaluate", "--resume", ckpt] +
                        TRAIN, env=fake_env() if device == "npu" else None)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "=> evaluating '{}'".format(ckpt) in proc.stdout
        s = read_summary(out, "eval_summary.json")
        assert s["status"] == "ok" and s["device"] == ("npu:0" if device == "npu" else "cpu")
        assert s["final_acc1"] == ran["final_acc1"] and s["val_images"] == ran["val_images"]
        for key in ("final_acc5", "val_loss"):
            assert s[key] == pytest.approx(ran[key], rel=1e-5, abs=1e-5), (device, key)


def test_pretrained_file_of_an_npu_run_trains_on_npu_as_on_cpu(shapes, tmp_path, reference):
    ckpt = str(reference[0] / "checkpoint.pth.tar")
    npu = npu_run(shapes, tmp_path / "npu", "--pretrained", ckpt)
    cpu_run(shapes, tmp_path / "cpu", "--pretrained", ckpt)
    assert_same_run(tmp_path / "npu", tmp_path / "cpu", "npu:0")
    assert read_summary(tmp_path / "npu")["config"]["pretrained"] == ckpt
    assert first_loss(npu.stdout) != first_loss(reference[1])  # it started from the trained weights


# ---------------------------------------------------------------- the device data backend


def test_data_backend_gpu_decodes_every_image_through_torchvision_npu(shapes, tmp_path):
    """--data-backend gpu on NPU: torchvision_npu's decode_jpeg (DVPP) on npu:0 for every image, train and val.
    Its crops are resized on the device by roi_align, the CPU's by an antialiased resize (trainer/data/
    device_backend.py): the numbers are not the CPU run's, and are not compared."""
    log = tmp_path / "calls.jsonl"
    npu_run(shapes, tmp_path / "run", "--data-backend", "gpu", FAKE_NPU_CALL_LOG=str(log))
    s = read_summary(tmp_path / "run")
    assert s["status"] == "ok" and s["data_backend"] == "gpu" and s["data_fallback_images"] == 0
    assert_finite(s)
    decodes = [c for pkg, c in calls(log) if pkg == "torchvision_npu"]
    assert decodes and {c[1] for c in decodes} == {"npu:0"}
    train_images = 4 * 16  # --max-steps-per-epoch 4, -b 16
    assert sum(c[2] for c in decodes) == train_images + s["val_images"]
