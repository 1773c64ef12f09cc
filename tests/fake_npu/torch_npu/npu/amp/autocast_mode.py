"""FAKE torch_npu.npu.amp.autocast (test-only).

Real (torch_npu/npu/amp/autocast_mode.py, the same class in 2.1.0.post17 and 2.14.0):
``autocast(enabled=True, dtype=torch.float16, cache_enabled=True)``, a subclass of
torch.amp.autocast_mode.autocast for device "npu". So is the fake's, over the device double's autocast kernels
(torch_npu/_double.py), recording the dtype that was asked for. Where the double is off (no C++ compiler) it runs
torch's CPU autocast in bfloat16 instead (what CPU autocast is meant for).
"""

import torch

import torch_npu

__all__ = ["autocast"]


class autocast(torch.amp.autocast_mode.autocast):
    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        self.requested_dtype = dtype
        torch_npu._record("autocast", dtype, enabled)
        if torch_npu._double.unavailable is None:
            super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)
        else:
            super().__init__("cpu", enabled=enabled, dtype=torch.bfloat16, cache_enabled=cache_enabled)
