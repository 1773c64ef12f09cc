"""FAKE torch_npu.npu.amp (test-only): autocast and GradScaler with the torch_npu 2.14.0 signatures."""

__all__ = ["autocast", "GradScaler"]

from .autocast_mode import autocast  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401
