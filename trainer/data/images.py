"""Image files -> uint8 pixels (header-only open, draft decode, crop + resize; errors name the file), sample RNGs."""
import contextlib
import io
import warnings
from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from trainer.device import uint8_antialias_resize
from trainer.errors import DataError


class Box(namedtuple("Box", "left top right bottom")):
    """A region of an image in source pixels, (left, top, right, bottom) as PIL's ``box`` (fractional where draft
    mode scaled the image): torchvision's (top, left, height, width) via ``from_crop``, roi_align's ``yxyx()``."""

    __slots__ = ()

    @classmethod
    def from_crop(cls, top, left, height, width):
        return cls(left, top, left + width, top + height)

    def scaled(self, sx, sy):
        """The same region in an image decoded at (sx, sy) times the size."""
        return Box(self.left * sx, self.top * sy, self.right * sx, self.bottom * sy)

    def yxyx(self):
        return (self.top, self.left, self.bottom, self.right)


class BadImageError(DataError):
    pass


_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


@contextlib.contextmanager
def _naming(path):
    """Reading or decoding errors as a BadImageError naming the file."""
    try:
        yield
    except _DECODE_ERRORS as exc:
        raise BadImageError("cannot decode image '{}' ({}): remove or replace the file".format(
            path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))


def read_bytes(path):
    with _naming(path), open(path, "rb") as f:
        return f.read()


def open_image(raw, path):
    """A PIL image over the file's bytes with only its header read (size, format, mode known; no pixels)."""
    with _naming(path):
        return Image.open(io.BytesIO(raw))


def rgb(img, path):
    """Decode ``img`` (at its draft size, if one was set) as RGB."""
    with _naming(path):
        if img.mode != "RGB":
            return img.convert("RGB")
        img.load()
        return img


def load_rgb(path):
    return rgb(open_image(read_bytes(path), path), path)


def pil_to_hwc(img):
    """uint8 HWC tensor over an RGB PIL image's pixels (one copy, out of PIL's buffer; nothing writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(np.asarray(img))


def pil_to_chw(img):
    """uint8 CHW view of ``pil_to_hwc``: channels-last in memory, as ``channels_last_collate`` stacks it."""
    return pil_to_hwc(img).permute(2, 0, 1)


_PIL_SIMD = []


def pillow_simd():
    """Whether PIL is pillow-simd, whose SIMD resize beats torch's uint8 resize (docs/BENCHMARKS.md)."""
    if not _PIL_SIMD:
        try:
            from importlib import metadata  # novermin (3.8; asked with torch >= 2.1, which needs 3.8)
            _PIL_SIMD.append(metadata.distribution("pillow-simd") is not None)
        except Exception:  # not installed (or Python < 3.8, without importlib.metadata)
            _PIL_SIMD.append(False)
    return _PIL_SIMD[0]


def torch_resize():
    """Whether the CPU backend resizes with torch's uint8 antialiased resize (where it has one; not pillow-simd)."""
    return uint8_antialias_resize() and not pillow_simd()


def crop_resize(img, box, size, flip=False):
    """uint8 CHW (channels-last): ``box`` of ``img`` scaled to ``size`` (bilinear, antialiased), mirrored if ``flip``;
    ``torch_resize``: PIL's filter at a third of its cost, the box rounded to whole pixels."""
    if not torch_resize():
        out = img.resize((size, size), Image.BILINEAR, box=box)
        return pil_to_chw(out.transpose(Image.FLIP_LEFT_RIGHT) if flip else out)
    return tensor_crop_resize(pil_to_chw(img), box, size, flip)


def tensor_crop_resize(chw, box, size, flip=False):
    """``crop_resize`` of a uint8 CHW tensor with torch's uint8 resize, ``box`` rounded to whole pixels inside."""
    h, w = chw.shape[-2:]
    left, top = max(0, min(int(round(box[0])), w - 1)), max(0, min(int(round(box[1])), h - 1))
    right, bottom = max(min(int(round(box[2])), w), left + 1), max(min(int(round(box[3])), h), top + 1)
    x = chw[:, top:bottom, left:right].unsqueeze(0)
    out = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    out = out.flip(3) if flip else out
    return out[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)


def sample_seed(base_seed, epoch, index):
    return (base_seed * 6364136223846793005 + epoch * 1442695040888963407 + index) % (2 ** 63)


def sample_rng(seed):
    """The sample's own torch.Generator (None: torch's global one). A generator per sample costs a few
    microseconds, where re-seeding the global RNG (fork_rng + manual_seed) costs ~0.15 ms."""
    return None if seed is None else torch.Generator().manual_seed(seed)


def transformed(img, transform, seed, path):
    """``transform(img, path, rng)`` with the sample's generator; decoding errors name the file."""
    with _naming(path):
        return transform(img, path, sample_rng(seed))
