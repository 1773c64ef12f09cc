"""The host data backend (``--data-backend cpu``): DataLoader workers decode and augment (uint8), the
training process normalises on the device."""
import torch
from torch.utils.data._utils.collate import default_collate

from trainer.data.images import open_image, read_bytes, transformed
from trainer.data.samplers import EpochSampler, ShardSampler, dataloader, item_parts, padded_length
from trainer.data.transforms import train_transform, val_transform


class ImageDataset(torch.utils.data.Dataset):
    """(path, class) samples -> (uint8 CHW tensor, class).

    Indices may come as plain ints, or as (index, seed) or (index, seed, size) from ``EpochSampler``;
    with a seed the augmentation of that sample is reproducible, with a size the training crop is made at that
    size (a resolution schedule's, ``TrainCrop.at``). The file is opened with its header
    only: the transform decides how much of it to decode (``TrainCrop``, ``ValCrop``).
    """

    def __init__(self, samples, transform):
        self.samples = samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, item):
        index, seed, size = item_parts(item)
        path, target = self.samples[index]
        img = open_image(read_bytes(path), path)
        transform = self.transform.at(size) if size is not None else self.transform
        return transformed(img, transform, seed, path), target



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


def channels_last_collate(batch):
    """``default_collate`` with the images stacked as NHWC (a plain copy of the transforms' channels-last
    buffers, no transpose) and returned as NCHW tensors in channels-last memory format."""
    out = default_collate([(sample[0].permute(1, 2, 0),) + tuple(sample[1:]) for sample in batch])
    return [out[0].permute(0, 3, 1, 2)] + list(out[1:])


def loaders(spec, device, train_samples, val_samples):
    """(train loader or None, validation loader) of uint8 batches decoded by the workers (a LoaderSpec;
    ``train_samples`` None: no training loader)."""
    collate = channels_last_collate if spec.channels_last else None
    train = None
    if train_samples is not None:
        sampler = EpochSampler(len(train_samples), spec.seed, spec.rank, spec.world_size, spec.train_sizes)
        crop = train_transform(spec.train_crop_size, spec.crop_scale_min)
        train = dataloader(ImageDataset(train_samples, crop), spec.batch_per_rank, sampler, spec.workers,
                           device.pin_memory, True, collate, device.pin_memory_device)
    center = val_transform(spec.val_resize_size, spec.val_crop_size)
    length = padded_length(len(val_samples), spec.batch_per_rank, spec.world_size)
    padded = PaddedEvalDataset(ImageDataset(val_samples, center), length, (3, spec.val_crop_size, spec.val_crop_size))
    val = dataloader(padded, spec.batch_per_rank, ShardSampler(length, spec.rank, spec.world_size), spec.workers,
                     device.pin_memory, False, collate, device.pin_memory_device)
    return train, val
