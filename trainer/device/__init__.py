"""Device layer: the only code that knows about npu / cuda / cpu. Every device decision is made here (``auto``,
setting the device once before any tensor touches it, an Ascend rule; batches, dtypes, pinning, sync, autocast, scaler,
fused optimizers, process groups, seeds), and APIs newer than torch 1.11 (the Ascend stack) are guarded here with a
fallback, so the rest of the trainer runs on torch 1.11 as on 2.x.

The facade; a kind's answers come from its class, ``Device.of(kind)``. Inside: ``base.py`` (``Device``, the kinds'
registry), one class per kind (``npu.py``, ``cuda.py``, ``cpu.py``), ``runtime.py`` (torch_npu and apex, imported on
first use), ``shims.py`` (newer torch/torchvision guards), ``host.py`` (CPU cores and bfloat16, glibc's malloc). A
new kind: a module of its own, imported here, named in device_names.KINDS."""
from trainer.device_names import KINDS  # noqa: F401 (the kinds, re-exported)
from trainer.device.runtime import apex_amp, apex_supports, npu_module  # noqa: F401
from trainer.device.shims import (  # noqa: F401
    UnsafeCheckpoint, averaged_model, ema_multi_avg_fn, out_of_memory, torch_load,
    uint8_antialias_resize, versions, without_storage)
from trainer.device.host import cpu_identity, cpu_native_bf16, usable_cpus, user_allocator_choice  # noqa: F401
from trainer.device.base import Device  # noqa: F401
from trainer.device.cuda import CudaDevice  # noqa: F401
from trainer.device.npu import NpuDevice  # noqa: F401
from trainer.device.cpu import CpuDevice, slow_bf16 as cpu_slow_bf16  # noqa: F401

assert tuple(sorted(Device._kinds)) == tuple(sorted(KINDS)), "trainer/device_names.py's KINDS and the classes differ"

HOST = CpuDevice.kind  # the host's kind: where checkpoints are loaded first (then moved to the device)
