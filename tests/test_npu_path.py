"""The NPU decisions of the device layer and the mixed-precision module, checked against the
test-only fake torch_npu / Ascend apex (tests/fake_npu) in a child process. What whole runs on the device double
show (set_device first, overflow steps skipped by torch_npu's GradScaler and by apex, apex.amp.initialize's
arguments) is tested on those runs: tests/test_npu_runs.py."""
import json
import os
import subprocess

import pytest

from conftest import IMPORTS_FAKE_NPU, PY, ROOT, STACK

pytestmark = [STACK, IMPORTS_FAKE_NPU]

FAKE = os.path.join(ROOT, "tests", "fake_npu")


def probe(script, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([PY, os.path.join(ROOT, "tests", script)] + list(args), env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def obs():
    return probe("npu_probe.py")


def test_set_device_first_and_once(obs):
    assert obs["first_call"] == ["set_device", "npu:3"]
    assert obs["set_device_count"] == 1
    assert "one device per process" in obs["second_device"]
    assert obs["name"] == "npu:3"


def test_auto_picks_npu(obs):
    assert obs["auto_kind"] == "npu"


def test_int32_targets_no_pinned_memory_hccl(obs):
    assert obs["target_dtype"] == "torch.int32"
    assert obs["index_dtype"] == "torch.int32"
    assert obs["pin_memory"] is False
    assert obs["backend"] == "hccl"
    assert obs["ddp_device_ids"] == [3]


def test_amp_comes_from_torch_npu(obs):
    assert obs["amp_dtype"] == "torch.float16"  # auto on NPU: the guides' float16 + scaler
    assert obs["autocast_type"].startswith("torch_npu.npu.amp")
    assert obs["scaler_type"].startswith("torch_npu.npu.amp")
    # static scales are dynamic scalers held fixed: torch_npu's dynamic=False never checks for inf/NaN
    assert obs["scaler_static_dynamic_flag"] == [True, True]
    assert obs["scaler_static_scale"] == 128.0


def test_fused_sgd_and_zero_grad(obs):
    assert obs["optimizer"] == "torch_npu.optim.NpuFusedSGD"
    assert obs["optimizer_module"].startswith("torch_npu.optim")
    assert obs["grads_to_none"] is False  # NpuFusedSGD raises on set_to_none=True
    assert obs["optimizer_with_apex"] == "apex.optimizers.NpuFusedSGD"


HELD_1024 = {"loss_scale": "dynamic", "min_loss_scale": 1024.0, "max_loss_scale": 1024.0,
             "dynamic_init_scale": 1024.0}


def test_plain_amp_on_npu_is_native_on_torch_npu_2_and_the_guides_apex_on_1_11(obs):
    # Ascend's AMP guide today: torch_npu's native AMP, with Ascend apex installed too (docs/PRECISION.md)
    assert obs["default_amp"] == {"impl": "native", "loss_scale": None}
    assert obs["default_amp_1_11"] == "apex"
    # seed 000 (the 1.11 guide): parser defaults --opt_level O2, --loss_scale 1024; amp.initialize(combine_grad=True)
    g = obs["guide_amp"]
    assert g["impl"] == "apex" and g["loss_scale"] == 1024.0
    assert g["initialize"] == dict(HELD_1024, opt_level="O2", combine_grad=True, combine_ddp=None)
    assert any("apex.amp O2, loss scale 1024 held fixed, combine_grad" in n for n in g["notes"])
    # the guide's tuning advice: O1 + 128, then O1 dynamic
    assert obs["guide_amp_o1"]["opt_level"] == "O1" and obs["guide_amp_o1"]["min_loss_scale"] == 128.0
    assert obs["guide_amp_dynamic"]["loss_scale"] == "dynamic" and obs["guide_amp_dynamic"]["min_loss_scale"] is None


def test_amp_without_ascend_apex_is_torch_npu_native(obs):
    assert obs["amp_without_apex"] == {"impl": "native", "loss_scale": None, "precision": "float16"}


def test_combine_ddp_goes_to_apex_and_native_refuses_it_and_opt_level_is_noted(obs):
    assert obs["combine_ddp"]["precision"] is True
    assert obs["combine_ddp"]["initialize"]["combine_ddp"] is True
    assert obs["combine_ddp"]["initialize"]["combine_grad"] is True
    assert "--combine-ddp is an option of Ascend apex.amp" in obs["native_combine_ddp"]
    assert any(n.startswith("--opt-level O1 applies to apex only") for n in obs["native_opt_level_notes"])


def test_guides_shufflenet_name_builds_the_npu_variant(obs):
    g = obs["guide_shufflenet"]
    assert g["model"] == "shufflenet_v2_x1_0_npu"
    assert g["class"].startswith("models.shufflenet_npu.")
    assert g["index_dtypes"] == ["torch.int32"]
    assert any("--model-impl torchvision" in n for n in g["notes"])
    assert obs["torchvision_shufflenet"].startswith("torchvision.models")


def test_targets_are_int32_before_the_copy(obs):
    assert obs["target_reaches_device_as"] == ["torch.int32", "torch.int32"]


def test_device_data_backend_decodes_through_torchvision_npu(obs):
    j = obs["npu_jpeg"]
    assert j["shapes"] == [[3, 30, 40], [3, 30, 40]]
    assert j["calls"] == [["decode_jpeg", "npu:3"], ["decode_jpeg", "npu:3"]]
    assert j["auto"] == "cpu" and j["gpu"] == "gpu"  # DVPP is used when asked for, not by default


def test_device_list_checked_against_visible_npus(obs):
    assert "asks for npu device 8 but 8 visible" in obs["too_many"]
    assert "ascending order" in obs["descending"]
