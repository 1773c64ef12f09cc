"""FAKE torch_npu.optim (test-only)."""

__all__ = ["NpuFusedSGD"]

from .npu_fused_sgd import NpuFusedSGD  # noqa: F401
