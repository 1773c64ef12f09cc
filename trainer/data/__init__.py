"""Data: image folders, fixed-shape loaders (training drops the last batch; validation pads and masks
it), uint8 batches normalised on the device, per-sample seeded augmentation, synthetic batches.
The rules and their reasons: docs/DESIGN.md.

    folders          the ImageNet / tiny-imagenet layouts, classes, samples
    images           file -> pixels (header-only open, draft decode, crop + resize), Box, sample generators
    transforms       TrainCrop / ValCrop (torchvision's crops, decoding only what they need), Normalizer
    samplers         the epoch's order and the validation shards; the DataLoader settings
    host             the host backend (--data-backend cpu): workers decode
    device_backend   the device backend (--data-backend gpu): the device decodes whole batches
    synthetic        --dummy
    resolution       the training resolution schedule (--min-res, --max-res, --start-ramp, --end-ramp)
    spec             LoaderSpec (what a backend is given), DataInfo

A backend is one entry of BACKENDS: ``loaders(spec, device, train_samples, val_samples)`` -> (train loader or
None, validation loader).
"""
import importlib
import os

from trainer.data.folders import (IMG_EXTENSIONS, check_data_root, check_layout,
                                  count_train, find_classes, is_tiny_imagenet_val, scan_train, scan_val)
from trainer.data.resolution import ResolutionSchedule, schedule_of, train_size
from trainer.data.spec import DataInfo, LoaderSpec, Sampling
from trainer.device_names import DEVICE_DECODE, HOST_DECODE
from trainer.errors import DataError

# The parts that import torch are imported at their first use (a module __getattr__, PEP 562): the checks of a
# data set's folders (folders.py) answer before torch is imported (trainer/inputs.py).
_TORCH_PARTS = {
    "host": ("ImageDataset", "PaddedEvalDataset", "channels_last_collate"),
    "images": ("BadImageError", "Box", "crop_resize", "load_rgb", "open_image", "pil_to_chw",
               "pil_to_hwc", "pillow_simd", "read_bytes", "rgb", "sample_rng", "sample_seed", "tensor_crop_resize",
               "torch_resize", "transformed"),
    "samplers": ("EpochSampler", "ShardSampler", "dataloader", "padded_length"),
    "synthetic": ("DUMMY_TRAIN_IMAGES", "DUMMY_VAL_IMAGES", "SyntheticLoader", "build_dummy"),
    "transforms": ("MEAN", "STD", "Normalizer", "TrainCrop", "ValCrop", "center_region", "resized_center",
                   "train_transform", "val_transform"),
    "device_backend": (),
}
_FROM = {name: module for module, names in _TORCH_PARTS.items() for name in names}


def __getattr__(name):
    if name in _TORCH_PARTS:
        return importlib.import_module("trainer.data." + name)
    if name not in _FROM:
        raise AttributeError("module 'trainer.data' has no attribute '{}'".format(name))
    value = getattr(importlib.import_module("trainer.data." + _FROM[name]), name)
    globals()[name] = value
    return value

__all__ = [
    "BACKENDS", "build", "class_folders", "fit_batch", "resolve_backend", "IMG_EXTENSIONS", "is_tiny_imagenet_val",
    "check_data_root", "check_layout", "count_train",
    "find_classes", "scan_train", "scan_val", "ImageDataset", "PaddedEvalDataset", "channels_last_collate",
    "BadImageError", "Box", "crop_resize", "load_rgb", "open_image", "pil_to_chw", "pil_to_hwc",
    "pillow_simd", "read_bytes", "rgb", "sample_rng", "sample_seed", "tensor_crop_resize", "torch_resize",
    "transformed", "EpochSampler", "ShardSampler", "dataloader", "padded_length", "DataInfo", "Sampling", "LoaderSpec",
    "DUMMY_TRAIN_IMAGES", "DUMMY_VAL_IMAGES", "SyntheticLoader", "MEAN", "STD", "Normalizer", "TrainCrop",
    "ValCrop", "center_region", "resized_center", "train_transform", "val_transform",
    "ResolutionSchedule", "schedule_of", "train_size",
]


def _loaders(module):
    """A backend's ``loaders``, its module imported at the first call."""
    def loaders(spec, device, train_samples, val_samples):
        return importlib.import_module("trainer.data." + module).loaders(spec, device, train_samples, val_samples)
    return loaders


BACKENDS = {HOST_DECODE: _loaders("host"), DEVICE_DECODE: _loaders("device_backend")}


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



def class_folders(root):
    """The class folders of the data set in ``root`` (train/'s, or val/'s where there is no train/), sorted."""
    train_dir = os.path.join(root, "train")
    return find_classes(train_dir if os.path.isdir(train_dir) else os.path.join(root, "val"))


def fit_batch(root, batch_size, world_size):
    """The global batch a training run on the data set in ``root`` takes over ``world_size`` processes: the one
    asked, or, where train/ holds fewer images than one batch (drop_last would leave no step), the images each
    process gets (fixed shapes kept: the same batch on every rank, the remainder dropped). Returns (global batch,
    note or None); fewer images than processes is a DataError."""
    per_rank = batch_size // world_size
    held = count_train(os.path.join(root, "train"), class_folders(root), per_rank * world_size)
    if held >= per_rank * world_size:
        return batch_size, None
    if held < world_size:
        raise DataError("train/ has {} image{}, fewer than the {} processes: each process needs at least one image "
                        "a step; run fewer processes or add images".format(held, "" if held == 1 else "s",
                                                                          world_size))
    lowered = held // world_size
    return lowered * world_size, (
        "train/ holds {} image{}, fewer than one batch of {}: the batch is lowered to {} ({} per process x {} "
        "process{}; shapes stay fixed, the remainder of an epoch is dropped)".format(
            held, "" if held == 1 else "s", batch_size, lowered * world_size, lowered, world_size,
            "" if world_size == 1 else "es"))


def build(section, device, sampling, need_train=True, channels_last=False, num_classes=None):
    """(train_loader or None, val_loader, DataInfo) from the config's data section (a config.DataConfig) for one
    rank's ``sampling`` (a Sampling: batch, rank, world size, workers, seed); batches stacked channels-last where
    the model is; ``num_classes`` sizes --dummy's targets (1000 when None). The folder was checked by the plan
    (trainer/plan.py); tools that build loaders of their own call ``check_data_root`` first."""
    batch_per_rank, rank, world_size, workers, seed = sampling
    if section.dummy:
        from trainer.data.synthetic import build_dummy
        return build_dummy(section, device, batch_per_rank, rank, world_size, need_train, num_classes or 1000)
    backend, decode, note = resolve_backend(section.data_backend, device)
    root = section.root
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = class_folders(root)
    val_samples = scan_val(val_dir, {c: i for i, c in enumerate(classes)})
    layout = "tiny-imagenet" if is_tiny_imagenet_val(val_dir) else "imagenet"
    train_samples = None
    if need_train:
        train_samples = scan_train(train_dir, classes)
        if len(train_samples) // world_size < batch_per_rank:
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
