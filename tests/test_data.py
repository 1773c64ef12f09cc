"""Data layer units: class maps, layouts, padded sharded validation, seeded sampling, bad images."""
import os

import pytest
import torch

from conftest import ONCE, STACK
from trainer import data
from trainer.errors import DataError

pytestmark = ONCE


@pytest.mark.parametrize("n", [1, 10, 23, 37, 100])
@pytest.mark.parametrize("batch", [1, 4, 7])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_padded_sharded_validation_counts_each_image_once(n, batch, world):
    class Idx(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return torch.zeros(1, dtype=torch.uint8), i

    padded = data.PaddedEvalDataset(Idx(), data.padded_length(n, batch, world), (1,))
    seen, steps = [], set()
    for rank in range(world):
        loader = torch.utils.data.DataLoader(padded, batch_size=batch,
                                             sampler=data.ShardSampler(len(padded), rank, world))
        steps.add(len(loader))
        for _, target, valid in loader:
            assert target.shape[0] == batch  # fixed shapes everywhere
            seen.extend(target[valid].tolist())
    assert sorted(seen) == list(range(n))
    assert len(steps) == 1  # every rank runs the same number of steps (same collectives)


def test_epoch_sampler_shards_disjoint_and_reproducible():
    a = [list(data.EpochSampler(50, seed=7, rank=r, world_size=3)) for r in range(3)]
    flat = [i for part in a for i, _ in part]
    assert len(flat) == len(set(flat)) == 48
    again = list(data.EpochSampler(50, seed=7, rank=1, world_size=3))
    assert again == a[1]
    s = data.EpochSampler(50, seed=7)
    s.set_epoch(1)
    assert list(s) != list(data.EpochSampler(50, seed=7))


@pytest.mark.timeout(60)
def test_epoch_sampler_hands_out_the_epochs_size_with_the_same_order_and_seeds():
    sizes = data.ResolutionSchedule(32, 96, 0, 2)
    plain, sized = data.EpochSampler(20, seed=7, rank=1, world_size=2), data.EpochSampler(20, 7, 1, 2, sizes)
    for epoch, size in ((0, 32), (1, 64), (2, 96), (5, 96)):
        plain.set_epoch(epoch)
        sized.set_epoch(epoch)
        assert sized.size == size and plain.size is None
        assert list(sized) == [item + (size,) for item in plain]
    assert [data.samplers.item_parts(i) for i in (4, (4, 9), (4, 9, 64))] == [(4, None, None), (4, 9, None),
                                                                               (4, 9, 64)]
    crop = data.train_transform(32)
    assert crop.at(None) is crop and crop.at(32) is crop and crop.at(64).size == 64 and crop.at(64) is crop.at(64)


@STACK
def test_seeded_augmentation_is_independent_of_worker_count(shapes):
    classes = data.find_classes(os.path.join(shapes, "train"))
    samples = data.scan_train(os.path.join(shapes, "train"), classes)[:12]
    ds = data.ImageDataset(samples, data.train_transform(24))
    sampler = data.EpochSampler(len(ds), seed=3)
    batches = []
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers)
        batches.append(torch.cat([x for x, _ in loader]))
    assert batches[0].dtype == torch.uint8  # workers return uint8; normalised on the device
    assert torch.equal(batches[0], batches[1])


def test_hidden_folders_ignored_and_val_uses_train_class_map(tmp_path):
    from tools.make_dataset import draw
    import numpy as np
    rng = np.random.default_rng(0)
    for split, classes in (("train", ["b", "a", ".cache"]), ("val", ["a", "b", ".ipynb_checkpoints"])):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            draw("disc", 16, rng).save(str(tmp_path / split / c / "x.JPEG"))
    classes = data.find_classes(str(tmp_path / "train"))
    assert classes == ["a", "b"]
    val = data.scan_val(str(tmp_path / "val"), {"a": 0, "b": 1})
    assert sorted(t for _, t in val) == [0, 1]


def test_tiny_imagenet_layout(tiny_layout):
    classes = data.find_classes(os.path.join(tiny_layout, "train"))
    train = data.scan_train(os.path.join(tiny_layout, "train"), classes)
    val = data.scan_val(os.path.join(tiny_layout, "val"), {c: i for i, c in enumerate(classes)})
    assert len(classes) == 4 and len(train) == 48 and len(val) == 20
    assert all(os.path.isfile(p) for p, _ in val)
    assert data.is_tiny_imagenet_val(os.path.join(tiny_layout, "val"))


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0 truncated jpeg", b"not an image at all"])
def test_corrupt_image_names_the_file(tmp_path, content):
    bad = tmp_path / "bad.JPEG"
    bad.write_bytes(content)
    ds = data.ImageDataset([(str(bad), 0)], data.val_transform(8, 8))
    with pytest.raises(data.BadImageError) as err:
        ds[0]
    assert str(bad) in str(err.value) and isinstance(err.value, DataError)


def test_truncated_real_jpeg(tmp_path, shapes):
    src = os.path.join(shapes, "train", sorted(os.listdir(os.path.join(shapes, "train")))[0])
    first = os.path.join(src, sorted(os.listdir(src))[0])
    raw = open(first, "rb").read()
    bad = tmp_path / "cut.JPEG"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(data.BadImageError, match="cut.JPEG"):
        data.load_rgb(str(bad))
