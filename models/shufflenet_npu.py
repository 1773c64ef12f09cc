"""ShuffleNetV2 with the Ascend guide's NPU-friendly channel shuffle (one ``index_select``, fused with
``cat`` and the next split in training), module for module torchvision's and numerically identical.
Forms, the rule for which path runs, and why not torch_npu's ChannelShuffle: docs/DESIGN.md.
"""
import sys

import torch
import torch.nn as nn

from models.registry import register_model

__all__ = [
    "ShuffleNetV2NPU",
    "InvertedResidual",
    "shuffle_permutation",
    "inverse_permutation",
    "forward_stage_fused",
    "shufflenet_v2_x0_5_npu",
    "shufflenet_v2_x1_0_npu",
    "shufflenet_v2_x1_5_npu",
    "shufflenet_v2_x2_0_npu",
]

SHUFFLE_IMPLS = ("auto", "index_select", "view")
INDEX_DTYPES = (torch.int32, torch.int64)
_INDEX_BUFFERS = ("shuffle_index", "shuffle_index1", "shuffle_index2",
                  "unshuffle_index1", "unshuffle_index2")


def shuffle_permutation(channels, groups=2):
    """Source channel of each output channel of torchvision's ``channel_shuffle(x, groups)``."""
    if channels % groups:
        raise ValueError("channels ({}) not divisible by groups ({})".format(channels, groups))
    per_group = channels // groups
    return [(j % groups) * per_group + j // groups for j in range(channels)]


def inverse_permutation(perm):
    inv = [0] * len(perm)
    for out_pos, src in enumerate(perm):
        inv[src] = out_pos
    return inv


class _ConcatShuffle(torch.autograd.Function):
    """``cat((x1, x2), 1).index_select(1, index)``; backward: ``index_select`` with the inverse."""

    @staticmethod
    def forward(ctx, x1, x2, index, inv1, inv2):
        ctx.save_for_backward(inv1, inv2)
        return torch.cat((x1, x2), 1).index_select(1, index)

    @staticmethod
    def backward(ctx, grad):
        inv1, inv2 = ctx.saved_tensors
        return grad.index_select(1, inv1), grad.index_select(1, inv2), None, None, None


class _ConcatShuffleSplit(torch.autograd.Function):
    """Shuffle of ``cat((x1, x2), 1)`` returned as its two channel halves (contiguous tensors)."""

    @staticmethod
    def forward(ctx, x1, x2, index1, index2, inv1, inv2):
        ctx.save_for_backward(inv1, inv2)
        x = torch.cat((x1, x2), 1)
        return x.index_select(1, index1), x.index_select(1, index2)

    @staticmethod
    def backward(ctx, grad1, grad2):
        inv1, inv2 = ctx.saved_tensors
        grad = torch.cat((grad1, grad2), 1)
        return grad.index_select(1, inv1), grad.index_select(1, inv2), None, None, None, None


_COMPILING = []  # torch's "is a graph being captured" function, once found (see _find_is_compiling)


def _find_is_compiling():
    """Look up torch's compile-time test once, when a model is built: never inside a forward, because torch
    2.1's graph capture cannot trace the lookup itself (``hasattr`` on a module) and stops there."""
    if _COMPILING:
        return
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):  # torch >= 2.3
        _COMPILING.append(compiler.is_compiling)
        return
    dynamo = getattr(torch, "_dynamo", None)  # torch 2.0 - 2.2; absent on torch 1.11
    _COMPILING.append(dynamo.is_compiling if dynamo is not None and hasattr(dynamo, "is_compiling")
                      else (lambda: False))


def _is_compiling():
    return _COMPILING[0]() if _COMPILING else False


def _index_tensor(values):
    return torch.tensor(values, dtype=torch.int64)


