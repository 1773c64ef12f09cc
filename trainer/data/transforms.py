"""RandomResizedCrop + flip and Resize + CenterCrop, decoding only what they need; the on-device normaliser."""
import math

import torch
import torch.nn.functional as F

from trainer.data.images import Box, crop_resize, pil_to_hwc, rgb, torch_resize

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _draft(img, need_w, need_h):
    """JPEG draft mode: decode scaled by 1/2, 1/4 or 1/8 to at least ``need_w`` x ``need_h``; the (x, y) scales."""
    w0, h0 = img.size
    if img.format == "JPEG" and img.mode in ("RGB", "L"):
        img.draft(img.mode, (int(math.ceil(need_w)), int(math.ceil(need_h))))
    return img.size[0] / float(w0), img.size[1] / float(h0)


class TrainCrop:
    """RandomResizedCrop + RandomHorizontalFlip -> uint8 CHW, drawn from the header's size, decoded at the largest draft
    reduction keeping ``size`` px (part of the downscaling is then the decoder's DCT: about one grey level)."""

    def __init__(self, size, scale_min=0.08):
        self.size, self.scale, self.ratio = size, (scale_min, 1.0), (3.0 / 4.0, 4.0 / 3.0)
        self._sized = {size: self}

    def at(self, size):
        """This transform with output ``size`` (a resolution schedule's); the crops and flips drawn are the same."""
        if size is None:
            return self
        if size not in self._sized:
            self._sized[size] = TrainCrop(size, self.scale[0])
        return self._sized[size]

    def params(self, width, height, g=None):
        """(top, left, h, w, flip) from generator ``g``: torchvision's RandomResizedCrop.get_params (up to 10 draws
        of area and log-ratio, else the centre crop clamped to the ratio range), then RandomHorizontalFlip's."""
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        crop = None
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1], generator=g).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g)).item()
            w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
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
        sx, sy = _draft(img, img.size[0] * self.size / float(w), img.size[1] * self.size / float(h))
        return crop_resize(rgb(img, path), Box.from_crop(top, left, h, w).scaled(sx, sy), self.size, flip)


def resized_center(width, height, resize, crop):
    """((width, height) after torchvision's Resize(resize), (left, top) of CenterCrop(crop) in resized pixels)."""
    new_long = int(resize * max(width, height) / min(width, height))  # torchvision's Resize(int)
    rw, rh = (resize, new_long) if width <= height else (new_long, resize)
    return (rw, rh), (int(round((rw - crop) / 2.0)), int(round((rh - crop) / 2.0)))


def center_region(width, height, resize, crop):
    """((resized width, height), Box): ``resized_center``, the region CenterCrop(crop) keeps in original pixels."""
    (rw, rh), (left, top) = resized_center(width, height, resize, crop)
    return (rw, rh), Box.from_crop(top, left, crop, crop).scaled(width / float(rw), height / float(rh))


class ValCrop:
    """Resize(resize) + CenterCrop(crop) -> uint8 CHW (channels-last), decoded at a draft size covering the resized
    one; torchvision's two steps with ``torch_resize``, else the centre region by one PIL ``resize(box=...)``."""

    def __init__(self, resize, crop):
        self.resize, self.crop = resize, crop

    def __call__(self, img, path="?", g=None):
        (rw, rh), (left, top) = resized_center(img.size[0], img.size[1], self.resize, self.crop)
        if not torch_resize():
            box = center_region(img.size[0], img.size[1], self.resize, self.crop)[1]
            sx, sy = _draft(img, rw, rh)
            return crop_resize(rgb(img, path), box.scaled(sx, sy), self.crop)
        _draft(img, rw, rh)
        x = pil_to_hwc(rgb(img, path)).permute(2, 0, 1).unsqueeze(0)
        out = F.interpolate(x, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False)
        return out[0, :, top:top + self.crop, left:left + self.crop].permute(1, 2, 0).contiguous().permute(2, 0, 1)


train_transform, val_transform = TrainCrop, ValCrop  # (crop, scale_min=0.08), (resize, crop)


class Normalizer:
    """uint8 NCHW batch -> normalised float32 on the device in the model's memory format; a channels-last batch via
    its NHWC view against per-row mean and std vectors (no three-element inner loop, no layout change)."""

    def __init__(self, device, channels_last=False):
        self.device, self.channels_last = device, channels_last
        self.mean, self.std = (device.move(torch.tensor(v).mul(255)) for v in (MEAN, STD))
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
