"""FAKE torch_npu.npu.amp (test-only): autocast and GradScaler with the signatures of the torch_npu release
followed (torch_npu/_release.py)."""

__all__ = ["autocast", "GradScaler"]

from .autocast_mode import autocast  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401
