#!/usr/bin/env python3
"""Which --amp dtype is fastest on this device: bare forward/backward/step loops (no data pipeline) of
ResNet50 and ShuffleNetV2 x1.0 (NPU form) in float32, bfloat16 and float16 (+ loss scaler), each with the
optimizer the device layer pairs with it, channels-last, cudnn autotuning off and on (where cudnn is there),
beside what `--amp` (auto) would train in: on a device that measures its choice (a CPU: trainer/precision/amp_probe.py),
the probe's verdict, both its rates and its cost, for the same model at the same size.

    python3 -m bench.amp_dtype [--device auto] [--model ARCH:BATCH ...] [--dtypes float32,bfloat16,float16]
                               [--steps 40] [--warmup 15] [--rounds 2] [--probes 1] [--size 224] [--json FILE]

All loops run in this one process and are repeated --rounds times in turn (A B C A B C), so drift of the
machine shows as a spread; the report gives images/s per loop (mean of rounds, min-max) and each dtype's
ratio to float32 (and float16's to bfloat16 where both ran). A CPU row (docs/BENCHMARKS.md):
`python3 -m bench.amp_dtype --device cpu --model resnet18:32 --dtypes float32,bfloat16 --steps 6 --warmup 2`.
"""
import argparse
import json
import os
import sys

import torch

import models
from tools._battery import auto_choice, bare_loop, describe_auto
from trainer.precision.amp_probe import load_average
from trainer.device import Device

MODELS = (("resnet50", 256), ("shufflenet_v2_x1_0_npu", 1024))
DTYPES = {"float32": None, "bfloat16": "bfloat16", "float16": "float16"}


def parse_model(text):
    arch, _, batch = text.partition(":")
    if not models.known(arch) or not batch.isdigit() or int(batch) < 1:
        raise argparse.ArgumentTypeError("--model ARCH:BATCH (a known arch, a batch of at least 1), got '{}'"
                                         .format(text))
    return arch, int(batch)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", type=parse_model, action="append", default=None, metavar="ARCH:BATCH",
                   help="a model and its batch (repeatable; default: resnet50:256 and shufflenet_v2_x1_0_npu:1024)")
    p.add_argument("--dtypes", default="float32,bfloat16,float16",
                   help="comma-separated loops to run, of: " + ", ".join(DTYPES))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--probes", type=int, default=1,
                   help="measure --amp's verdict this many times per model (how stable it is on this machine)")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not names or any(d not in DTYPES for d in names):
        p.error("--dtypes: choose from {}, got '{}'".format(", ".join(DTYPES), args.dtypes))
    device = Device.create(args.device)
    cudnn = getattr(torch.backends, "cudnn", None)
    autotune = (False, True) if cudnn is not None and cudnn.is_available() and torch.cuda.is_available() else (False,)
    results = []
    load = [load_average()]
    for arch, batch in args.model or MODELS:
        for bench in autotune:
            if cudnn is not None:
                cudnn.benchmark = bench
            runs = {name: [] for name in names}
            for _ in range(args.rounds):
                for name in names:
                    runs[name].append(bare_loop(device, arch, batch, args.size, args.steps, args.warmup, DTYPES[name]))
            row = {"arch": arch, "batch": batch, "cudnn_benchmark": bench,
                   "fps": {k: sum(v) / len(v) for k, v in runs.items()}, "runs": runs,
                   "auto": auto_choice(device, arch, batch, args.size)}
            row["probes"] = [row["auto"]] + [auto_choice(device, arch, batch, args.size)
                                             for _ in range(args.probes - 1)]
            if "float16" in runs and "bfloat16" in runs:
                row["fp16_over_bf16"] = row["fps"]["float16"] / row["fps"]["bfloat16"]
            base = row["fps"].get("float32")
            results.append(row)
            print("{:<24} bs {:>4} cudnn.benchmark {:<5} | ".format(arch, batch, str(bench)) + " | ".join(
                "{} {:>7.1f} img/s ({:.1f}-{:.1f}{})".format(
                    k, row["fps"][k], min(runs[k]), max(runs[k]),
                    ", x{:.2f}".format(row["fps"][k] / base) if base else "") for k in runs)
                + ("" if "fp16_over_bf16" not in row else " | fp16/bf16 {:.3f}".format(row["fp16_over_bf16"]))
                + " | " + " | ".join(describe_auto(a) for a in row["probes"]), flush=True)
    load.append(load_average())
    if None not in load:  # other processes' share of the cores, which the rounds' spread reflects
        print("load average {:.1f} at the start, {:.1f} at the end ({} cores)".format(load[0], load[1],
                                                                                  os.cpu_count()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "torch": torch.__version__, "load_average": load, "results": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
