"""Data: image folders, fixed-shape loaders (training drops the last batch; validation pads and masks
it), uint8 workers with on-device normalisation, per-sample seeded augmentation, synthetic batches.
The rules and their reasons: docs/DESIGN.md.
"""
import io
import math
import os
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data._utils.collate import default_collate

from trainer.device import DEVICE_DECODE, HOST_DECODE, uint8_antialias_resize
from trainer.errors import DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# pytorch/examples' synthetic data sizes (--dummy)
DUMMY_TRAIN_IMAGES = 1281167
DUMMY_VAL_IMAGES = 50000


class BadImageError(DataError):
    pass


# ---------------------------------------------------------------- layouts


def _visible_dirs(path):
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _images_under(path):
    out = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS):
                out.append(os.path.join(root, name))
    return out


def _is_tiny_imagenet_val(val_dir):
    return (os.path.isfile(os.path.join(val_dir, "val_annotations.txt"))
            and os.path.isdir(os.path.join(val_dir, "images")))


def check_data_root(root, need_train=True):
    if not os.path.exists(root):
        raise DataError("data directory '{}' does not exist".format(root))
    if not os.path.isdir(root):
        raise DataError("data path '{}' is not a directory".format(root))
    if not os.listdir(root):
        raise DataError("data directory '{}' is empty: it needs train/ and val/ subfolders".format(root))
    for sub in (("train", "val") if need_train else ("val",)):
        if not os.path.isdir(os.path.join(root, sub)):
            raise DataError("data directory '{}' has no {}/ folder (expected {}/train/<class>/*.JPEG "
                            "and {}/val/<class>/*.JPEG)".format(root, sub, root, root))


def find_classes(train_dir):
    classes = _visible_dirs(train_dir)
    if not classes:
        raise DataError("'{}' holds no class folders".format(train_dir))
    return classes


def scan_train(train_dir, classes):
    samples = []
    for idx, name in enumerate(classes):
        files = _images_under(os.path.join(train_dir, name))
        if not files:
            raise DataError("class folder '{}' holds no images ({})".format(
                os.path.join(train_dir, name), "/".join(IMG_EXTENSIONS)))
        samples.extend((f, idx) for f in files)
    return samples


def scan_val(val_dir, class_to_idx):
    """Validation samples labelled with the TRAINING set's class map."""
    if _is_tiny_imagenet_val(val_dir):
        return _scan_tiny_val(val_dir, class_to_idx)
    val_classes = _visible_dirs(val_dir)
    missing = sorted(set(class_to_idx) - set(val_classes))
    extra = sorted(set(val_classes) - set(class_to_idx))
    if extra:
        raise DataError("val/ has class folder(s) not in train/: {}".format(_names(extra)))
    if missing:
        raise DataError("val/ lacks class folder(s) that train/ has: {}".format(_names(missing)))
    samples = []
    for name in val_classes:
        samples.extend((f, class_to_idx[name]) for f in _images_under(os.path.join(val_dir, name)))
    if not samples:
        raise DataError("'{}' holds no images".format(val_dir))
    return samples


def _scan_tiny_val(val_dir, class_to_idx):
    samples = []
    ann = os.path.join(val_dir, "val_annotations.txt")
    with open(ann) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.strip().split("\t")
            if not fields or not fields[0]:
                continue
            if len(fields) < 2:
                raise DataError("{}:{}: expected 'FILE<tab>WNID', got '{}'".format(ann, lineno, line.strip()))
            name, wnid = fields[0], fields[1]
            if wnid not in class_to_idx:
                raise DataError("{}:{}: class '{}' is not in train/".format(ann, lineno, wnid))
            path = os.path.join(val_dir, "images", name)
            if not os.path.isfile(path):
                raise DataError("{}:{}: image '{}' does not exist".format(ann, lineno, path))
            samples.append((path, class_to_idx[wnid]))
    if not samples:
        raise DataError("'{}' lists no images".format(ann))
    return samples


def _names(names, limit=5):
    shown = ", ".join(names[:limit])
    return shown + (" and {} more".format(len(names) - limit) if len(names) > limit else "")


# ---------------------------------------------------------------- datasets


