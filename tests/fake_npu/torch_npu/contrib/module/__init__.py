"""FAKE torch_npu.contrib.module (test-only)."""

from .channel_shuffle import ChannelShuffle  # noqa: F401

__all__ = ["ChannelShuffle"]
