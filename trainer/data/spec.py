"""What a data backend is given (LoaderSpec) and what the data says about itself (DataInfo)."""
import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """One rank's loaders: the batch, its place in the job, the workers, the crops (``data.build`` fills it
    from the run's config; tools and benches make their own)."""
    batch_per_rank: int
    rank: int = 0
    world_size: int = 1
    workers: int = 0
    seed: int = 0
    train_crop_size: int = 224
    crop_scale_min: float = 0.08
    val_resize_size: int = 256
    val_crop_size: int = 224
    channels_last: bool = False
    decode: Optional[Callable] = None  # the device's JPEG decoder (device backend only)


class DataInfo:
    def __init__(self, num_classes, classes, train_images, val_images, layout, backend="synthetic", note=None):
        self.num_classes = num_classes
        self.classes = classes
        self.train_images = train_images
        self.val_images = val_images
        self.layout = layout
        self.backend = backend  # cpu | gpu | synthetic
        self.note = note
