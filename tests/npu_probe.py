"""Run in a child process with tests/fake_npu on PYTHONPATH: exercises the trainer's NPU
decisions against the fake torch_npu / apex and prints one JSON object of observations."""
import json
import os

import torch

import torch_npu  # the fake (tests/fake_npu)
import apex  # the fake Ascend apex

assert getattr(torch_npu, "FAKE", False), "the real torch_npu must never be probed by tests"

from trainer.precision import amp as ampmod  # noqa: E402
from trainer import device as devmod  # noqa: E402
from trainer import optim  # noqa: E402
from trainer.config import OptimConfig, parse_config  # noqa: E402
from trainer.plan import plan  # noqa: E402
from trainer.errors import UsageError  # noqa: E402
from trainer.optim import create_optimizer  # noqa: E402

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
obs["auto_kind"] = devmod.Device.resolve_kind("auto")
obs["name"] = dev.name
obs["target_dtype"] = str(dev.target_dtype)
obs["index_dtype"] = str(dev.index_dtype)
obs["pin_memory"] = dev.pin_memory
obs["backend"] = dev.dist_backend
obs["ddp_device_ids"] = dev.ddp_device_ids
obs["amp_dtype"] = str(dev.resolve_amp_dtype("auto")[0])

# 2. autocast and GradScaler come from torch_npu.npu.amp; a static scale is a dynamic scaler held fixed
ctx = dev.autocast(torch.float16)
obs["autocast_type"] = type(ctx).__module__ + "." + type(ctx).__name__
static = dev.grad_scaler(128.0)
dynamic = dev.grad_scaler(None)
obs["scaler_type"] = type(static).__module__ + "." + type(static).__name__
obs["scaler_static_dynamic_flag"] = [static.state_dict().get("dynamic"), dynamic.state_dict().get("dynamic")]
obs["scaler_static_scale"] = float(static.get_scale())
try:
    dev.resolve_amp_dtype("bfloat16")
    obs["bf16"] = "allowed"
except UsageError as exc:
    obs["bf16"] = str(exc)

# 3. optimizer
model = torch.nn.Linear(4, 3)
choice = create_optimizer("sgd", model.parameters(), 0.1, 0.9, 1e-4, dev)
obs["optimizer"] = choice.name
obs["optimizer_module"] = type(choice.optimizer).__module__
obs["grads_to_none"] = choice.grads_to_none
obs["optimizer_with_apex"] = create_optimizer("sgd", model.parameters(), 0.1, 0.9, 1e-4, dev,
                                             apex_amp_in_use=True).name


def settled(*argv):
    """(plan, notes) main.py would run with on the (fake) NPU: parsed, then planned (trainer/plan.py)."""
    parsed = parse_config(["--dummy"] + list(argv), env={})
    planned = plan(parsed.cfg, env={})
    return planned, parsed.notes + planned.notes


def cfg_for(*argv):
    return settled(*argv)[0]


