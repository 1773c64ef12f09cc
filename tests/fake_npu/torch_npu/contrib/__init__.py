"""FAKE torch_npu.contrib (test-only): only module.ChannelShuffle."""

from .module import ChannelShuffle  # noqa: F401

__all__ = ["ChannelShuffle"]
