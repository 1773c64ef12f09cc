"""FAKE torch_npu.contrib.module.ChannelShuffle (test-only).

Real (torch_npu/contrib/module/channel_shuffle.py, the same file in 2.1.0.post17 and 2.14.0):
``ChannelShuffle(in_channels, groups=2, split_shuffle=True)``; ``forward(x1, x2)`` concatenates
x1 and x2 on dim 1 and reorders the channels with index_select (the ShuffleNetV2 shuffle for two
groups); with ``split_shuffle=True`` it returns the two halves of the result as a tuple, otherwise
the whole tensor. Only groups=2 is implemented upstream (its backward indices assume it), so the
fake rejects other values instead of returning wrong gradients.
"""

import torch
from torch import nn

import torch_npu


class ChannelShuffle(nn.Module):
    def __init__(self, in_channels, groups=2, split_shuffle=True):
        super().__init__()
        if groups != 2:
            raise ValueError("ChannelShuffle: only groups=2 is implemented (as in torch_npu)")
        if in_channels % groups:
            raise ValueError("ChannelShuffle: in_channels must be divisible by groups")
        torch_npu._record("ChannelShuffle", in_channels, groups, split_shuffle)
        self.split_shuffle = split_shuffle
        self.group_len = in_channels // groups
        # channel j of the output is channel order[j] of cat([x1, x2]): 0, g, 1, g+1, ...
        self.out_channels = torch.arange(in_channels).view(groups, self.group_len).t().reshape(-1)

    def forward(self, x1, x2):
        x = torch.cat([x1, x2], dim=1)
        order = self.out_channels.to(x.device)
        if self.split_shuffle:
            return x.index_select(1, order[:self.group_len]), x.index_select(1, order[self.group_len:])
        return x.index_select(1, order)
