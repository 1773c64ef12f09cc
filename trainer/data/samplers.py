"""Samplers: the training order of an epoch (shuffled, sharded, a seed per sample) and the validation
shards (every image on exactly one rank); the DataLoader settings both backends share."""
import math

import torch

from trainer.job import lifeline
from trainer.data.images import sample_seed


def padded_length(n, batch_per_rank, world_size):
    chunk = batch_per_rank * world_size
    return int(math.ceil(n / float(chunk))) * chunk


class EpochSampler(torch.utils.data.Sampler):
    """Shuffled, sharded training order for one epoch: yields (index, sample seed), or with ``sizes`` (epoch ->
    image size: a resolution schedule) (index, sample seed, size).

    Like DistributedSampler with drop_last=True: each rank gets len // world items,
    distinct across ranks; the order depends on (seed, epoch) only. The sampler runs in the training process,
    which iterates it afresh every epoch: the size it hands out reaches persistent workers with their items.
    """

    def __init__(self, n, seed, rank=0, world_size=1, sizes=None):
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.epoch = 0
        self.sizes = sizes
        self.skip = 0  # items of this rank's order left out once: a mid-epoch checkpoint's, for the next epoch drawn

    def set_epoch(self, epoch):
        self.epoch = epoch

    @property
    def size(self):
        """The image size of the current epoch, or None (a fixed size, the transform's own)."""
        return self.sizes(self.epoch) if self.sizes is not None else None

    def __len__(self):
        return self.n // self.world_size

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        total = len(self) * self.world_size
        size = self.size
        skip, self.skip = self.skip, 0
        for index in order[self.rank:total:self.world_size][skip:]:
            if size is None:
                yield index, sample_seed(self.seed, self.epoch, index)
            else:
                yield index, sample_seed(self.seed, self.epoch, index), size


def item_parts(item):
    """A sampler's item -> (index, sample seed or None, image size or None): a plain index (``ShardSampler``), or
    ``EpochSampler``'s (index, seed) or (index, seed, size)."""
    if not isinstance(item, tuple):
        return item, None, None
    return (tuple(item) + (None,))[:3]


class ShardSampler(torch.utils.data.Sampler):
    """Strided shard of range(n): each index on exactly one rank."""

    def __init__(self, n, rank=0, world_size=1):
        self.indices = list(range(rank, n, world_size))

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        return iter(self.indices)


def dataloader(dataset, batch, sampler, workers, pin_memory, drop_last, collate_fn=None,
               pin_memory_device=None):
    kwargs = {}
    if pin_memory and pin_memory_device:
        kwargs["pin_memory_device"] = pin_memory_device  # a device other than CUDA, on torch < 2.8
    if workers > 0:
        # at least 4 batches under way per process (DataLoader's default 2 per worker leaves a lone worker
        # with 2): a slow file or a busy core then does not stall the step
        kwargs.update(persistent_workers=True, prefetch_factor=max(2, int(math.ceil(4.0 / workers))))
        kwargs["worker_init_fn"] = lifeline.worker_init()  # the workers end with this process, however it ends
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch, sampler=sampler, num_workers=workers,
        pin_memory=pin_memory, drop_last=drop_last, **kwargs)
