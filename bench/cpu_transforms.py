#!/usr/bin/env python3
"""The CPU backend's parts, one thread, interleaved rounds: where a sample's and a batch's time goes.

    python3 -m bench.cpu_transforms DATA [--images 300] [--batch-size 32] [--rounds 4] [--json FILE]

Per sample (ms, on DATA/train's first --images files, bytes already in memory):
  torchvision   RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize on a PIL image
  pil-resize    this backend's TrainCrop with PIL's resize(box=...)
  torch-resize  this backend's TrainCrop with torch's uint8 antialiased resize (what it uses on torch >= 2.1
                unless PIL is pillow-simd)
Per batch (ms, --batch-size crops of 224 px):
  collate-nchw / collate-nhwc   default_collate of the crops, and channels_last_collate
  normalize-nchw-to-cl          the NCHW batch normalised, then made channels-last (the path before
                                channels_last_collate)
  normalize-cl-rows             the channels-last batch normalised through its NHWC rows
Each figure is the median over rounds; the candidates of a group alternate within each round.
"""
import argparse
import glob
import io
import json
import os
import statistics
import sys
import time

import torch
from PIL import Image
from torch.utils.data._utils.collate import default_collate

from trainer import data
from trainer import device as devmod
from trainer.data import images
from trainer.device import shims


def _timed(fn, n):
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from torchvision import transforms
    files = sorted(glob.glob(os.path.join(a.data, "train", "*", "*")))[:a.images]
    if not files:
        raise SystemExit("error: no images under {}/train/<class>/".format(a.data))
    raws = [open(f, "rb").read() for f in files]
    crop = data.TrainCrop(224)
    tv = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(data.MEAN, data.STD)])
    torch_ok = devmod.uint8_antialias_resize()

    def ours(use_torch):
        def run(i):
            shims._UINT8_RESIZE[:] = [use_torch]
            images._PIL_SIMD[:] = [False]
            crop(data.open_image(raws[i], files[i]), files[i], data.sample_rng(i))
        return run

    samples = {"torchvision": lambda i: tv(Image.open(io.BytesIO(raws[i])).convert("RGB")),
               "pil-resize": ours(False)}
    if torch_ok:
        samples["torch-resize"] = ours(True)
    n = a.batch_size
    crops = [crop(data.open_image(raws[i % len(raws)], "x"), "x", data.sample_rng(i)) for i in range(n)]
    items = [(c, 0) for c in crops]
    nchw = default_collate(items)[0]
    cl = data.channels_last_collate(items)[0]
    cpu = devmod.Device.create("cpu")
    to_cl, rows = data.Normalizer(cpu, channels_last=True), data.Normalizer(cpu, channels_last=True)
    batches = {"collate-nchw": lambda i: default_collate(items),
               "collate-nhwc": lambda i: data.channels_last_collate(items),
               "normalize-nchw-to-cl": lambda i: to_cl(nchw),
               "normalize-cl-rows": lambda i: rows(cl)}
    res = {}
    for r in range(a.rounds):
        for group, reps in ((samples, len(raws)), (batches, 20)):
            names = list(group)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                res.setdefault(name, []).append(_timed(group[name], reps))
    shims._UINT8_RESIZE[:] = [torch_ok]
    out = {k: statistics.median(v) for k, v in res.items()}
    print("| part | ms (median of {} rounds) |".format(a.rounds))
    print("| --- | ---: |")
    for k, v in out.items():
        print("| {} | {:.3f} |".format(k, v))
    base = out["torchvision"]
    for k in ("pil-resize", "torch-resize"):
        if k in out:
            print("torchvision / {}: {:.2f}".format(k, base / out[k]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ms": out, "runs": res, "images": len(raws), "batch_size": n, "torch": torch.__version__,
                       "pillow": Image.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
