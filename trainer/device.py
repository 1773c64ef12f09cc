"""Device layer: the only code that knows about npu / cuda / cpu.

Every device decision of the trainer is made here: which device ``auto`` means, setting
the device once before any tensor touches it (an Ascend rule), moving batches, the
target dtype (int32 on NPU, int64 elsewhere), pin_memory (off on NPU), synchronisation,
the autocast dtype and gradient scaler, the optimizer implementation, the process-group
backend, seeding and RNG state. APIs newer than torch 1.11 (the Ascend stack) are guarded
here with a fallback, so the rest of the trainer runs on torch 1.11 as on torch 2.x.
"""
import contextlib
import inspect
import platform
import sys

import torch

from trainer.errors import UsageError

KINDS = ("npu", "cuda", "cpu")

_npu_module = None
_npu_import_error = None
_device_set = None  # (kind, index) once set_device ran in this process


# ---------------------------------------------------------------- torch_npu / apex


def npu_module():
    """``torch_npu`` if it imports, else None (the import error is kept for messages)."""
    global _npu_module, _npu_import_error
    if _npu_module is None and _npu_import_error is None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device)
            _npu_module = torch_npu
        except Exception as exc:  # ImportError, or a CANN library missing
            _npu_import_error = exc
    return _npu_module


def apex_amp():
    """``apex.amp`` (NVIDIA's or Ascend's) if it imports, else None.

    The PyPI package called "apex" is an unrelated web toolkit: it imports as ``apex``
    but has no ``amp``, and is treated as absent.
    """
    try:
        from apex import amp  # noqa: F401
    except Exception:
        return None
    return amp if hasattr(amp, "initialize") else None


def _reset_for_tests():
    global _npu_module, _npu_import_error, _device_set
    _npu_module = None
    _npu_import_error = None
    _device_set = None


# ---------------------------------------------------------------- discovery


def _npu_count():
    npu = npu_module()
    if npu is None:
        return 0
    try:
        return int(npu.npu.device_count()) if npu.npu.is_available() else 0
    except Exception:
        return 0


def count(kind):
    """How many devices of ``kind`` this process can see (cpu: 1)."""
    if kind == "npu":
        return _npu_count()
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1


def resolve_kind(requested):
    """``auto`` -> npu if torch_npu sees one, else cuda, else cpu; others are checked."""
    if requested == "auto":
        for kind in ("npu", "cuda"):
            if count(kind) > 0:
                return kind
        return "cpu"
    if requested == "npu" and count("npu") == 0:
        if npu_module() is None:
            raise UsageError(
                "--device npu: torch_npu is not installed or does not import ({}); install the "
                "Ascend stack (see 1.11_requirements.txt) or pick --device cuda/cpu"
                .format(str(_npu_import_error).splitlines()[0] if _npu_import_error else "not found"))
        raise UsageError("--device npu: torch_npu sees no NPU (check `npu-smi info` and "
                         "ASCEND_RT_VISIBLE_DEVICES), or pick --device cuda/cpu")
    if requested == "cuda" and count("cuda") == 0:
        raise UsageError("--device cuda: torch {} sees no CUDA device (CPU-only build, or no driver); "
                         "pick --device cpu".format(torch.__version__))
    return requested


def has_device_ids(kind):
    """Whether devices of ``kind`` are numbered (a CPU is one device; --device-list only counts slots)."""
    return kind != "cpu"


def supports_sync_bn(kind):
    return kind in ("cuda", "npu")


def supports_apex(kind):
    return kind in ("cuda", "npu")


def load_location():
    """Where checkpoints are loaded first (then moved): the host."""
    return "cpu"


def visible_devices_env(kind):
    """The environment variable that limits the visible devices of ``kind``."""
    return {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}.get(kind)


def visible_devices_problem(kind):
    """A message if the visible-devices variable is one the runtime will mishandle, else None.

    The Ascend runtime maps ASCEND_RT_VISIBLE_DEVICES only when it lists devices in ascending order.
    """
    import os
    env = visible_devices_env(kind)
    if kind != "npu" or not os.environ.get(env):
        return None
    listed = [s.strip() for s in os.environ[env].split(",") if s.strip()]
    if any(not s.isdigit() for s in listed) or [int(s) for s in listed] != sorted(int(s) for s in listed):
        return ("{}={} must list devices in ascending order (the Ascend runtime fails to map them "
                "otherwise)".format(env, os.environ[env]))
    return None