_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _bad(path, exc):
    return BadImageError("cannot decode image '{}' ({}): remove or replace the file".format(
        path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _bad(path, exc)


def open_image(raw, path):
    """A PIL image over the file's bytes with only its header read (size, format, mode known; no pixels)."""
    try:
        return Image.open(io.BytesIO(raw))
    except _DECODE_ERRORS as exc:
        raise _bad(path, exc)


def rgb(img, path):
    """Decode ``img`` (at its draft size, if one was set) as RGB."""
    try:
        if img.mode != "RGB":
            return img.convert("RGB")
        img.load()
        return img
    except _DECODE_ERRORS as exc:
        raise _bad(path, exc)


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
            metadata.distribution("pillow-simd")
            _PIL_SIMD.append(True)
        except Exception:  # not installed (or Python < 3.8, without importlib.metadata)
            _PIL_SIMD.append(False)
    return _PIL_SIMD[0]


def torch_resize():
    """Whether the CPU backend resizes with torch (its uint8 antialiased resize, when this torch has one and
    PIL is not pillow-simd) rather than with PIL."""
    return uint8_antialias_resize() and not pillow_simd()


def crop_resize(img, box, size, flip=False):
    """uint8 CHW (channels-last in memory): the region ``box`` = (left, top, right, bottom) of the RGB PIL
    ``img`` scaled to ``size`` x ``size`` (bilinear, antialiased), mirrored if ``flip``.

    With torch's uint8 resize (``torch_resize``), the same filter as PIL's at about a third of its cost; the
    box is then rounded to whole pixels of the decoded image, which changes nothing unless draft mode decoded
    it reduced. Older torch or pillow-simd: PIL's ``resize(box=...)``."""
    if not torch_resize():
        out = img.resize((size, size), Image.BILINEAR, box=box)
        return pil_to_chw(out.transpose(Image.FLIP_LEFT_RIGHT) if flip else out)
    return tensor_crop_resize(pil_to_chw(img), box, size, flip)


def tensor_crop_resize(chw, box, size, flip=False):
    """``crop_resize`` of a uint8 CHW tensor on the host, with torch's uint8 resize (the caller checks
    ``uint8_antialias_resize``); ``box`` is rounded to whole pixels and kept inside the image."""
    h, w = chw.shape[-2:]
    left, top = max(0, min(int(round(box[0])), w - 1)), max(0, min(int(round(box[1])), h - 1))
    right, bottom = max(min(int(round(box[2])), w), left + 1), max(min(int(round(box[3])), h), top + 1)
    x = chw[:, top:bottom, left:right].unsqueeze(0)
    out = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    if flip:
        out = out.flip(3)
    return out[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)


def channels_last_collate(batch):
    """``default_collate`` with the images stacked as NHWC (a plain copy of the transforms' channels-last
    buffers, no transpose) and returned as NCHW tensors in channels-last memory format."""
    out = default_collate([(sample[0].permute(1, 2, 0),) + tuple(sample[1:]) for sample in batch])
    return [out[0].permute(0, 3, 1, 2)] + list(out[1:])


def sample_seed(base_seed, epoch, index):
    return (base_seed * 6364136223846793005 + epoch * 1442695040888963407 + index) % (2 ** 63)


def sample_rng(seed):
    """The sample's own torch.Generator (None: torch's global one). A generator per sample costs a few
    microseconds, where re-seeding the global RNG (fork_rng + manual_seed) costs ~0.15 ms."""
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def transformed(img, transform, seed, path):
    """``transform(img, path, rng)`` with the sample's generator; decoding errors name the file."""
    try:
        return transform(img, path, sample_rng(seed))
    except _DECODE_ERRORS as exc:
        raise _bad(path, exc)


class ImageDataset(torch.utils.data.Dataset):
    """(path, class) samples -> (uint8 CHW tensor, class).

    Indices may come as plain ints or as (index, seed) pairs from ``EpochSampler``;
    with a seed the augmentation of that sample is reproducible. The file is opened with its header
    only: the transform decides how much of it to decode (``TrainCrop``, ``ValCrop``).
    """

    def __init__(self, samples, transform):
        self.samples = samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, item):
        index, seed = item if isinstance(item, tuple) else (item, None)
        path, target = self.samples[index]
        img = open_image(read_bytes(path), path)
        return transformed(img, self.transform, seed, path), target


class PaddedEvalDataset(torch.utils.data.Dataset):
    """Pads ``dataset`` to ``length`` items; returns (image, target, valid)."""

    def __init__(self, dataset, length, image_shape):
        self.dataset = dataset
        self.length = length
        self.image_shape = image_shape

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if index < len(self.dataset):
            img, target = self.dataset[index]
            return img, target, True
        return torch.zeros(self.image_shape, dtype=torch.uint8), 0, False


def padded_length(n, batch_per_rank, world_size):
    chunk = batch_per_rank * world_size
    return int(math.ceil(n / float(chunk))) * chunk


class EpochSampler(torch.utils.data.Sampler):
    """Shuffled, sharded training order for one epoch: yields (index, sample seed).

    Like DistributedSampler with drop_last=True: each rank gets len // world items,
    distinct across ranks; the order depends on (seed, epoch) only.
    """

    def __init__(self, n, seed, rank=0, world_size=1):
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n // self.world_size

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        total = len(self) * self.world_size
        for index in order[self.rank:total:self.world_size]:
            yield index, sample_seed(self.seed, self.epoch, index)


class ShardSampler(torch.utils.data.Sampler):
    """Strided shard of range(n): each index on exactly one rank."""

    def __init__(self, n, rank=0, world_size=1):
        self.indices = list(range(rank, n, world_size))

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        return iter(self.indices)


# ---------------------------------------------------------------- transforms


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
        return crop_resize(rgb(img, path), (left * sx, top * sy, (left + w) * sx, (top + h) * sy), s, flip)


def resized_center(width, height, resize, crop):
    """((resized width, height), (left, top)): the size torchvision's Resize(resize) gives an image of
    ``width`` x ``height``, and where CenterCrop(crop) then starts, in resized pixels."""
    short, long_ = min(width, height), max(width, height)
    new_long = int(resize * long_ / short)  # torchvision's Resize(int)
    rw, rh = (resize, new_long) if width <= height else (new_long, resize)
    return (rw, rh), (int(round((rw - crop) / 2.0)), int(round((rh - crop) / 2.0)))


def center_region(width, height, resize, crop):
    """((resized width, height), (left, top, right, bottom)): ``resized_center``, with the region that
    CenterCrop(crop) keeps given in original pixels."""
    (rw, rh), (left, top) = resized_center(width, height, resize, crop)
    fx, fy = width / float(rw), height / float(rh)  # resized -> original pixels
    return (rw, rh), (left * fx, top * fy, (left + crop) * fx, (top + crop) * fy)


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
            return crop_resize(rgb(img, path), (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy), self.crop)
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


# ---------------------------------------------------------------- synthetic data


class SyntheticLoader:
    """``steps`` identical batches made once on the device (no decoding, no copies)."""

    def __init__(self, device, batch, steps, image_size, num_classes, with_mask=False, valid=None):
        g = torch.Generator().manual_seed(0)
        self.images = device.move(torch.randint(0, 256, (batch, 3, image_size, image_size),
                                                generator=g, dtype=torch.uint8))
        self.target = device.move(torch.randint(0, num_classes, (batch,), generator=g).to(device.target_dtype))
        self.steps = steps
        self.with_mask = with_mask
        self.last_valid = valid  # number of valid images in the last batch (validation)
        self.batch = batch
        self.sampler = None
        self.device = device

    def __len__(self):
        return self.steps

    def __iter__(self):
        full = self.device.move(torch.ones(self.batch, dtype=torch.bool))
        for i in range(self.steps):
            if not self.with_mask:
                yield self.images, self.target
            else:
                mask = full
                if i == self.steps - 1 and self.last_valid is not None:
                    mask = self.device.move(torch.arange(self.batch) < self.last_valid)
                yield self.images, self.target, mask


# ---------------------------------------------------------------- loaders


class DataInfo:
    def __init__(self, num_classes, classes, train_images, val_images, layout, backend="synthetic", note=None):
        self.num_classes = num_classes
        self.classes = classes
        self.train_images = train_images
        self.val_images = val_images
        self.layout = layout
        self.backend = backend  # cpu | gpu | synthetic
        self.note = note


def _loader(dataset, batch, sampler, workers, pin_memory, drop_last, collate_fn=None):
    kwargs = {}
    if workers > 0:
        # at least 4 batches under way per process (DataLoader's default 2 per worker leaves a lone worker
        # with 2): a slow file or a busy core then does not stall the step
        kwargs.update(persistent_workers=True, prefetch_factor=max(2, int(math.ceil(4.0 / workers))))
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch, sampler=sampler, num_workers=workers,
        pin_memory=pin_memory, drop_last=drop_last, **kwargs)


