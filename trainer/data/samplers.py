"""The epoch's training order (shuffled, sharded, a seed per sample), validation shards, the DataLoader settings."""
import math

import torch

from trainer.job import lifeline
from trainer.data.images import sample_seed


def padded_length(n, batch_per_rank, world_size):
    chunk = batch_per_rank * world_size
    return int(math.ceil(n / float(chunk))) * chunk


class EpochSampler(torch.utils.data.Sampler):
    """One epoch's shuffled, sharded order (as DistributedSampler with drop_last=True; by (seed, epoch) only): yields
    (index, sample seed[, size of ``sizes(epoch)``]), the size reaching persistent workers with their items."""

    def __init__(self, n, seed, rank=0, world_size=1, sizes=None):
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.epoch, self.sizes = 0, sizes
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
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        total = len(self) * self.world_size
        size = () if self.size is None else (self.size,)
        skip, self.skip = self.skip, 0
        for index in order[self.rank:total:self.world_size][skip:]:
            yield (index, sample_seed(self.seed, self.epoch, index)) + size


def item_parts(item):
    """A sampler's item (a plain index, or ``EpochSampler``'s) -> (index, sample seed or None, size or None)."""
    return (tuple(item) + (None,))[:3] if isinstance(item, tuple) else (item, None, None)


class ShardSampler(torch.utils.data.Sampler):
    """Strided shard of range(n): each index on exactly one rank."""

    def __init__(self, n, rank=0, world_size=1):
        self.indices = list(range(rank, n, world_size))

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        return iter(self.indices)


def dataloader(dataset, batch, sampler, workers, pin_memory, drop_last, collate_fn=None, seed=0):
    """The DataLoader (``pin_memory``: False, True, or the device to pin for where it must be named), with a
    generator of its own (the run's ``seed``): each iterator it makes draws its workers' base seed from that, never
    from torch's global RNG, which the training step draws from (dropout) and a checkpoint restores, so that
    iterating a loader, any time, with or without workers, leaves it as it was. (One
    seed, not the epoch's: persistent workers take theirs from the first iterator, a resumed run's as the
    uninterrupted run's; the samples' randomness is their own, ``sample_seed``.)"""
    kwargs = {"collate_fn": collate_fn} if collate_fn is not None else {}
    kwargs["generator"] = torch.Generator().manual_seed(seed)
    if isinstance(pin_memory, str):  # a device other than CUDA, on torch < 2.8: pin_memory_device
        pin_memory, kwargs["pin_memory_device"] = True, pin_memory
    if workers > 0:
        # >= 4 batches under way (a lone worker's default is 2): a slow file or busy core does not stall the step
        kwargs.update(persistent_workers=True, prefetch_factor=max(2, int(math.ceil(4.0 / workers))),
                      worker_init_fn=lifeline.worker_init())  # the workers end with this process
    return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                                       pin_memory=pin_memory, drop_last=drop_last, **kwargs)


def release(*loaders):
    """End the persistent workers of ``loaders`` (a backend's wrapper: the DataLoader it wraps) now. torch keeps them
    until their DataLoader is collected or the interpreter exits; in a process that goes on after a run (a tool's runs
    in process, a test) a reference cycle leaves them to a garbage collection, whose shutdown, its queues already
    finalised, waits out every worker (5 s each) before it kills them."""
    for loader in loaders:
        while loader is not None and not isinstance(loader, torch.utils.data.DataLoader):
            loader = getattr(loader, "loader", None)
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
            loader._iterator = None
