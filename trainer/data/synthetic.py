"""Synthetic batches (``--dummy``): pytorch/examples' sizes, made once on the device."""
import torch

from trainer.data.resolution import schedule_of
from trainer.data.samplers import padded_length
from trainer.data.spec import DataInfo

# pytorch/examples' synthetic data sizes (--dummy)
DUMMY_TRAIN_IMAGES = 1281167
DUMMY_VAL_IMAGES = 50000


class SyntheticLoader:
    """``steps`` identical batches made once on the device (no decoding, no copies); with ``sizes`` (epoch ->
    size: a resolution schedule) made again at each epoch's size, as ``sampler.set_epoch`` names it."""

    def __init__(self, device, batch, steps, image_size, num_classes, with_mask=False, valid=None, sizes=None):
        g = torch.Generator().manual_seed(0)
        self.images = device.move(torch.randint(0, 256, (batch, 3, image_size, image_size),
                                                generator=g, dtype=torch.uint8))
        self.target = device.move(torch.randint(0, num_classes, (batch,), generator=g).to(device.target_dtype))
        self.steps = steps
        self.with_mask = with_mask
        self.last_valid = valid  # number of valid images in the last batch (validation)
        self.batch = batch
        self.sampler = _Epochs(self, sizes) if sizes is not None else None
        self.device = device

    def resize(self, size):
        """The batch made again at ``size`` (the same generator's draws)."""
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
            else:
                mask = full
                if i == self.steps - 1 and self.last_valid is not None:
                    mask = self.device.move(torch.arange(self.batch) < self.last_valid)
                yield self.images, self.target, mask


class _Epochs:
    """--dummy's stand-in for a sampler under a resolution schedule: ``set_epoch`` sets the batch's size."""

    def __init__(self, loader, sizes):
        self.loader, self.sizes = loader, sizes

    def set_epoch(self, epoch):
        self.loader.resize(self.sizes(epoch))

    @property
    def size(self):
        return self.loader.images.shape[-1]


def build_dummy(section, device, batch_per_rank, rank, world_size, need_train, num_classes=1000):
    """--dummy's loaders: ``section`` is the config's data section (its crop sizes)."""
    train_steps = DUMMY_TRAIN_IMAGES // (batch_per_rank * world_size)
    train = None
    if need_train:
        sizes = schedule_of(section)
        train = SyntheticLoader(device, batch_per_rank, train_steps, sizes(0) if sizes else section.train_crop_size,
                                num_classes, sizes=sizes)
    n_pad = padded_length(DUMMY_VAL_IMAGES, batch_per_rank, world_size)
    steps = n_pad // (batch_per_rank * world_size)
    # Shard DUMMY_VAL_IMAGES over ranks the way ShardSampler does: rank r owns the
    # indices r, r + world, ...; only its last batch can hold padding.
    owned = len(range(rank, DUMMY_VAL_IMAGES, world_size))
    last_valid = owned - (steps - 1) * batch_per_rank
    val = SyntheticLoader(device, batch_per_rank, steps, section.val_crop_size, num_classes,
                          with_mask=True, valid=max(0, min(batch_per_rank, last_valid)))
    return train, val, DataInfo(num_classes, None, DUMMY_TRAIN_IMAGES, DUMMY_VAL_IMAGES, "synthetic")