def resolve_backend(requested, device):
    """(backend, decoder or None, note or None) for ``--data-backend``: ``auto`` is the device backend where
    the device layer prefers decoding there (``Device.prefers_device_decode``), the CPU backend otherwise."""
    if requested == HOST_DECODE or (requested == "auto" and not device.prefers_device_decode):
        return HOST_DECODE, None, None
    decode = device.jpeg_decoder()
    if requested == "auto":
        return (DEVICE_DECODE, decode, None) if decode is not None else (HOST_DECODE, None, None)
    if decode is None:
        raise DataError("--data-backend gpu: {} has no JPEG decoder here ({}); use --data-backend cpu".format(
            device.name, device.jpeg_decoder_missing()))
    note = None if device.prefers_device_decode else (
        "--data-backend gpu on {}: batches are decoded in the training process, not in the workers (slower "
        "than --data-backend cpu; useful to check the device backend)".format(device.name))
    return DEVICE_DECODE, decode, note


def build(cfg, device, batch_per_rank, rank, world_size, workers, seed, need_train=True):
    """(train_loader or None, val_loader, DataInfo)."""
    if cfg.dummy:
        return _build_dummy(cfg, device, batch_per_rank, rank, world_size, need_train)
    backend, decode, note = resolve_backend(getattr(cfg, "data_backend", HOST_DECODE), device)
    root = cfg.data
    check_data_root(root, need_train=need_train)
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    have_train = os.path.isdir(train_dir)
    classes = find_classes(train_dir if have_train else val_dir)
    class_to_idx = {c: i for i, c in enumerate(classes)}
    val_samples = scan_val(val_dir, class_to_idx)
    layout = "tiny-imagenet" if _is_tiny_imagenet_val(val_dir) else "imagenet"
    train_loader, n_train = None, 0
    host_collate = channels_last_collate if getattr(cfg, "channels_last", False) else None
    if need_train:
        train_samples = scan_train(train_dir, classes)
        n_train = len(train_samples)
        if n_train // world_size < batch_per_rank:
            raise DataError("train/ has {} images: too few for one batch of {} per process x {} processes "
                            "(drop_last keeps shapes fixed); lower --batch-size".format(
                                n_train, batch_per_rank, world_size))
        sampler = EpochSampler(n_train, seed, rank, world_size)
        crop = train_transform(cfg.train_crop_size, cfg.crop_scale_min)
        if backend == DEVICE_DECODE:
            from trainer import batch_decode as bd
            ds = bd.EncodedDataset(train_samples, True, crop, cfg.train_crop_size)
            train_loader = bd.DeviceDecodeLoader(  # not pinned: the decoder copies the bytes itself
                _loader(ds, batch_per_rank, sampler, workers, False, True, bd.collate), device, decode,
                cfg.train_crop_size, True)
        else:
            train_loader = _loader(ImageDataset(train_samples, crop), batch_per_rank, sampler, workers,
                                   device.pin_memory, True, host_collate)
    center = val_transform(cfg.val_resize_size, cfg.val_crop_size)
    length = padded_length(len(val_samples), batch_per_rank, world_size)
    if backend == DEVICE_DECODE:
        from trainer import batch_decode as bd
        padded = bd.PaddedEncoded(bd.EncodedDataset(val_samples, False, center, cfg.val_crop_size),
                                  length, cfg.val_crop_size)
        val_loader = bd.DeviceDecodeLoader(
            _loader(padded, batch_per_rank, ShardSampler(length, rank, world_size), workers, False,
                    False, bd.collate), device, decode, cfg.val_crop_size, False, resize=cfg.val_resize_size)
    else:
        padded = PaddedEvalDataset(ImageDataset(val_samples, center), length, (3, cfg.val_crop_size, cfg.val_crop_size))
        val_loader = _loader(padded, batch_per_rank, ShardSampler(length, rank, world_size), workers,
                             device.pin_memory, False, host_collate)
    info = DataInfo(len(classes), classes, n_train, len(val_samples), layout, backend, note)
    return train_loader, val_loader, info


def _build_dummy(cfg, device, batch_per_rank, rank, world_size, need_train):
    num_classes = cfg.num_classes or 1000
    train_steps = DUMMY_TRAIN_IMAGES // (batch_per_rank * world_size)
    train = None
    if need_train:
        train = SyntheticLoader(device, batch_per_rank, train_steps, cfg.train_crop_size, num_classes)
    n_pad = padded_length(DUMMY_VAL_IMAGES, batch_per_rank, world_size)
    steps = n_pad // (batch_per_rank * world_size)
    # Shard DUMMY_VAL_IMAGES over ranks the way ShardSampler does: rank r owns the
    # indices r, r + world, ...; only its last batch can hold padding.
    owned = len(range(rank, DUMMY_VAL_IMAGES, world_size))
    last_valid = owned - (steps - 1) * batch_per_rank
    val = SyntheticLoader(device, batch_per_rank, steps, cfg.val_crop_size, num_classes,
                          with_mask=True, valid=max(0, min(batch_per_rank, last_valid)))
    return train, val, DataInfo(num_classes, None, DUMMY_TRAIN_IMAGES, DUMMY_VAL_IMAGES, "synthetic")