class InvertedResidual(nn.Module):
    """torchvision's ``InvertedResidual`` (same submodules) with a configurable shuffle."""

    def __init__(self, inp, oup, stride):
        super(InvertedResidual, self).__init__()
        if not (1 <= stride <= 3):
            raise ValueError("illegal stride value")
        self.stride = stride
        branch_features = oup // 2
        if (self.stride == 1) and (inp != branch_features << 1):
            raise ValueError(
                "Invalid combination of stride {}, inp {} and oup {} values. If stride == 1 then "
                "inp should be equal to oup // 2 << 1.".format(stride, inp, oup))
        self.shuffle_impl = "auto"

        if self.stride > 1:
            self.branch1 = nn.Sequential(
                self.depthwise_conv(inp, inp, kernel_size=3, stride=self.stride, padding=1),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()

        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if (self.stride > 1) else branch_features, branch_features,
                      kernel_size=1, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            self.depthwise_conv(branch_features, branch_features, kernel_size=3,
                                stride=self.stride, padding=1),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )

        channels = 2 * branch_features
        perm = shuffle_permutation(channels, 2)
        inv = inverse_permutation(perm)
        h = branch_features
        # Non-persistent: they follow .to(device) but stay out of state_dict() (torchvision's keys).
        self.register_buffer("shuffle_index", _index_tensor(perm), persistent=False)
        self.register_buffer("shuffle_index1", _index_tensor(perm[:h]), persistent=False)
        self.register_buffer("shuffle_index2", _index_tensor(perm[h:]), persistent=False)
        self.register_buffer("unshuffle_index1", _index_tensor(inv[:h]), persistent=False)
        self.register_buffer("unshuffle_index2", _index_tensor(inv[h:]), persistent=False)

    @staticmethod
    def depthwise_conv(i, o, kernel_size, stride=1, padding=0, bias=False):
        return nn.Conv2d(i, o, kernel_size, stride, padding, bias=bias, groups=i)

    def _use_index_select(self, x):
        # type: (torch.Tensor) -> bool
        impl = self.shuffle_impl
        return impl == "index_select" or (impl == "auto" and x.device.type == "npu")

    def _shuffle(self, x1, x2):
        # type: (torch.Tensor, torch.Tensor) -> torch.Tensor
        """Plain-op ``channel_shuffle(cat((x1, x2), 1), 2)``."""
        if self._use_index_select(x1):
            return torch.cat((x1, x2), 1).index_select(1, self.shuffle_index)
        # [N, C/2, 2, H, W] -> [N, C, H, W]: output channel 2i+g is x_g[i] (one copy).
        return torch.stack((x1, x2), 2).flatten(1, 2)

    def forward(self, x):
        # type: (torch.Tensor) -> torch.Tensor
        """Tensor in, tensor out; no custom Functions (eval, export, TorchScript, compile)."""
        if self.stride == 1:
            # chunk, like torchvision: views forward, one cat in backward (slicing would
            # materialise a zero-filled full-size gradient per half).
            x1, x2 = x.chunk(2, dim=1)
            x2 = self.branch2(x2)
        else:
            x1 = self.branch1(x)
            x2 = self.branch2(x)
        return self._shuffle(x1, x2)

    @torch.jit.unused
    def forward_fused(self, x, split_output):
        """Training path with the fused Functions.

        ``x`` is a tensor (stride-2 block) or the pair of halves produced by the previous block
        (stride-1 block). Returns the pair of halves of the shuffled output when
        ``split_output`` (the next block is stride-1), else the shuffled tensor.
        """
        if self.stride == 1:
            if isinstance(x, (tuple, list)):
                x1, x2 = x
            else:  # not reached with torchvision's stage layout; kept for standalone use
                x1, x2 = x.chunk(2, dim=1)
            x2 = self.branch2(x2)
        else:
            if isinstance(x, (tuple, list)):
                x = torch.cat(tuple(x), 1)
            x1 = self.branch1(x)
            x2 = self.branch2(x)
        if split_output:
            return _ConcatShuffleSplit.apply(x1, x2, self.shuffle_index1, self.shuffle_index2,
                                             self.unshuffle_index1, self.unshuffle_index2)
        return _ConcatShuffle.apply(x1, x2, self.shuffle_index,
                                    self.unshuffle_index1, self.unshuffle_index2)


def forward_stage_fused(stage, x):
    """Run a Sequential of :class:`InvertedResidual` on the fused path: every block but the last
    hands the next one the two halves of its shuffled output; the last returns one tensor."""
    last = len(stage) - 1
    for i, block in enumerate(stage):
        x = block.forward_fused(x, i < last)
    return x


