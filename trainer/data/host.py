"""The host data backend (``--data-backend cpu``): DataLoader workers decode and augment (uint8 batches)."""
import torch
from torch.utils.data._utils.collate import default_collate

from trainer.data.images import open_image, read_bytes, transformed
from trainer.data.samplers import EpochSampler, ShardSampler, dataloader, item_parts, padded_length
from trainer.data.transforms import train_transform, val_transform


class ImageDataset(torch.utils.data.Dataset):
    """(path, class) samples -> (uint8 CHW, class); the file opened with its header only, the transform decodes."""

    def __init__(self, samples, transform):
        self.samples, self.transform = samples, transform

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
        self.dataset, self.length, self.image_shape = dataset, length, image_shape

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return tuple(self.dataset[index]) + (True,) if index < len(self.dataset) else self.padding()

    def padding(self):
        return torch.zeros(self.image_shape, dtype=torch.uint8), 0, False


def channels_last_collate(batch):
    """``default_collate`` stacking the images' channels-last buffers as NHWC (no transpose): NCHW, channels-last."""
    out = default_collate([(sample[0].permute(1, 2, 0),) + tuple(sample[1:]) for sample in batch])
    return [out[0].permute(0, 3, 1, 2)] + list(out[1:])


def loaders(spec, device, train_samples, val_samples):
    """(train loader or None, validation loader) of uint8 batches decoded by the workers."""
    collate = channels_last_collate if spec.channels_last else None

    def loader(dataset, sampler, train):
        pin = (device.pin_memory_device or True) if device.pin_memory else False
        return dataloader(dataset, spec.batch_per_rank, sampler, spec.workers, pin, train, collate, spec.seed)
    return backend_loaders(spec, train_samples, val_samples,
                           lambda samples, crop, train: ImageDataset(samples, crop), PaddedEvalDataset, loader)


def backend_loaders(spec, train_samples, val_samples, dataset, padded, loader):
    """A backend's (train loader or None, validation loader): ``dataset(samples, transform, train)``, ``padded`` its
    PaddedEvalDataset, ``loader(dataset, sampler, train)`` (train: drop the last batch)."""
    train = None
    if train_samples is not None:
        sampler = EpochSampler(len(train_samples), spec.seed, spec.rank, spec.world_size, spec.train_sizes)
        crop = train_transform(spec.train_crop_size, spec.crop_scale_min)
        train = loader(dataset(train_samples, crop, True), sampler, True)
    center = val_transform(spec.val_resize_size, spec.val_crop_size)
    length, size = padded_length(len(val_samples), spec.batch_per_rank, spec.world_size), spec.val_crop_size
    val = padded(dataset(val_samples, center, False), length, (3, size, size))
    return train, loader(val, ShardSampler(length, spec.rank, spec.world_size), False)
