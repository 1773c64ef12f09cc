"""The NPU decisions of the device layer and the mixed-precision module, checked against the
test-only fake torch_npu / Ascend apex (tests/fake_npu) in a child process."""
import json
import os
import subprocess

import pytest

from conftest import PY, ROOT

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
    assert obs["amp_dtype"] == "torch.float16"
    assert obs["autocast_type"].startswith("torch_npu.npu.amp")
    assert obs["scaler_type"].startswith("torch_npu.npu.amp")
    assert obs["scaler_static_dynamic_flag"] == [False, True]
    assert obs["scaler_static_scale"] == 128.0


def test_dynamic_scaler_counts_overflow(obs):
    assert obs["native_overflow_steps"] == 1
    assert obs["native_describe"]["impl"] == "native" and obs["native_describe"]["dtype"] == "float16"
    assert "scaler" in obs["native_state_keys"]


def test_fused_sgd_and_zero_grad(obs):
    assert obs["optimizer"] == "torch_npu.optim.NpuFusedSGD"
    assert obs["optimizer_module"].startswith("torch_npu.optim")
    assert obs["grads_to_none"] is False  # NpuFusedSGD raises on set_to_none=True
    assert obs["optimizer_with_apex"] == "apex.optimizers.NpuFusedSGD"


def test_apex_initialize_with_combine_grad(obs):
    assert obs["apex_initialize"] == {"opt_level": "O2", "loss_scale": 128.0, "combine_grad": True}
    assert obs["apex_scale_loss_calls"] == 1
    assert "amp" in obs["apex_state_keys"]
    assert obs["apex_optimizer"] == "apex.optimizers.NpuFusedSGD"


def test_device_list_checked_against_visible_npus(obs):
    assert "asks for npu device 8 but 8 visible" in obs["too_many"]
    assert "ascending order" in obs["descending"]


def test_run_sets_device_before_anything_else(tmp_path):
    out = probe("npu_flow_probe.py", str(tmp_path))
    assert out["calls"][0] == ["set_device", "npu:5"]
    # the flow reached the device (and stopped there: fake NPUs hold no tensors)
    assert out["stopped"] == "NotImplementedError"
    assert sum(1 for c in out["calls"] if c[0] == "set_device") == 1
