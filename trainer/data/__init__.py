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
import os

from trainer.data import device_backend, host
from trainer.data.folders import (IMG_EXTENSIONS, _is_tiny_imagenet_val, check_data_root, find_classes,
                                  scan_train, scan_val)
from trainer.data.host import ImageDataset, PaddedEvalDataset, channels_last_collate
from trainer.data.images import (_PIL_SIMD, BadImageError, Box, crop_resize, load_rgb, open_image, pil_to_chw,
                                 pil_to_hwc, pillow_simd, read_bytes, rgb, sample_rng, sample_seed,
                                 tensor_crop_resize, torch_resize, transformed)
from trainer.data.resolution import ResolutionSchedule, schedule_of, train_size
from trainer.data.samplers import EpochSampler, ShardSampler, dataloader, padded_length
from trainer.data.spec import DataInfo, LoaderSpec, Sampling
from trainer.data.synthetic import DUMMY_TRAIN_IMAGES, DUMMY_VAL_IMAGES, SyntheticLoader, build_dummy
from trainer.data.transforms import (MEAN, STD, Normalizer, TrainCrop, ValCrop, _draft, center_region,
                                     resized_center, train_transform, val_transform)
from trainer.device import DEVICE_DECODE, HOST_DECODE
from trainer.errors import DataError

__all__ = [
    "BACKENDS", "build", "class_folders", "resolve_backend", "IMG_EXTENSIONS", "_is_tiny_imagenet_val",
    "check_data_root",
    "find_classes", "scan_train", "scan_val", "ImageDataset", "PaddedEvalDataset", "channels_last_collate",
    "_PIL_SIMD", "BadImageError", "Box", "crop_resize", "load_rgb", "open_image", "pil_to_chw", "pil_to_hwc",
    "pillow_simd", "read_bytes", "rgb", "sample_rng", "sample_seed", "tensor_crop_resize", "torch_resize",
    "transformed", "EpochSampler", "ShardSampler", "dataloader", "padded_length", "DataInfo", "Sampling", "LoaderSpec",
    "DUMMY_TRAIN_IMAGES", "DUMMY_VAL_IMAGES", "SyntheticLoader", "MEAN", "STD", "Normalizer", "TrainCrop",
    "ValCrop", "_draft", "center_region", "resized_center", "train_transform", "val_transform",
    "ResolutionSchedule", "schedule_of", "train_size",
]

BACKENDS = {HOST_DECODE: host.loaders, DEVICE_DECODE: device_backend.loaders}


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


def build(section, device, sampling, need_train=True, channels_last=False, num_classes=None):
    """(train_loader or None, val_loader, DataInfo) from the config's data section (a config.DataConfig) for one
    rank's ``sampling`` (a Sampling: batch, rank, world size, workers, seed); batches stacked channels-last where
    the model is; ``num_classes`` sizes --dummy's targets (1000 when None). The folder was checked by the plan
    (trainer/plan.py); tools that build loaders of their own call ``check_data_root`` first."""
    batch_per_rank, rank, world_size, workers, seed = sampling
    if section.dummy:
        return build_dummy(section, device, batch_per_rank, rank, world_size, need_train, num_classes or 1000)
    backend, decode, note = resolve_backend(section.data_backend, device)
    root = section.root
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = class_folders(root)
    val_samples = scan_val(val_dir, {c: i for i, c in enumerate(classes)})
    layout = "tiny-imagenet" if _is_tiny_imagenet_val(val_dir) else "imagenet"
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