def train_steps(cfg, poison_at, n=4, momentum=0.0):
    """n steps of a Linear model through the OptimizerStep; inf loss at the steps in poison_at.
    Returns (step, [(params before, params after, skipped?) per step], calls recorded)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    torch_npu.reset_calls()
    apex.reset_calls()
    prec = ampmod.resolve(cfg.precision, dev, cfg.launch.world_size)
    m, step = ampmod.wrap(optim.build(OptimConfig(lr=0.1, momentum=momentum, weight_decay=0.0), m, dev, prec),
                          prec, dev, m)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,), dtype=torch.int32)
    trace = []
    for i in range(n):
        before = [p.detach().clone() for p in m.parameters()]
        with step.autocast():
            loss = torch.nn.functional.cross_entropy(m(x), y.long())
        if i in poison_at:
            loss = loss * float("inf")
        step.zero_grad()
        found = step(loss)
        after = [p.detach().clone() for p in m.parameters()]
        trace.append({"unchanged": all(torch.equal(a, b) for a, b in zip(before, after)),
                      "found": None if found is None else float(found)})
    return step, trace


# 6. device list checks before any process starts
from trainer.job import launch  # noqa: E402
try:
    launch.check_devices(cfg_for("--device", "npu", "--device-list", "0-8").launch, "npu")
    obs["too_many"] = "allowed"
except UsageError as exc:
    obs["too_many"] = str(exc)
os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "3,1,2"
try:
    launch.check_devices(cfg_for("--device", "npu", "--device-list", "0,1").launch, "npu")
    obs["descending"] = "allowed"
except UsageError as exc:
    obs["descending"] = str(exc)
del os.environ["ASCEND_RT_VISIBLE_DEVICES"]

# 7. plain --amp on NPU follows the Ascend guide where apex is installed: apex.amp O2, static 1024, combine_grad
INIT_KEYS = ("opt_level", "loss_scale", "combine_grad", "combine_ddp", "min_loss_scale", "max_loss_scale",
             "dynamic_init_scale")


def apex_init(cfg):
    train_steps(cfg, poison_at=set(), n=1)
    init = [c for c in apex.calls if c[0] == "initialize"]
    return {k: v for k, v in init[0][1].items() if k in INIT_KEYS} if init else None


cfg, notes = settled("--amp", "--device", "npu")  # Ascend apex installed, torch_npu 2.x: native
obs["default_amp"] = {"impl": cfg.precision.amp_impl, "loss_scale": cfg.precision.loss_scale}
real_version = torch_npu.__version__
torch_npu.__version__ = "1.11.0.post3"  # the 1.11 stack, whose guide trains with Ascend apex
obs["default_amp_1_11"] = devmod.Device.of("npu").default_amp_impl()
cfg, notes = settled("--amp", "--device", "npu")
obs["guide_amp"] = {"impl": cfg.precision.amp_impl, "loss_scale": cfg.precision.loss_scale, "notes": list(notes),
                    "initialize": apex_init(cfg)}
torch_npu.__version__ = real_version
cfg = cfg_for("--amp", "--amp-impl", "apex", "--device", "npu", "--opt-level", "O1", "--loss-scale", "128")
obs["guide_amp_o1"] = apex_init(cfg)
cfg = cfg_for("--amp", "--amp-impl", "apex", "--device", "npu", "--loss-scale", "dynamic")
obs["guide_amp_dynamic"] = apex_init(cfg)
cfg = cfg_for("--amp", "--amp-impl", "apex", "--device", "npu", "--combine-ddp", "--world-size", "2", "--rank", "0")
obs["combine_ddp"] = {"precision": ampmod.resolve(cfg.precision, dev, cfg.launch.world_size).combine_ddp,
                      "initialize": apex_init(cfg)}
cfg, notes = settled("--amp", "--amp-impl", "native", "--device", "npu", "--opt-level", "O1")
obs["native_opt_level_notes"] = list(notes)
try:
    cfg_for("--amp", "--amp-impl", "native", "--device", "npu", "--combine-ddp")
    obs["native_combine_ddp"] = "allowed"
except UsageError as exc:
    obs["native_combine_ddp"] = str(exc)
real_apex_amp = devmod.apex_amp
devmod.apex_amp = devmod.runtime.apex_amp = lambda: None  # an NPU host without Ascend apex
cfg = cfg_for("--amp", "--device", "npu")
obs["amp_without_apex"] = {"impl": cfg.precision.amp_impl, "loss_scale": cfg.precision.loss_scale,
                           "precision": ampmod.resolve(cfg.precision, dev, cfg.launch.world_size).dtype_name}
devmod.apex_amp = devmod.runtime.apex_amp = real_apex_amp

# 8. the guides' model name builds the NPU-affine variant, with int32 shuffle indices
from trainer.trainer import build_model  # noqa: E402
real_to = torch.nn.Module.to
torch.nn.Module.to = lambda self, *a, **k: self  # fake NPUs hold no tensors: the rest of build_model is real
cfg, notes = settled("-a", "shufflenet_v2_x1_0", "--device", "npu")
model = build_model(cfg.model, 10, dev, 1)
obs["guide_shufflenet"] = {"model": cfg.model.name, "class": type(model).__module__ + "." + type(model).__name__,
                           "notes": list(notes),
                           "index_dtypes": sorted({str(b.dtype) for n, b in model.named_buffers()
                                                   if "index" in n or "perm" in n})}
cfg = cfg_for("-a", "shufflenet_v2_x1_0", "--device", "npu", "--model-impl", "torchvision")
obs["torchvision_shufflenet"] = type(build_model(cfg.model, 10, dev, 1)).__module__
torch.nn.Module.to = real_to

# 9. targets are cast on the host and reach the device as int32 already
from trainer.engine import targets  # noqa: E402
moved = []
dev.move = lambda t: (moved.append(str(t.dtype)), t)[1]
obs["target_reaches_device_as"] = [str(targets(dev, torch.tensor([1, 2, 3])).dtype)] + moved
del dev.move

# 10. the device data backend's NPU seam: torchvision_npu's decode_jpeg (DVPP) behind Device.jpeg_decoder
import io  # noqa: E402
from PIL import Image  # noqa: E402
import torchvision_npu  # noqa: E402  (the fake)
from trainer import data as datamod  # noqa: E402
buf = io.BytesIO()
Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, "JPEG")
raw = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
decode = dev.jpeg_decoder()
out = decode([raw, raw])
obs["npu_jpeg"] = {"shapes": [list(t.shape) for t in out], "calls": torchvision_npu.calls,
                   "auto": datamod.resolve_backend("auto", dev)[0], "gpu": datamod.resolve_backend("gpu", dev)[0]}

print(json.dumps(obs, default=str))
