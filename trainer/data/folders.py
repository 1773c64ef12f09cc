"""Image folders: the ImageNet or tiny-imagenet layout, classes sorted, every problem named with its fix."""
import os

from trainer.errors import DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _visible_dirs(path):
    return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _images_under(path):
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS):
                yield os.path.join(root, name)


def is_tiny_imagenet_val(val_dir):
    return (os.path.isfile(os.path.join(val_dir, "val_annotations.txt"))
            and os.path.isdir(os.path.join(val_dir, "images")))


def check_data_root(root, need_train=True):
    if not os.path.exists(root):
        raise DataError("data directory '{}' does not exist".format(root))
    if not os.path.isdir(root):
        raise DataError("data path '{}' is not a directory".format(root))
    if not os.listdir(root):
        raise DataError("data directory '{}' is empty: it needs train/ and val/ subfolders".format(root))
    for sub in (("train", "val") if need_train else ("val",)):
        if not os.path.isdir(os.path.join(root, sub)):
            raise DataError("data directory '{}' has no {}/ folder (expected {}/train/<class>/*.JPEG "
                            "and {}/val/<class>/*.JPEG)".format(root, sub, root, root))


def check_layout(root, need_train=True):
    """The sorted classes of ``root``, checked as a run reads it without reading an image; each problem a DataError."""
    check_data_root(root, need_train)
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = find_classes(train_dir if os.path.isdir(train_dir) else val_dir)
    if need_train:
        for name in classes:
            if next(_images_under(os.path.join(train_dir, name)), None) is None:
                raise _no_images(os.path.join(train_dir, name))
    scan_val(val_dir, {c: i for i, c in enumerate(classes)})
    return classes


def _no_images(folder):
    return DataError("class folder '{}' holds no images ({})".format(folder, "/".join(IMG_EXTENSIONS)))


def find_classes(train_dir):
    classes = _visible_dirs(train_dir)
    if not classes:
        raise DataError("'{}' holds no class folders".format(train_dir))
    return classes


def count_train(train_dir, classes, at_most):
    """The images of train/'s ``classes``, counted up to ``at_most`` (where the walk stops)."""
    n = 0
    for name in classes:
        n += len(list(_images_under(os.path.join(train_dir, name))))
        if n >= at_most:
            return at_most
    return n


def scan_train(train_dir, classes):
    samples = []
    for idx, name in enumerate(classes):
        files = list(_images_under(os.path.join(train_dir, name)))
        if not files:
            raise _no_images(os.path.join(train_dir, name))
        samples.extend((f, idx) for f in files)
    return samples


def scan_val(val_dir, class_to_idx):
    """Validation samples labelled with the TRAINING set's class map."""
    if is_tiny_imagenet_val(val_dir):
        return _scan_tiny_val(val_dir, class_to_idx)
    val_classes = _visible_dirs(val_dir)
    missing = sorted(set(class_to_idx) - set(val_classes))
    extra = sorted(set(val_classes) - set(class_to_idx))
    if extra:
        raise DataError("val/ has class folder(s) not in train/: {}".format(_names(extra)))
    if missing:
        raise DataError("val/ lacks class folder(s) that train/ has: {}".format(_names(missing)))
    samples = [(f, class_to_idx[name]) for name in val_classes for f in _images_under(os.path.join(val_dir, name))]
    if not samples:
        raise DataError("'{}' holds no images".format(val_dir))
    return samples


def _scan_tiny_val(val_dir, class_to_idx):
    samples = []
    ann = os.path.join(val_dir, "val_annotations.txt")
    with open(ann) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.strip().split("\t")
            if not fields or not fields[0]:
                continue
            if len(fields) < 2:
                raise DataError("{}:{}: expected 'FILE<tab>WNID', got '{}'".format(ann, lineno, line.strip()))
            name, wnid = fields[0], fields[1]
            if wnid not in class_to_idx:
                raise DataError("{}:{}: class '{}' is not in train/".format(ann, lineno, wnid))
            path = os.path.join(val_dir, "images", name)
            if not os.path.isfile(path):
                raise DataError("{}:{}: image '{}' does not exist".format(ann, lineno, path))
            samples.append((path, class_to_idx[wnid]))
    if not samples:
        raise DataError("'{}' lists no images".format(ann))
    return samples


def _names(names, limit=5):
    shown = ", ".join(names[:limit])
    return shown + (" and {} more".format(len(names) - limit) if len(names) > limit else "")
