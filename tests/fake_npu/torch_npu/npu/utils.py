"""FAKE torch_npu.npu.utils (test-only). The device functions live in torch_npu.npu."""

import os

from torch_npu.npu import (  # noqa: F401  (the real module defines these here)
    _get_device_index, current_device, current_stream, default_stream, device, is_bf16_supported,
    set_device, synchronize,
)


def is_support_inf_nan():
    """True on 910B-class chips (INF/NaN mode); $FAKE_NPU_INF_NAN=0 simulates 910A saturation mode."""
    return os.environ.get("FAKE_NPU_INF_NAN", "1") != "0"
