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
    """One rank's loaders: the batch, its place in the job, the workers, the crops (``data.build`` fills it
    from the run's config; tools and benches make their own).

    The device backend's two ways of working, each None for the device's own choice: ``decode_ahead``
    (prepare the next batch in a thread beside the training step; ``Device.decode_ahead``) and
    ``batched_crops`` (crop and resize a batch in one roi_align call rather than image by image;
    ``not Device.crops_per_image``)."""
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
    decode_ahead: Optional[bool] = None  # device backend only; None: Device.decode_ahead
    batched_crops: Optional[bool] = None  # device backend only; None: not Device.crops_per_image
    train_sizes: Optional[Callable] = None  # epoch -> training size (a resolution schedule); None: train_crop_size


class DataInfo:
    def __init__(self, num_classes, classes, train_images, val_images, layout, backend="synthetic", note=None):
        self.num_classes = num_classes
        self.classes = classes
        self.train_images = train_images
        self.val_images = val_images
        self.layout = layout
        self.backend = backend  # cpu | gpu | synthetic
        self.note = note
