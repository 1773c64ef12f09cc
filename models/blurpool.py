"""BlurPool for torchvision's ResNets (``--blurpool``), FFCV's rule and layer (ffcv-imagenet's
``BlurPoolConv2d`` and ``apply_blurpool``, after Zhang, "Making Convolutional Networks Shift-Invariant Again"):
every ``nn.Conv2d`` with a stride above 1 and at least 16 input channels first low-passes its input with a fixed
3x3 binomial filter ([1, 2, 1] x [1, 2, 1] / 16, depthwise, stride 1, zero padding 1), then convolves as before,
with its own stride. A ResNet's stem (3 input channels) is left as it is.

The layer is a ``nn.Conv2d`` subclass that keeps the convolution's own parameters, and the filter is a buffer left
out of the state dict: a BlurPool model's state dict has exactly the keys and shapes of the plain network's, so
torchvision's published weights, and this project's checkpoints of either, load into it as they are (which of the
two a checkpoint was trained as is in its config: trainer/plan.py holds a run to it). FFCV's layer wraps the
convolution instead, so FFCV's own files name the weights ``...conv.weight`` and are not read here."""
import torch
import torch.nn.functional as F

BLURPOOL_ARCHS = "torchvision's ResNets and ResNeXts (resnet*, resnext*, wide_resnet*)"


def binomial_filter(channels):
    """The depthwise [1, 2, 1] x [1, 2, 1] / 16 filter for ``channels`` channels: (channels, 1, 3, 3)."""
    row = torch.tensor([1.0, 2.0, 1.0])
    return (row.view(3, 1) * row.view(1, 3) / 16.0).view(1, 1, 3, 3).repeat(channels, 1, 1, 1)


class BlurPoolConv2d(torch.nn.Conv2d):
    """A strided ``nn.Conv2d`` whose input is blurred first (FFCV's ``BlurPoolConv2d``)."""

    @classmethod
    def from_conv(cls, conv):
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                  dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode)
        new.to(device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(conv.weight)
            if conv.bias is not None:
                new.bias.copy_(conv.bias)
        return new

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("blur_filter", binomial_filter(self.in_channels), persistent=False)

    def forward(self, x):
        blurred = F.conv2d(x, self.blur_filter, stride=1, padding=1, groups=self.in_channels)
        return super().forward(blurred)


def applies_to(model):
    """Whether --blurpool changes ``model``: a torchvision ResNet (or ResNeXt, wide ResNet)."""
    from torchvision.models.resnet import ResNet
    return isinstance(model, ResNet)


def apply_blurpool(module):
    """FFCV's rule, in place: every Conv2d with a stride above 1 and at least 16 input channels becomes a
    ``BlurPoolConv2d`` with the same weights. Returns the number of convolutions replaced."""
    count = 0
    for name, child in module.named_children():
        if type(child) is torch.nn.Conv2d and max(child.stride) > 1 and child.in_channels >= 16:
            setattr(module, name, BlurPoolConv2d.from_conv(child))
            count += 1
        else:
            count += apply_blurpool(child)
    return count
