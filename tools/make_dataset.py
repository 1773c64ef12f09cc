#!/usr/bin/env python3
"""Generate a small, learnable image-classification data set, or write out a small real one.

Ten classes of procedurally drawn shapes (disc, square, triangle, cross, ring,
horizontal stripes, vertical stripes, diagonal bar, checkerboard, dot grid) in random
colours, positions and sizes over a noisy background, saved as JPEG files.

    python3 -m tools.make_dataset OUT [--classes 10] [--train-per-class 100] [--val-per-class 20]
                                      [--size 64] [--layout imagenet|tiny-imagenet] [--seed 0] [--photos]
                                      [--digits [--val-fraction 0.2]]

--photos makes photo-like JPEGs of ImageNet's sizes instead, for data-pipeline benchmarks: each file is a
random crop (30-100 % of the side) of a photograph that ships with an installed package (matplotlib's
sample photo, and any other JPEG photo found there), flipped at random, colour-scaled per channel, with
light noise, resized to a random ImageNet-like size and saved at quality 90. Sizes: 90 % have a longest
side of 375-500 px (aspect 4:3, 3:2 or 1:1, landscape or portrait; ImageNet's typical 500x375 / 500x333),
10 % 800-1200 px (ImageNet's tail of large photos). --size is ignored. No download is needed.

--digits writes real images instead: scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``,
UCI's optical digits: 1,797 scans of 8x8 pixels with 17 grey levels, 10 classes; shipped inside the package, so no
download is needed; ``pip install scikit-learn``). Each scan is scaled to 0-255, enlarged to --size px (bicubic)
and saved as a greyscale PNG named after its index in the data set. The split is stratified and fixed by --seed:
in each class, round(--val-fraction x the class's count) images, drawn at random, go to val/, the rest to
train/ (0.2 and seed 0: 1,438 train and 359 val). --classes, --train-per-class and --val-per-class are ignored.

imagenet layout:      OUT/train/<class>/*.JPEG, OUT/val/<class>/*.JPEG
tiny-imagenet layout: OUT/train/<wnid>/images/*.JPEG, OUT/val/images/*.JPEG + OUT/val/val_annotations.txt
"""
if not __package__:  # python3 tools/make_dataset.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require(("numpy", "PIL"))  # numpy and Pillow, or one line naming the Python that has them
import argparse
import os
import sys

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("disc", "square", "triangle", "cross", "ring", "hstripes", "vstripes", "diagonal", "checker", "dots")


def wnid(k):
    return "n{:08d}".format(1000 + k)


