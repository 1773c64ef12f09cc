"""What a data backend is given (LoaderSpec) and what the data says about itself (DataInfo)."""
import dataclasses
from typing import Callable, NamedTuple, Optional


class Sampling(NamedTuple):
    """One rank's share of the data: its batch, its place in the job, its loader workers, the seed of the shuffle."""
    batch_per_rank: int
    rank: int = 0
    world_size: int = 1
    workers: int = 0
    seed: int = 0


# the crops' defaults: the flags' (trainer/flags.py's DataConfig) and a LoaderSpec's that tools and benches make
TRAIN_CROP_SIZE, CROP_SCALE_MIN, VAL_RESIZE_SIZE, VAL_CROP_SIZE = 224, 0.08, 256, 224


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """One rank's loaders (``data.build`` fills it from the run's config; tools and benches make their own)."""
    batch_per_rank: int
    rank: int = 0
    world_size: int = 1
    workers: int = 0
    seed: int = 0
    train_crop_size: int = TRAIN_CROP_SIZE
    crop_scale_min: float = CROP_SCALE_MIN
    val_resize_size: int = VAL_RESIZE_SIZE
    val_crop_size: int = VAL_CROP_SIZE
    channels_last: bool = False
    decode: Optional[Callable] = None  # the device's JPEG decoder (device backend only)
    decode_ahead: Optional[bool] = None  # device backend: prepare the next batch in a thread; None: the device's
    batched_crops: Optional[bool] = None  # device backend: one roi_align call per batch; None: the device's
    train_sizes: Optional[Callable] = None  # epoch -> training size (a resolution schedule); None: train_crop_size


class DataInfo:
    def __init__(self, num_classes, classes, train_images, val_images, layout, backend="synthetic", note=None):
        self.num_classes, self.classes, self.layout, self.note = num_classes, classes, layout, note
        self.train_images, self.val_images, self.backend = train_images, val_images, backend  # cpu | gpu | synthetic
