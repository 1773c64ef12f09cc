"""Transforms: RandomResizedCrop + flip and Resize + CenterCrop decoding only what they need, the Box
they crop, and the on-device normaliser."""
import math

import torch
import torch.nn.functional as F

from trainer.data.images import Box, crop_resize, pil_to_hwc, rgb, torch_resize

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _draft(img, need_w, need_h):
    """JPEG draft mode: have the decoder scale by 1/2, 1/4 or 1/8 while decoding, as far as the result
    stays at least ``need_w`` x ``need_h``; returns the (x, y) scale factors obtained (1, 1 if none)."""
    w0, h0 = img.size
    if img.format == "JPEG" and img.mode in ("RGB", "L"):
        img.draft(img.mode, (int(math.ceil(need_w)), int(math.ceil(need_h))))
    return img.size[0] / float(w0), img.size[1] / float(h0)


class TrainCrop:
    """RandomResizedCrop(size, scale) + RandomHorizontalFlip -> uint8 CHW, decoding only what the crop needs.

    The crop and the flip are drawn from the header's image size, before any pixel is decoded, with
    torchvision's algorithm (``params``) from the sample's own generator: the same distribution as
    torchvision's transforms. JPEG draft mode then
    decodes at the largest reduction (1/2, 1/4, 1/8) that keeps the crop at least ``size`` pixels wide and
    high, and one resize (``crop_resize``) crops and scales (bilinear, antialiased) in a single pass. The
    only difference from torchvision's pipeline: when draft mode reduces, part of the downscaling happens in
    the JPEG decoder's DCT instead of the bilinear filter (a mean difference of about one grey level).
    """

    def __init__(self, size, scale_min=0.08):
        self.size, self.scale, self.ratio = size, (scale_min, 1.0), (3.0 / 4.0, 4.0 / 3.0)
        self._sized = {size: self}

    def at(self, size):
        """This transform with output ``size`` (a resolution schedule's size of an epoch); the crop and flip
        drawn from a seed do not depend on it."""
        if size is None:
            return self
        if size not in self._sized:
            self._sized[size] = TrainCrop(size, self.scale[0])
        return self._sized[size]

    def params(self, width, height, g=None):
        """(top, left, h, w, flip): torchvision's RandomResizedCrop.get_params algorithm (up to 10 draws of
        area and log-ratio, else the centre crop clamped to the ratio range), then RandomHorizontalFlip's
        draw, taken from the generator ``g``."""
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        crop = None
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1], generator=g).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g)).item()
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = torch.randint(0, height - h + 1, size=(1,), generator=g).item()
                left = torch.randint(0, width - w + 1, size=(1,), generator=g).item()
                crop = (top, left, h, w)
                break
        if crop is None:
            in_ratio = float(width) / float(height)
            if in_ratio < min(self.ratio):
                w, h = width, int(round(width / min(self.ratio)))
            elif in_ratio > max(self.ratio):
                h, w = height, int(round(height * max(self.ratio)))
            else:
                w, h = width, height
            crop = ((height - h) // 2, (width - w) // 2, h, w)
        return crop + (bool(torch.rand(1, generator=g).item() < 0.5),)

    def __call__(self, img, path="?", g=None):
        top, left, h, w, flip = self.params(img.size[0], img.size[1], g)
        s = self.size
        sx, sy = _draft(img, img.size[0] * s / float(w), img.size[1] * s / float(h))
        return crop_resize(rgb(img, path), Box.from_crop(top, left, h, w).scaled(sx, sy), s, flip)


def resized_center(width, height, resize, crop):
    """((resized width, height), (left, top)): the size torchvision's Resize(resize) gives an image of
    ``width`` x ``height``, and where CenterCrop(crop) then starts, in resized pixels."""
    short, long_ = min(width, height), max(width, height)
    new_long = int(resize * long_ / short)  # torchvision's Resize(int)
    rw, rh = (resize, new_long) if width <= height else (new_long, resize)
    return (rw, rh), (int(round((rw - crop) / 2.0)), int(round((rh - crop) / 2.0)))


def center_region(width, height, resize, crop):
    """((resized width, height), Box): ``resized_center``, with the region that CenterCrop(crop) keeps given in
    original pixels."""
    (rw, rh), (left, top) = resized_center(width, height, resize, crop)
    fx, fy = width / float(rw), height / float(rh)  # resized -> original pixels
    return (rw, rh), Box.from_crop(top, left, crop, crop).scaled(fx, fy)


class ValCrop:
    """Resize(resize) + CenterCrop(crop) -> uint8 CHW (channels-last in memory), the image decoded at a draft
    size that still covers the resized one. With torch's uint8 resize: torchvision's two steps as they are
    (the whole image resized, then cropped); older torch or pillow-simd: the centre region scaled by one PIL
    ``resize(box=...)``."""

    def __init__(self, resize, crop):
        self.resize, self.crop = resize, crop

    def __call__(self, img, path="?", g=None):
        (rw, rh), (left, top) = resized_center(img.size[0], img.size[1], self.resize, self.crop)
        if not torch_resize():
            box = center_region(img.size[0], img.size[1], self.resize, self.crop)[1]
            sx, sy = _draft(img, rw, rh)
            return crop_resize(rgb(img, path), box.scaled(sx, sy), self.crop)
        _draft(img, rw, rh)
        c = self.crop
        x = pil_to_hwc(rgb(img, path)).permute(2, 0, 1).unsqueeze(0)
        out = F.interpolate(x, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
        return out[0, :, top:top + c, left:left + c].permute(1, 2, 0).contiguous().permute(2, 0, 1)


def train_transform(crop, scale_min=0.08):
    return TrainCrop(crop, scale_min)


def val_transform(resize, crop):
    return ValCrop(resize, crop)


class Normalizer:
    """uint8 NCHW batch (host or device) -> normalised float32 on the device, in the model's memory format.

    A channels-last batch (``channels_last_collate``) is normalised through its NHWC view, a row of pixels at
    a time against per-row mean and std vectors: the same arithmetic (subtract, divide) as the NCHW path,
    without its three-element inner loop or a layout change."""

    def __init__(self, device, channels_last=False):
        self.device = device
        self.channels_last = channels_last
        self.mean = device.move(torch.tensor(MEAN).mul(255))
        self.std = device.move(torch.tensor(STD).mul(255))
        self._rows = {}

    def __call__(self, images):
        x = self.device.move(images)
        if self.channels_last and x.dim() == 4 and x.shape[1] == 3 and \
                x.is_contiguous(memory_format=torch.channels_last):
            n, c, h, w = x.shape
            if w not in self._rows:
                self._rows[w] = (self.mean.repeat(w), self.std.repeat(w))
            mean, std = self._rows[w]
            y = x.permute(0, 2, 3, 1).float()
            y.view(n * h, w * c).sub_(mean).div_(std)
            return y.permute(0, 3, 1, 2)
        x = x.float().sub_(self.mean.view(1, 3, 1, 1)).div_(self.std.view(1, 3, 1, 1))
        return x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