class ShuffleNetV2NPU(nn.Module):
    """torchvision's ``ShuffleNetV2`` (same module tree) using :class:`InvertedResidual` above."""

    __jit_unused_properties__ = ["shuffle_impl"]

    def __init__(self, stages_repeats, stages_out_channels, num_classes=1000, shuffle_impl="auto"):
        super(ShuffleNetV2NPU, self).__init__()
        _find_is_compiling()
        if len(stages_repeats) != 3:
            raise ValueError("expected stages_repeats as list of 3 positive ints")
        if len(stages_out_channels) != 5:
            raise ValueError("expected stages_out_channels as list of 5 positive ints")
        self._stage_out_channels = list(stages_out_channels)

        input_channels = 3
        output_channels = self._stage_out_channels[0]
        self.conv1 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        input_channels = output_channels

        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        for name, repeats, output_channels in zip(("stage2", "stage3", "stage4"), stages_repeats,
                                                  self._stage_out_channels[1:]):
            seq = [InvertedResidual(input_channels, output_channels, 2)]
            for _ in range(repeats - 1):
                seq.append(InvertedResidual(output_channels, output_channels, 1))
            setattr(self, name, nn.Sequential(*seq))
            input_channels = output_channels

        output_channels = self._stage_out_channels[-1]
        self.conv5 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(output_channels, num_classes)
        self.set_shuffle_impl(shuffle_impl)

    # -- configuration (called by the device layer) ------------------------------------------
    def _blocks(self):
        for stage in (self.stage2, self.stage3, self.stage4):
            for block in stage:
                yield block

    @property
    def shuffle_impl(self):
        return self.stage2[0].shuffle_impl

    @shuffle_impl.setter
    def shuffle_impl(self, impl):
        self.set_shuffle_impl(impl)

    @torch.jit.unused
    def set_shuffle_impl(self, impl):
        """``"auto"`` (index_select on NPU, view elsewhere), ``"index_select"`` or ``"view"``."""
        if impl not in SHUFFLE_IMPLS:
            raise ValueError("shuffle_impl must be one of {}, got {!r}".format(SHUFFLE_IMPLS, impl))
        for block in self._blocks():
            block.shuffle_impl = impl
        return self

    @torch.jit.unused
    def set_index_dtype(self, dtype):
        """Cast every shuffle index buffer to ``torch.int32`` or ``torch.int64`` (keeps device)."""
        if dtype not in INDEX_DTYPES:
            raise ValueError("index dtype must be torch.int32 or torch.int64, got {}".format(dtype))
        for block in self._blocks():
            for name in _INDEX_BUFFERS:
                setattr(block, name, getattr(block, name).to(dtype))
        return self

    # -- forward ------------------------------------------------------------------------------
    @torch.jit.unused
    def _fused_enabled(self, x):
        # type: (torch.Tensor) -> bool
        """The rule documented in the module docstring."""
        if not (self.training and torch.is_grad_enabled()):
            return False
        if torch.jit.is_tracing() or _is_compiling():
            return False
        onnx = sys.modules.get("torch.onnx")  # not imported yet: not exporting (and no import here)
        if onnx is not None and hasattr(onnx, "is_in_onnx_export") and onnx.is_in_onnx_export():
            return False
        return self.stage2[0]._use_index_select(x)

    @torch.jit.unused
    def _forward_stages_fused(self, x):
        # type: (torch.Tensor) -> torch.Tensor
        for stage in (self.stage2, self.stage3, self.stage4):
            x = forward_stage_fused(stage, x)
        return x

    def forward(self, x):
        # type: (torch.Tensor) -> torch.Tensor
        x = self.conv1(x)
        x = self.maxpool(x)
        fused = False
        if not torch.jit.is_scripting():
            fused = self._fused_enabled(x)
        if fused:
            x = self._forward_stages_fused(x)
        else:
            x = self.stage2(x)
            x = self.stage3(x)
            x = self.stage4(x)
        x = self.conv5(x)
        x = x.mean([2, 3])  # globalpool
        x = self.fc(x)
        return x


def _shufflenetv2(stages_repeats, stages_out_channels, num_classes, **kwargs):
    return ShuffleNetV2NPU(stages_repeats, stages_out_channels, num_classes=num_classes, **kwargs)


@register_model
def shufflenet_v2_x0_5_npu(num_classes=1000, **kwargs):
    """ShuffleNetV2 x0.5, torchvision-compatible weights, NPU-friendly shuffle."""
    return _shufflenetv2([4, 8, 4], [24, 48, 96, 192, 1024], num_classes, **kwargs)


@register_model
def shufflenet_v2_x1_0_npu(num_classes=1000, **kwargs):
    """ShuffleNetV2 x1.0, torchvision-compatible weights, NPU-friendly shuffle."""
    return _shufflenetv2([4, 8, 4], [24, 116, 232, 464, 1024], num_classes, **kwargs)


@register_model
def shufflenet_v2_x1_5_npu(num_classes=1000, **kwargs):
    """ShuffleNetV2 x1.5, torchvision-compatible weights, NPU-friendly shuffle."""
    return _shufflenetv2([4, 8, 4], [24, 176, 352, 704, 1024], num_classes, **kwargs)


@register_model
def shufflenet_v2_x2_0_npu(num_classes=1000, **kwargs):
    """ShuffleNetV2 x2.0, torchvision-compatible weights, NPU-friendly shuffle."""
    return _shufflenetv2([4, 8, 4], [24, 244, 488, 976, 2048], num_classes, **kwargs)
