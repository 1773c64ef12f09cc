"""Data: image folders, fixed-shape loaders (training drops the last batch; validation pads and masks it), uint8 batches
normalised on the device, per-sample seeded augmentation, synthetic batches (rules and reasons: docs/DESIGN.md). The
backends (BACKENDS: ``loaders(spec, device, train_samples, val_samples)`` -> (train loader or None, validation loader)):
host (--data-backend cpu: workers decode) and device_backend (gpu: the device decodes whole batches).
"""
import importlib
import os

from trainer.data.folders import (IMG_EXTENSIONS, check_data_root, check_layout, count_train,  # noqa: F401
                                  find_classes, is_tiny_imagenet_val, scan_train, scan_val)
from trainer.data.resolution import ResolutionSchedule, schedule_of, train_size  # noqa: F401
from trainer.data.spec import DataInfo, LoaderSpec, Sampling  # noqa: F401
from trainer.device_names import DEVICE_DECODE, HOST_DECODE
from trainer.errors import DataError, counted

# The parts that import torch load at first use (PEP 562): the folder checks answer before torch is imported.
_TORCH_PARTS = {
    "host": ("ImageDataset", "PaddedEvalDataset", "channels_last_collate"),
    "images": ("BadImageError", "load_rgb", "open_image", "read_bytes", "sample_rng", "torch_resize"),
    "samplers": ("EpochSampler", "ShardSampler", "dataloader", "padded_length", "release"),
    "transforms": ("MEAN", "STD", "Normalizer", "TrainCrop", "ValCrop", "train_transform", "val_transform"),
    "synthetic": (), "device_backend": (),
}
_FROM = {name: module for module, names in _TORCH_PARTS.items() for name in names}


def __getattr__(name):
    if name in _TORCH_PARTS:
        return importlib.import_module("trainer.data." + name)
    if name not in _FROM:
        raise AttributeError("module 'trainer.data' has no attribute '{}'".format(name))
    value = globals()[name] = getattr(importlib.import_module("trainer.data." + _FROM[name]), name)
    return value


def _loaders(module):
    """A backend's ``loaders``, its module imported at the first call."""
    return lambda *args: importlib.import_module("trainer.data." + module).loaders(*args)


BACKENDS = {HOST_DECODE: _loaders("host"), DEVICE_DECODE: _loaders("device_backend")}


def resolve_backend(requested, device):
    """(backend, decoder or None, note or None) for ``--data-backend``; ``auto``: ``Device.prefers_device_decode``."""
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


def class_folders(root):
    """The class folders of the data set in ``root`` (train/'s, or val/'s where there is no train/), sorted."""
    train_dir = os.path.join(root, "train")
    return find_classes(train_dir if os.path.isdir(train_dir) else os.path.join(root, "val"))


def fit_batch(root, batch_size, world_size):
    """(global batch, note or None): the one asked, or the most train/ fills on every rank where it holds less."""
    per_rank = batch_size // world_size
    held = count_train(os.path.join(root, "train"), class_folders(root), per_rank * world_size)
    if held >= per_rank * world_size:
        return batch_size, None
    if held < world_size:
        raise DataError("train/ has {}, fewer than the {} processes: each process needs at least one image a step; "
                        "run fewer processes or add images".format(counted(held, "image"), world_size))
    lowered = held // world_size
    return lowered * world_size, (
        "train/ holds {}, fewer than one batch of {}: the batch is lowered to {} ({} per process x {}; shapes stay "
        "fixed, the remainder of an epoch is dropped)".format(counted(held, "image"), batch_size, lowered * world_size,
                                                              lowered, counted(world_size, "process")))


def build(section, device, sampling, need_train=True, channels_last=False, num_classes=None):
    """(train_loader or None, val_loader, DataInfo) of the data section for one rank's ``sampling``; the plan checked
    the folder (tools call ``check_data_root`` first); ``num_classes``: --dummy's targets (None: 1000)."""
    batch_per_rank, rank, world_size, workers, seed = sampling
    if section.dummy:
        from trainer.data.synthetic import build_dummy
        return build_dummy(section, device, batch_per_rank, rank, world_size, need_train, num_classes or 1000)
    backend, decode, note = resolve_backend(section.data_backend, device)
    train_dir, val_dir = os.path.join(section.root, "train"), os.path.join(section.root, "val")
    classes = class_folders(section.root)
    val_samples = scan_val(val_dir, {c: i for i, c in enumerate(classes)})
    layout = "tiny-imagenet" if is_tiny_imagenet_val(val_dir) else "imagenet"
    train_samples = scan_train(train_dir, classes) if need_train else None
    if need_train and len(train_samples) // world_size < batch_per_rank:
        raise DataError("train/ has {} images: too few for one batch of {} per process x {} processes "
                        "(drop_last keeps shapes fixed); lower --batch-size".format(
                            len(train_samples), batch_per_rank, world_size))
    spec = LoaderSpec(batch_per_rank=batch_per_rank, rank=rank, world_size=world_size, workers=workers, seed=seed,
                      train_crop_size=section.train_crop_size, crop_scale_min=section.crop_scale_min,
                      val_resize_size=section.val_resize_size, val_crop_size=section.val_crop_size,
                      channels_last=bool(channels_last), decode=decode, decode_ahead=section.decode_ahead,
                      batched_crops=section.batched_crops, train_sizes=schedule_of(section))
    train_loader, val_loader = BACKENDS[backend](spec, device, train_samples, val_samples)
    info = DataInfo(len(classes), classes, len(train_samples or ()), len(val_samples), layout, backend, note)
    return train_loader, val_loader, info
