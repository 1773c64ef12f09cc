"""The device layer's shape: one class per kind behind the trainer.device facade, modules small enough to read."""
import os

import pytest
import torch

from conftest import ROOT
from trainer import device as devmod
from trainer.device import Device, KINDS
from trainer.device.base import Device as BaseDevice

pytestmark = pytest.mark.timeout(60)

PACKAGE = os.path.join(ROOT, "trainer", "device")


def test_every_module_of_the_package_is_under_500_lines():
    sizes = {}
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name)) as f:
                sizes[name] = sum(1 for _ in f)
    assert {"__init__.py", "base.py", "npu.py", "cuda.py", "cpu.py"} <= set(sizes)
    assert all(n < 500 for n in sizes.values()), sizes


def test_each_kind_is_a_class_and_the_facade_builds_it():
    assert Device is BaseDevice and set(devmod.kinds.CLASSES) == set(KINDS)
    assert devmod.class_for("npu").kind == "npu"  # an NPU device needs torch_npu (tests/test_npu_path.py)
    for kind in ("cuda", "cpu"):
        dev = Device(kind, 0)
        assert type(dev) is devmod.class_for(kind) and isinstance(dev, Device) and dev.kind == kind
        assert dev.name == (kind if not dev.numbered else "{}:0".format(kind))
    with pytest.raises(ValueError):
        Device("tpu", 0)


def test_the_kind_functions_read_the_kinds_classes():
    expected = {"npu": ("hccl", ("env://",), (1, 2, 4, 8), True, "ASCEND_RT_VISIBLE_DEVICES", torch.int32),
                "cuda": ("nccl", ("env://", "tcp://", "file://"), None, True, "CUDA_VISIBLE_DEVICES", torch.int64),
                "cpu": ("gloo", ("env://", "tcp://", "file://"), None, False, None, torch.int64)}
    for kind, (backend, schemes, per_node, numbered, env, target) in expected.items():
        assert devmod.default_backend(kind) == backend and devmod.rendezvous_schemes(kind) == schemes
        assert devmod.supported_devices_per_node(kind) == per_node and devmod.has_device_ids(kind) is numbered
        assert devmod.visible_devices_env(kind) == env and devmod.class_for(kind).target_dtype == target
    assert [devmod.backend_owner(b) for b in ("hccl", "nccl", "gloo", None)] == ["npu", "cuda", None, None]
    assert devmod.prefers_channels_last("cpu") and not devmod.prefers_channels_last("cuda")
    assert devmod.default_workers("cpu", 1, cpus=16) == 4 and devmod.default_workers("cuda", 1, cpus=16) == 15
    assert devmod.default_workers("npu", 8, cpus=16) == 2 and devmod.load_location() == "cpu"
    # a kind not yet resolved (a driver's plan for --device auto): numbered devices, no kind's own limits
    assert devmod.class_for("gpu") is devmod.class_for("cuda")
    assert devmod.has_device_ids("auto") and devmod.supports_sync_bn("auto")
    assert not devmod.prefers_channels_last("auto") and not devmod.visible_devices_env("auto")
    assert devmod.rendezvous_schemes("auto") == ("env://", "tcp://", "file://")
