"""The device layer's shape: one class per kind behind the trainer.device facade, modules small enough to read."""
import os

import pytest
import torch

from conftest import ONCE, ROOT
from trainer import device as devmod
from trainer.device import Device, KINDS
from trainer.device.base import Device as BaseDevice
from trainer.errors import UsageError

pytestmark = [ONCE, pytest.mark.timeout(60)]

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
    assert Device is BaseDevice and set(Device._kinds) == set(KINDS)
    assert {Device.of(k) for k in KINDS} == {devmod.NpuDevice, devmod.CudaDevice, devmod.CpuDevice}
    assert Device.of("npu").kind == "npu"  # an NPU device needs torch_npu (tests/test_npu_path.py)
    for kind in ("cuda", "cpu"):
        dev = Device(kind, 0)
        assert type(dev) is Device.of(kind) and isinstance(dev, Device) and dev.kind == kind
        assert dev.name == (kind if not dev.numbered else "{}:0".format(kind))
    with pytest.raises(ValueError):
        Device("tpu", 0)
    # a kind's answers come from its class only: the facade holds no functions of a kind name
    assert not [n for n in ("count", "resolve_kind", "prefers_channels_last", "default_workers", "load_location",
                            "backend_owner", "keep_host_memory", "visible_hint") if hasattr(devmod, n)]


def test_device_of_a_kind_is_its_class_and_answers_for_it():
    expected = {"npu": ("hccl", ("env://",), (1, 2, 4, 8), True, "ASCEND_RT_VISIBLE_DEVICES", torch.int32),
                "cuda": ("nccl", ("env://", "tcp://", "file://"), None, True, "CUDA_VISIBLE_DEVICES", torch.int64),
                "cpu": ("gloo", ("env://", "tcp://", "file://"), None, False, None, torch.int64)}
    for kind, (backend, schemes, per_node, numbered, env, target) in expected.items():
        cls = Device.of(kind)
        assert cls.kind == kind and cls.dist_backend == backend and cls.rendezvous_schemes == schemes
        assert cls.supported_devices_per_node == per_node and cls.numbered is numbered
        assert cls.visible_devices_env == env and cls.target_dtype == target
    assert [Device.backend_owner(b) for b in ("hccl", "nccl", "gloo", "", None)] == ["npu", "cuda", None, None, None]
    assert Device.of("cpu").prefers_channels_last and not Device.of("cuda").prefers_channels_last
    assert Device.of("cpu").default_workers(1, cpus=16) == 4 and Device.of("cuda").default_workers(1, cpus=16) == 15
    assert Device.of("npu").default_workers(8, cpus=16) == 2 and devmod.HOST == "cpu"
    # an alias is its kind; a kind not yet resolved (a driver's plan for --device auto) gets Device itself:
    # numbered devices, no kind's own limits
    assert Device.of("gpu") is Device.of("cuda")
    assert Device.of("auto") is Device and Device.of("auto").numbered and Device.of("auto").supports_sync_bn
    assert not Device.of("auto").prefers_channels_last and not Device.of("auto").visible_devices_env
    assert Device.of("auto").rendezvous_schemes == ("env://", "tcp://", "file://")


BROKEN = "the stack is broken here: fix it, or pass --device cpu to train on the CPU on purpose"


def _counts(monkeypatch, npu=0, cuda=0, broken=None):
    """The kinds' device counts (and the NPU's broken stack) as this test says, whatever the host has."""
    monkeypatch.setattr(devmod.NpuDevice, "count", classmethod(lambda cls: npu))
    monkeypatch.setattr(devmod.CudaDevice, "count", classmethod(lambda cls: cuda))
    monkeypatch.setattr(devmod.NpuDevice, "broken_stack", classmethod(lambda cls: broken))


def test_resolve_kind_auto_takes_the_first_kind_with_a_device(monkeypatch):
    _counts(monkeypatch)
    assert Device.resolve_kind("auto") == "cpu"
    _counts(monkeypatch, cuda=2)
    assert Device.resolve_kind("auto") == "cuda"
    _counts(monkeypatch, npu=8, cuda=2)
    assert Device.resolve_kind("auto") == "npu"


def test_resolve_kind_auto_stops_at_a_broken_stack_and_names_the_kind_there_is(monkeypatch):
    _counts(monkeypatch, broken=BROKEN)
    with pytest.raises(UsageError) as exc:
        Device.resolve_kind("auto")
    assert str(exc.value) == BROKEN  # only the host: the line's own advice stands
    _counts(monkeypatch, cuda=1, broken=BROKEN)
    with pytest.raises(UsageError) as exc:
        Device.resolve_kind("auto")
    assert str(exc.value) == BROKEN.replace("--device cpu to train on the CPU", "--device cuda to train on cuda")
    _counts(monkeypatch, npu=1, broken=BROKEN)  # a kind that sees devices is not asked whether it is broken
    assert Device.resolve_kind("auto") == "npu"


def test_resolve_kind_checks_an_asked_kind_and_reads_aliases(monkeypatch):
    _counts(monkeypatch, cuda=1)
    assert Device.resolve_kind("gpu") == "cuda" and Device.resolve_kind("cpu") == "cpu"
    _counts(monkeypatch)
    with pytest.raises(UsageError) as exc:
        Device.resolve_kind("gpu")
    assert str(exc.value) == devmod.CudaDevice.missing()


def test_an_index_past_the_visible_devices_is_refused_with_the_variable_that_hides_them(monkeypatch):
    _counts(monkeypatch, cuda=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert Device.of("cuda").visible_hint() == " (CUDA_VISIBLE_DEVICES=3)" and Device.of("cpu").visible_hint() == ""
    with pytest.raises(UsageError) as exc:
        Device.create("gpu", 2)
    assert str(exc.value) == "cuda device 2 does not exist: 1 visible (indices 0-0) (CUDA_VISIBLE_DEVICES=3)"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Device.of("cuda").visible_hint() == ""
