"""Device layer: the only code that knows about npu / cuda / cpu.

Every device decision of the trainer is made here: which device ``auto`` means, setting the device once before
any tensor touches it (an Ascend rule), moving batches, the target dtype (int32 on NPU, int64 elsewhere),
pin_memory (off on NPU), synchronisation, the autocast dtype and gradient scaler, the fused optimizers a device
has, the process-group backend, seeding and RNG state. APIs newer than torch 1.11 (the Ascend stack) are guarded
here with a fallback, so the rest of the trainer runs on torch 1.11 as on torch 2.x.

This module is the facade: ``from trainer.device import Device, ...``. What a kind can do is asked of its class,
``Device.of(kind)`` (``Device.of(kind).count()``, ``Device.of(kind).prefers_channels_last``); ``Device.resolve_kind``
says which kind ``--device`` means. Inside: ``base.py`` (``Device``: what the kinds share, what each defines, and the
registry of the kinds' classes), one class per kind (``npu.py``, ``cuda.py``, ``cpu.py``), ``runtime.py`` (torch_npu
and apex, imported on first use), ``shims.py`` (guards for newer torch and torchvision, versions), ``host.py`` (CPU
cores, the CPU's bfloat16, glibc's malloc). A new kind: a class in a module of its own, imported here (which
registers it) and named in trainer/device_names.py's ``KINDS``.
"""
from trainer.device_names import (  # noqa: F401 (the device layer's names, re-exported)
    DATA_BACKENDS, DEVICE_DECODE, HOST_DECODE, HOST_KIND, KIND_ALIASES, KINDS, canonical_kind, without_accelerator)
from trainer.device.runtime import apex_amp, apex_supports, npu_module  # noqa: F401
from trainer.device.shims import (  # noqa: F401
    UnsafeCheckpoint, averaged_model, ema_multi_avg_fn, out_of_memory, torch_load,
    uint8_antialias_resize, versions, without_storage)
from trainer.device.host import (  # noqa: F401
    cpu_identity, cpu_native_bf16, usable_cpus, user_allocator_choice)
from trainer.device.base import Device, Handoff  # noqa: F401
from trainer.device.cuda import CudaDevice, StreamHandoff, cuda_native_bf16  # noqa: F401
from trainer.device.npu import NpuDevice  # noqa: F401
from trainer.device.cpu import CpuDevice  # noqa: F401

assert tuple(sorted(Device._kinds)) == tuple(sorted(KINDS)), "trainer/device_names.py's KINDS and the classes differ"

HOST = CpuDevice.kind  # the host's kind: where checkpoints are loaded first (then moved to the device)
