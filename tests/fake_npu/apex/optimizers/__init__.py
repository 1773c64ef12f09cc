"""FAKE apex.optimizers (Ascend apex-patch flavour), test-only."""

from .npu_fused_sgd import NpuFusedSGD  # noqa: F401

__all__ = ["NpuFusedSGD"]