def default_backend(kind):
    return {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[kind]


# ---------------------------------------------------------------- the device


class Device:
    """One process's device. Build it with ``Device.create`` before any tensor work."""

    def __init__(self, kind, index):
        self.kind = kind
        self.index = index if kind != "cpu" else None
        self.torch_device = torch.device(kind if self.index is None else "{}:{}".format(kind, self.index))

    def __repr__(self):
        return "Device({})".format(self.name)

    @property
    def name(self):
        return str(self.torch_device)

    @classmethod
    def create(cls, requested="auto", index=None):
        """Resolve the kind, check the index and set the device (once per process)."""
        global _device_set
        kind = resolve_kind(requested)
        index = 0 if index is None else int(index)
        if kind != "cpu":
            n = count(kind)
            if index >= n:
                raise UsageError("{} device {} does not exist: {} visible (indices 0-{}){}".format(
                    kind, index, n, n - 1, _visible_hint(kind)))
        dev = cls(kind, index)
        if _device_set is not None and _device_set != (dev.kind, dev.index):
            raise RuntimeError("device already set to {} in this process; one device per process"
                               .format(_device_set))
        if _device_set is None:
            if kind == "npu":
                npu_module().npu.set_device(dev.name)
            elif kind == "cuda":
                torch.cuda.set_device(dev.index)
            _device_set = (dev.kind, dev.index)
        return dev

    # -- data movement
    @property
    def pin_memory(self):
        # The Ascend 1.11 guide disables pinned memory on NPU; CPU has nothing to pin for.
        return self.kind == "cuda"

    @property
    def non_blocking(self):
        return self.kind in ("cuda", "npu")

    @property
    def target_dtype(self):
        # int64 targets fall back to slow AI-CPU kernels on Ascend; CrossEntropyLoss
        # on CPU/CUDA wants int64.
        return torch.int32 if self.kind == "npu" else torch.int64

    @property
    def index_dtype(self):
        """dtype for index tensors of index_select-based models (int32 on NPU)."""
        return torch.int32 if self.kind == "npu" else torch.int64

    def move(self, tensor):
        return tensor.to(self.torch_device, non_blocking=self.non_blocking)

    def synchronize(self):
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.kind == "npu":
            npu_module().npu.synchronize()

    # -- mixed precision
    @property
    def amp_dtype(self):
        return torch.bfloat16 if self.kind == "cpu" else torch.float16

    def autocast(self, enabled=True):
        if not enabled:
            return contextlib.nullcontext()
        if self.kind == "npu":
            return npu_module().npu.amp.autocast()
        if hasattr(torch, "autocast"):  # torch >= 1.10
            return torch.autocast(device_type=self.kind, dtype=self.amp_dtype)
        if self.kind == "cuda":
            return torch.cuda.amp.autocast()
        raise UsageError("--amp on CPU needs torch >= 1.10 (bfloat16 autocast); this is torch {}"
                         .format(torch.__version__))

    @property
    def needs_grad_scaler(self):
        return self.amp_dtype == torch.float16

    def grad_scaler(self, loss_scale=None):
        """A GradScaler for float16 autocast; None where none is needed (bfloat16).

        ``loss_scale`` None means dynamic; a number is the initial scale, which the
        mixed-precision module keeps fixed.
        """
        if not self.needs_grad_scaler:
            return None
        init = 65536.0 if loss_scale is None else float(loss_scale)
        if self.kind == "npu":
            amp = npu_module().npu.amp
            kwargs = {"init_scale": init}
            if "dynamic" in inspect.signature(amp.GradScaler).parameters:
                kwargs["dynamic"] = loss_scale is None
            return amp.GradScaler(**kwargs)
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            return torch.amp.GradScaler(self.kind, init_scale=init)
        return torch.cuda.amp.GradScaler(init_scale=init)

    # -- optimizer
    def sgd(self, params, lr, momentum, weight_decay, apex_amp_in_use=False):
        """(optimizer, implementation name) for SGD with momentum on this device.

        The NPU fused SGDs keep gradients in one flat buffer: ``zero_grad(set_to_none=True)``
        raises there (see ``zero_grad_to_none``).
        """
        if self.kind == "npu":
            npu = npu_module()
            fused = getattr(getattr(npu, "optim", None), "NpuFusedSGD", None)
            name = "torch_npu.optim.NpuFusedSGD"
            if apex_amp_in_use:
                try:
                    from apex.optimizers import NpuFusedSGD as apex_fused
                    fused, name = apex_fused, "apex.optimizers.NpuFusedSGD"
                except Exception:
                    pass
            if fused is not None:
                return fused(params, lr=lr, momentum=momentum, weight_decay=weight_decay), name
        if self.kind == "cuda" and "fused" in inspect.signature(torch.optim.SGD).parameters:
            return (torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True),
                    "torch.optim.SGD(fused)")
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay), "torch.optim.SGD"

    @staticmethod
    def zero_grad_to_none(optimizer_name):
        """Whether ``optimizer.zero_grad`` may free the gradients (not for NPU fused optimizers)."""
        return "NpuFused" not in optimizer_name

    # -- distributed
    @property
    def dist_backend(self):
        return default_backend(self.kind)

    @property
    def ddp_device_ids(self):
        return None if self.kind == "cpu" else [self.index]

    def ddp(self, model, broadcast_buffers=True):
        """DistributedDataParallel on this device (buffer sync flag named per torch version)."""
        DDP = torch.nn.parallel.DistributedDataParallel
        params = inspect.signature(DDP.__init__).parameters
        if "forward_sync_buffers" in params:  # newer torch deprecates broadcast_buffers
            return DDP(model, device_ids=self.ddp_device_ids, forward_sync_buffers=broadcast_buffers)
        return DDP(model, device_ids=self.ddp_device_ids, broadcast_buffers=broadcast_buffers)

    # -- randomness
    def manual_seed(self, seed):
        torch.manual_seed(seed)  # CPU and CUDA
        if self.kind == "npu":
            npu_module().npu.manual_seed_all(seed)

    def rng_state(self):
        if self.kind == "cuda":
            return torch.cuda.get_rng_state(self.torch_device)
        if self.kind == "npu":
            return npu_module().npu.get_rng_state()
        return None

    def set_rng_state(self, state):
        if state is None:
            return
        if self.kind == "cuda":
            torch.cuda.set_rng_state(state.cpu(), self.torch_device)
        elif self.kind == "npu":
            npu_module().npu.set_rng_state(state.cpu())

    # -- profiling
    def profiler_activities(self):
        """(profile function, activities) for torch.profiler or torch_npu.profiler."""
        if self.kind == "npu":
            prof = npu_module().profiler
            return prof, [prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU]
        prof = torch.profiler
        acts = [prof.ProfilerActivity.CPU]
        if self.kind == "cuda":
            acts.append(prof.ProfilerActivity.CUDA)
        return prof, acts


def _visible_hint(kind):
    env = visible_devices_env(kind)
    import os
    if env and os.environ.get(env):
        return " ({}={})".format(env, os.environ[env])
    return ""


# ---------------------------------------------------------------- torch-version guards


def torch_load(path, map_location="cpu", weights_only=True):
    """torch.load with ``weights_only`` where this torch has it (>= 1.13)."""
    kwargs = {"map_location": map_location}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kwargs["weights_only"] = weights_only
    return torch.load(path, **kwargs)


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import torchvision
        out["torchvision"] = torchvision.__version__
    except Exception:
        out["torchvision"] = None
    npu = sys.modules.get("torch_npu")
    out["torch_npu"] = getattr(npu, "__version__", "unknown") if npu is not None else None
    amp = apex_amp()
    if amp is not None:
        import apex
        out["apex"] = getattr(apex, "__version__", "present")
    else:
        out["apex"] = None
    return out
