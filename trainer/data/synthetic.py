"""Synthetic batches (``--dummy``): pytorch/examples' sizes, made once on the device."""
import torch

from trainer.data.resolution import schedule_of
from trainer.data.samplers import padded_length
from trainer.data.spec import DataInfo

DUMMY_TRAIN_IMAGES = 1281167
DUMMY_VAL_IMAGES = 50000


class SyntheticLoader:
    """``steps`` identical batches made once on the device (again at each epoch's size under ``sizes``, where the
    loader is its own sampler: ``set_epoch``)."""

    def __init__(self, device, batch, steps, image_size, num_classes, with_mask=False, valid=None, sizes=None):
        g = torch.Generator().manual_seed(0)
        self.images = device.move(torch.randint(0, 256, (batch, 3, image_size, image_size),
                                                generator=g, dtype=torch.uint8))
        self.target = device.move(torch.randint(0, num_classes, (batch,), generator=g).to(device.target_dtype))
        self.steps, self.with_mask, self.batch, self.device = steps, with_mask, batch, device
        self.last_valid = valid  # number of valid images in the last batch (validation)
        self.sizes = sizes
        self.sampler = self if sizes is not None else None

    def set_epoch(self, epoch):
        """The batch made again at the epoch's size (the same generator's draws)."""
        size = self.sizes(epoch)
        if self.images.shape[-1] != size:
            g = torch.Generator().manual_seed(0)
            self.images = self.device.move(torch.randint(0, 256, (self.batch, 3, size, size), generator=g,
                                                         dtype=torch.uint8))

    def __len__(self):
        return self.steps

    def __iter__(self):
        full = self.device.move(torch.ones(self.batch, dtype=torch.bool))
        for i in range(self.steps):
            if not self.with_mask:
                yield self.images, self.target
            elif i == self.steps - 1 and self.last_valid is not None:
                yield self.images, self.target, self.device.move(torch.arange(self.batch) < self.last_valid)
            else:
                yield self.images, self.target, full


def build_dummy(section, device, batch_per_rank, rank, world_size, need_train, num_classes=1000):
    """--dummy's loaders: ``section`` is the config's data section (its crop sizes)."""
    train, sizes = None, schedule_of(section)
    if need_train:
        train = SyntheticLoader(device, batch_per_rank, DUMMY_TRAIN_IMAGES // (batch_per_rank * world_size),
                                sizes(0) if sizes else section.train_crop_size, num_classes, sizes=sizes)
    steps = padded_length(DUMMY_VAL_IMAGES, batch_per_rank, world_size) // (batch_per_rank * world_size)
    # sharded as ShardSampler does (rank r owns r, r + world, ...): only its last batch can hold padding
    last_valid = len(range(rank, DUMMY_VAL_IMAGES, world_size)) - (steps - 1) * batch_per_rank
    val = SyntheticLoader(device, batch_per_rank, steps, section.val_crop_size, num_classes,
                          with_mask=True, valid=max(0, min(batch_per_rank, last_valid)))
    return train, val, DataInfo(num_classes, None, DUMMY_TRAIN_IMAGES, DUMMY_VAL_IMAGES, "synthetic")