def draw(shape, size, rng):
    bg = rng.integers(0, 256, size=3)
    noise = rng.normal(0, 24, size=(size, size, 3))
    arr = np.clip(np.ones((size, size, 3)) * bg + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(arr)
    d = ImageDraw.Draw(img)
    fg = tuple(int(v) for v in (bg + rng.integers(96, 160, size=3)) % 256)
    s = int(size * rng.uniform(0.35, 0.6))
    x0 = int(rng.integers(0, size - s))
    y0 = int(rng.integers(0, size - s))
    x1, y1 = x0 + s, y0 + s
    w = max(2, s // 6)
    if shape == "disc":
        d.ellipse([x0, y0, x1, y1], fill=fg)
    elif shape == "square":
        d.rectangle([x0, y0, x1, y1], fill=fg)
    elif shape == "triangle":
        d.polygon([(x0, y1), (x1, y1), ((x0 + x1) // 2, y0)], fill=fg)
    elif shape == "cross":
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        d.rectangle([x0, cy - w, x1, cy + w], fill=fg)
        d.rectangle([cx - w, y0, cx + w, y1], fill=fg)
    elif shape == "ring":
        d.ellipse([x0, y0, x1, y1], outline=fg, width=w)
    elif shape == "hstripes":
        for y in range(0, size, 2 * w):
            d.rectangle([0, y, size, y + w - 1], fill=fg)
    elif shape == "vstripes":
        for x in range(0, size, 2 * w):
            d.rectangle([x, 0, x + w - 1, size], fill=fg)
    elif shape == "diagonal":
        d.line([(x0, y0), (x1, y1)], fill=fg, width=w)
    elif shape == "checker":
        c = max(3, size // 8)
        for i in range(0, size, c):
            for j in range(0, size, c):
                if (i // c + j // c) % 2 == 0:
                    d.rectangle([i, j, i + c - 1, j + c - 1], fill=fg)
    elif shape == "dots":
        step = max(6, size // 5)
        r = max(1, step // 4)
        for i in range(step // 2, size, step):
            for j in range(step // 2, size, step):
                d.ellipse([i - r, j - r, i + r, j + r], fill=fg)
    return img


def _source_photos():
    """Photographs shipped with installed packages (RGB PIL images, at least 256 px on the short side)."""
    found = []
    try:
        import matplotlib
        folder = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data")
        for name in sorted(os.listdir(folder)):
            if name.lower().endswith((".jpg", ".jpeg")):
                found.append(os.path.join(folder, name))
    except ImportError:
        pass
    photos = []
    for path in found:
        img = Image.open(path).convert("RGB")
        if min(img.size) >= 256:
            photos.append(img)
    if not photos:
        raise ValueError("--photos needs a photograph from an installed package (matplotlib's sample data): "
                         "pip install matplotlib")
    return photos


def photo(sources, rng, k):
    src = sources[int(rng.integers(0, len(sources)))]
    w, h = src.size
    side = rng.uniform(0.3, 1.0)
    cw, ch = max(32, int(w * side)), max(32, int(h * side * rng.uniform(0.8, 1.2)))
    cw, ch = min(cw, w), min(ch, h)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = src.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    longest = int(rng.integers(375, 501)) if rng.random() < 0.9 else int(rng.integers(800, 1201))
    aspect = (4 / 3.0, 3 / 2.0, 1.0)[int(rng.integers(0, 3))]
    size = (longest, int(round(longest / aspect)))
    if rng.random() < 0.3:
        size = size[::-1]
    img = img.resize(size, Image.BILINEAR)
    arr = np.asarray(img).astype(np.float32)
    gain = rng.uniform(0.75, 1.25, size=3) * (1.0 + 0.05 * (k % 7))  # the class shifts the colour a little
    arr = arr * gain + rng.normal(0, 3.0, size=arr.shape)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def load_digits():
    """(images, labels): scikit-learn's bundled digits, float arrays (N, 8, 8) with values 0-16 and int labels."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ValueError("--digits needs scikit-learn, whose package ships the digits: pip install scikit-learn")
    d = sklearn_digits()
    return d.images, d.target


def stratified_split(labels, val_fraction, seed):
    """(train, val): sorted index arrays; in each class, round(val_fraction x its count) indices drawn at random
    (numpy's generator seeded with ``seed``, classes in increasing order) go to val."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, val = [], []
    for k in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == k))
        n_val = int(round(val_fraction * len(members)))
        val.append(members[:n_val])
        train.append(members[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def write_digits(out, images, labels, size=64, val_fraction=0.2, seed=0, layout="imagenet"):
    """Write ``images`` (N, h, w; values 0-16, as the digits hold them) of ``labels`` as an image folder of
    greyscale PNGs enlarged to ``size`` px, split by ``stratified_split``. Returns {"train": n, "val": n}."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError("--val-fraction must be between 0 and 1 (exclusive)")
    images, labels = np.asarray(images, dtype=np.float64), np.asarray(labels)
    top = max(16.0, float(images.max()))
    train, val = stratified_split(labels, val_fraction, seed)
    annotations = []
    for split, indices in (("train", train), ("val", val)):
        for i in indices:
            name = wnid(int(labels[i]))
            if split == "train":
                folder = os.path.join(out, "train", name, "images") if layout == "tiny-imagenet" else \
                    os.path.join(out, "train", name)
            else:
                folder = os.path.join(out, "val", "images") if layout == "tiny-imagenet" else \
                    os.path.join(out, "val", name)
            os.makedirs(folder, exist_ok=True)
            fname = "{}_{:04d}.png".format(name, int(i))
            pixels = np.clip(np.rint(images[i] * (255.0 / top)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).resize((size, size), Image.BICUBIC).save(os.path.join(folder, fname))
            if split == "val":
                annotations.append((fname, name))
    if layout == "tiny-imagenet":
        with open(os.path.join(out, "val", "val_annotations.txt"), "w") as f:
            for fname, name in annotations:
                f.write("{}\t{}\t0\t0\t{}\t{}\n".format(fname, name, size, size))
    return {"train": len(train), "val": len(val)}


def digits(out, size=64, val_fraction=0.2, seed=0, layout="imagenet"):
    """scikit-learn's digits written by ``write_digits``."""
    images, labels = load_digits()
    return write_digits(out, images, labels, size, val_fraction, seed, layout)


def generate(out, classes=10, train_per_class=100, val_per_class=20, size=64, layout="imagenet", seed=0,
             photos=False):
    if classes < 1 or (classes > len(SHAPES) and not photos):
        raise ValueError("--classes must be 1-{}".format(len(SHAPES)))
    rng = np.random.default_rng(seed)
    if photos:
        sources = _source_photos()
        draw_one = lambda k: photo(sources, rng, k)  # noqa: E731
    else:
        draw_one = lambda k: draw(SHAPES[k], size, rng)  # noqa: E731
    annotations = []
    for k in range(classes):
        name = wnid(k)
        tdir = os.path.join(out, "train", name, "images") if layout == "tiny-imagenet" else \
            os.path.join(out, "train", name)
        os.makedirs(tdir, exist_ok=True)
        for i in range(train_per_class):
            draw_one(k).save(os.path.join(tdir, "{}_{}.JPEG".format(name, i)), quality=90)
        if layout == "tiny-imagenet":
            vdir = os.path.join(out, "val", "images")
        else:
            vdir = os.path.join(out, "val", name)
        os.makedirs(vdir, exist_ok=True)
        for i in range(val_per_class):
            fname = "val_{}_{}.JPEG".format(k, i)
            draw_one(k).save(os.path.join(vdir, fname), quality=90)
            annotations.append((fname, name))
    if layout == "tiny-imagenet":
        with open(os.path.join(out, "val", "val_annotations.txt"), "w") as f:
            for fname, name in annotations:
                f.write("{}\t{}\t0\t0\t{}\t{}\n".format(fname, name, size, size))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=100)
    p.add_argument("--val-per-class", type=int, default=20)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--layout", choices=("imagenet", "tiny-imagenet"), default="imagenet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--photos", action="store_true",
                   help="photo-like JPEGs of ImageNet's sizes (for data-pipeline benchmarks); --size is ignored")
    p.add_argument("--digits", action="store_true",
                   help="scikit-learn's real 8x8 digit scans, enlarged to --size px, as PNGs, split stratified by "
                        "--seed; --classes and the per-class counts are ignored")
    p.add_argument("--val-fraction", type=float, default=0.2, help="--digits: the share of each class in val/")
    a = p.parse_args(argv)
    if os.path.exists(a.out) and os.listdir(a.out):
        sys.stderr.write("error: '{}' exists and is not empty; choose a new folder\n".format(a.out))
        return 2
    for name in ("classes", "train_per_class", "val_per_class", "size"):
        if getattr(a, name) < 1:
            sys.stderr.write("error: --{} must be at least 1\n".format(name.replace("_", "-")))
            return 2
    if a.digits and a.photos:
        sys.stderr.write("error: --digits and --photos are two different sources; give one\n")
        return 2
    if not 0.0 < a.val_fraction < 1.0:
        sys.stderr.write("error: --val-fraction must be between 0 and 1 (exclusive)\n")
        return 2
    try:
        if a.digits:
            digits(a.out, a.size, a.val_fraction, a.seed, a.layout)
        else:
            generate(a.out, a.classes, a.train_per_class, a.val_per_class, a.size, a.layout, a.seed, a.photos)
    except ValueError as exc:
        sys.stderr.write("error: {}\n".format(exc))
        return 2
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
