#!/usr/bin/env python3
"""Do the two data backends train alike? The same short training run fed by each, over several seeds.

    python3 -m bench.backend_accuracy [--device auto|cuda|npu|cpu] [--small] [--seeds 0 1 2]
                                      [--full] [--per-image] [--work-dir DIR] [--json FILE]

The run is ``tools/check_device.py``'s train-fp32 (resnet18 on 10 classes of generated 64-px JPEGs, 56-px
crops, 6 epochs; on a CPU, unless --full, its tiny model on 32-px images, 3 epochs), once per
seed with ``--data-backend cpu`` and once with ``--data-backend gpu``. On a CPU the device backend runs its
batched roi_align crops, as on an accelerator (``LoaderSpec.batched_crops``); --per-image adds its
CPU default (torch's uint8 resize image by image: the CPU backend's filter, libjpeg decode through
torchvision) so that a gap can be told apart as the filter's or the decoder's.

Each trained model is also validated through the cpu backend's pipeline (``-e``): the same model on the
same images, so any difference is the pipelines'. Reported: final Acc@1 (own pipeline and cpu's) and
last-epoch training loss of every run, and per backend their mean and the spread between seeds; the
backends train alike when the gap between their means is within the seeds' own spread. Last, how far the
two backends' training crops are apart for the same seed (grey levels, and each one's sharpness).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

from tools import check_device
from trainer import data as datamod
from trainer.device import Device
from trainer.device_names import DEVICE_DECODE, HOST_DECODE


def crop_difference(root, sizes, device, batches=8, batch=32):
    """How far the two backends' training crops are apart, pixel for pixel, for the same seed (the first
    ``batches`` batches of epoch 0): mean |difference|, mean signed difference and each one's sharpness
    (mean absolute horizontal gradient), in grey levels."""
    opt = lambda name: sizes.crop[sizes.crop.index(name) + 1]  # noqa: E731  (the runs' crop options)
    train_dir = os.path.join(root, "train")
    classes = datamod.find_classes(train_dir)
    samples = datamod.scan_train(train_dir, classes)
    val = datamod.scan_val(os.path.join(root, "val"), {c: i for i, c in enumerate(classes)})

    def crops(backend):
        backend, decode, _ = datamod.resolve_backend(backend, device)
        spec = datamod.LoaderSpec(batch_per_rank=batch, seed=0, train_crop_size=int(opt("--train-crop-size")),
                                  crop_scale_min=float(opt("--crop-scale-min")),
                                  val_resize_size=int(opt("--val-resize-size")),
                                  val_crop_size=int(opt("--val-crop-size")), decode=decode, batched_crops=True)
        train, _ = datamod.BACKENDS[backend](spec, device, samples, val)
        train.sampler.set_epoch(0)
        out = []
        for i, b in enumerate(train):
            out.append(b[0].float().cpu())
            if i + 1 == batches:
                break
        return torch.cat(out)
    a, b = crops(HOST_DECODE), crops(DEVICE_DECODE)
    sharp = lambda x: float((x[..., 1:] - x[..., :-1]).abs().mean())  # noqa: E731
    return {"images": a.shape[0], "mean_abs": float((a - b).abs().mean()), "mean": float((b - a).mean()),
            "sharpness_cpu": sharp(a), "sharpness_gpu": sharp(b)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--small", action="store_true", help="the tiny model (default on a CPU)")
    p.add_argument("--full", action="store_true", help="resnet18 at 64 px even on a CPU")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--per-image", action="store_true",
                   help="on a CPU, also the device backend's own CPU crops (gpu-per-image)")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    device = Device.create(a.device)
    sizes = check_device.Sizes(a.small or (device.kind == "cpu" and not a.full))
    work = a.work_dir or tempfile.mkdtemp(prefix="backend-accuracy-")
    battery = check_device.Battery(device, work, sizes, print)
    per_image = DEVICE_DECODE + "-per-image"  # the device backend with its own crops (image by image on a CPU)
    backends = [HOST_DECODE, DEVICE_DECODE] + ([per_image] if a.per_image and device.kind == "cpu" else [])
    runs = {b: [] for b in backends}
    print("device {}, {} on {}-px images, seeds {}".format(device.name, sizes.train_arch, sizes.image, a.seeds))
    for seed in a.seeds:
        for b in backends:
            common = [battery.dataset(), "-a", sizes.train_arch] + battery.base()
            common[common.index("--seed") + 1] = str(seed)
            out = os.path.join(work, "{}-seed{}".format(b, seed))
            code, s, losses = check_device.train_in_process(
                out, common + sizes.train_args + ["--data-backend", b.split("-")[0]], batched=b != per_image)
            if code != 0 or s.get("status") != "ok":
                raise SystemExit("{} seed {}: exit {}, status {} (log: {}.log)".format(b, seed, code, s.get("status"),
                                                                                     out))
            run = {"seed": seed, "acc1": s["final_acc1"], "loss": losses[-1], "losses": losses}
            if b != HOST_DECODE:  # the same model on the same images through the cpu backend's pipeline
                code, e, _ = check_device.train_in_process(out + "-val-cpu", common + [
                    "-e", "--resume", os.path.join(out, "checkpoint.pth.tar"), "--data-backend", HOST_DECODE])
                run["acc1_through_cpu"] = e.get("final_acc1")
            runs[b].append(run)
            print("seed {} {:<14} Acc@1 {:5.1f} %{}  last-epoch loss {:.3f}".format(
                seed, b, s["final_acc1"], " ({:.1f} % through cpu)".format(run["acc1_through_cpu"])
                if "acc1_through_cpu" in run else "", losses[-1]), flush=True)
    summary = {}
    print("\n| backend | Acc@1 per seed | mean | spread (max - min) | through cpu's validation, mean | "
          "last-epoch loss, mean |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for b, rs in runs.items():
        accs = [r["acc1"] for r in rs]
        through = statistics.mean(r.get("acc1_through_cpu", r["acc1"]) for r in rs)
        summary[b] = {"acc1_mean": statistics.mean(accs), "acc1_spread": max(accs) - min(accs),
                      "acc1_through_cpu_mean": through, "loss_mean": statistics.mean(r["loss"] for r in rs),
                      "runs": rs}
        print("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.3f} |".format(
            b, ", ".join("{:.1f}".format(x) for x in accs), summary[b]["acc1_mean"], summary[b]["acc1_spread"],
            through, summary[b]["loss_mean"]))
    gap = abs(summary[DEVICE_DECODE]["acc1_mean"] - summary[HOST_DECODE]["acc1_mean"])
    spread = max(v["acc1_spread"] for v in summary.values())
    print("gap between the cpu and gpu backends' mean Acc@1: {:.1f} points; largest spread between seeds: {:.1f}"
          .format(gap, spread))
    diff = crop_difference(battery.dataset(), sizes, device)
    print("training crops, gpu against cpu ({images} crops, seed 0): mean |difference| {mean_abs:.2f} grey levels, "
          "mean difference {mean:+.2f}; sharpness cpu {sharpness_cpu:.2f}, gpu {sharpness_gpu:.2f}".format(**diff))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": device.name, "arch": sizes.train_arch, "image": sizes.image, "seeds": a.seeds,
                       "backends": summary, "gap": gap, "seed_spread": spread, "crop_difference": diff}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
