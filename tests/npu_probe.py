"""Run in a child process with tests/fake_npu on PYTHONPATH: exercises the trainer's NPU
decisions against the fake torch_npu / apex and prints one JSON object of observations."""
import json
import os
import sys

import torch

import torch_npu  # the fake (tests/fake_npu)
import apex  # the fake Ascend apex

assert getattr(torch_npu, "FAKE", False), "the real torch_npu must never be probed by tests"

from trainer import amp as ampmod  # noqa: E402
from trainer import device as devmod  # noqa: E402
from trainer.config import parse_config  # noqa: E402
from trainer.errors import UsageError  # noqa: E402

obs = {}


def first_calls(n=3):
    return [list(c[:2]) for c in torch_npu.calls[:n]]


# 1. set_device first and once
torch_npu.reset_calls()
dev = devmod.Device.create("npu", 3)
obs["first_call"] = first_calls(1)[0]
devmod.Device.create("npu", 3)
obs["set_device_count"] = sum(1 for c in torch_npu.calls if c[0] == "set_device")
try:
    devmod.Device.create("npu", 4)
    obs["second_device"] = "allowed"
except RuntimeError as exc:
    obs["second_device"] = str(exc)
obs["auto_kind"] = devmod.resolve_kind("auto")
obs["name"] = dev.name
obs["target_dtype"] = str(dev.target_dtype)
obs["index_dtype"] = str(dev.index_dtype)
obs["pin_memory"] = dev.pin_memory
obs["backend"] = dev.dist_backend
obs["ddp_device_ids"] = dev.ddp_device_ids
obs["amp_dtype"] = str(dev.amp_dtype)

# 2. autocast and GradScaler come from torch_npu.npu.amp
ctx = dev.autocast(True)
obs["autocast_type"] = type(ctx).__module__ + "." + type(ctx).__name__
static = dev.grad_scaler(128.0)
dynamic = dev.grad_scaler(None)
obs["scaler_type"] = type(static).__module__ + "." + type(static).__name__
obs["scaler_static_dynamic_flag"] = [static.state_dict().get("dynamic"), dynamic.state_dict().get("dynamic")]
obs["scaler_static_scale"] = float(static.get_scale())

# 3. optimizer
model = torch.nn.Linear(4, 3)
opt, name = dev.sgd(model.parameters(), 0.1, 0.9, 1e-4)
obs["optimizer"] = name
obs["optimizer_module"] = type(opt).__module__
obs["grads_to_none"] = devmod.Device.zero_grad_to_none(name)
opt2, name2 = dev.sgd(model.parameters(), 0.1, 0.9, 1e-4, apex_amp_in_use=True)
obs["optimizer_with_apex"] = name2


def cfg_for(*argv):
    cfg, _ = parse_config(["--dummy"] + list(argv), env={})
    return cfg


# 4. native amp on the NPU path: scaler from torch_npu, overflow counted
cfg = cfg_for("--amp", "--device", "npu")
mp = ampmod.MixedPrecision(cfg, dev)
m = torch.nn.Linear(4, 3)
o, oname = dev.sgd(m.parameters(), 0.1, 0.0, 0.0)
m, o = mp.setup(m, o)
x, y = torch.randn(8, 4), torch.randint(0, 3, (8,), dtype=torch.int32)
for poison in (False, True):
    with mp.autocast():
        loss = torch.nn.functional.cross_entropy(m(x), y.long())
    if poison:
        loss = loss * float("inf")
    o.zero_grad(set_to_none=devmod.Device.zero_grad_to_none(oname))
    mp.backward_step(loss, o)
obs["native_overflow_steps"] = mp.overflow_steps()
obs["native_state_keys"] = sorted(mp.state_dict())
obs["native_describe"] = mp.describe()

# 5. apex on the NPU path: initialize with combine_grad, scale_loss, state in checkpoints
cfg = cfg_for("--amp", "--amp-impl", "apex", "--opt-level", "O2", "--loss-scale", "128", "--device", "npu")
ampmod.MixedPrecision.check(cfg, "npu")
mp = ampmod.MixedPrecision(cfg, dev)
m = torch.nn.Linear(4, 3)
o, oname = dev.sgd(m.parameters(), 0.1, 0.9, 0.0, apex_amp_in_use=True)
m, o = mp.setup(m, o)
with mp.autocast():
    loss = torch.nn.functional.cross_entropy(m(x), y.long())
o.zero_grad(set_to_none=False)
mp.backward_step(loss, o)
init = [c for c in apex.calls if c[0] == "initialize"]
obs["apex_initialize"] = {k: v for k, v in init[0][1].items() if k in ("opt_level", "loss_scale", "combine_grad")}
obs["apex_scale_loss_calls"] = sum(1 for c in apex.calls if c[0] == "scale_loss")
obs["apex_state_keys"] = sorted(mp.state_dict())
obs["apex_optimizer"] = oname

# 6. device list checks before any process starts
from trainer import distributed  # noqa: E402
try:
    distributed.check_devices(cfg_for("--device", "npu", "--device-list", "0-8"), "npu")
    obs["too_many"] = "allowed"
except UsageError as exc:
    obs["too_many"] = str(exc)
os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "3,1,2"
try:
    distributed.check_devices(cfg_for("--device", "npu", "--device-list", "0,1"), "npu")
    obs["descending"] = "allowed"
except UsageError as exc:
    obs["descending"] = str(exc)
del os.environ["ASCEND_RT_VISIBLE_DEVICES"]

print(json.dumps(obs, default=str))
