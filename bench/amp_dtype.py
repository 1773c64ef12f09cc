#!/usr/bin/env python3
"""Which --amp dtype is fastest on this device: bare forward/backward/step loops (no data pipeline) of
ResNet50 and ShuffleNetV2 x1.0 (NPU form) in float32, bfloat16 and float16 (+ loss scaler), each with the
optimizer the device layer pairs with it, channels-last, cudnn autotuning off and on.

    python3 -m bench.amp_dtype [--device auto] [--steps 40] [--warmup 15] [--rounds 2] [--json FILE]

All loops run in this one process and are repeated --rounds times in turn (A B C A B C), so drift of the
machine shows as a spread; the report gives images/s per loop (mean of rounds, min-max) and each dtype's
ratio to float32 and float16's ratio to bfloat16.
"""
import argparse
import json
import sys

import torch

from tools.check_device import bare_loop
from trainer.device import Device

MODELS = (("resnet50", 256), ("shufflenet_v2_x1_0_npu", 1024))
DTYPES = ((None, "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = Device.create(args.device)
    cudnn = getattr(torch.backends, "cudnn", None)
    results = []
    for arch, batch in MODELS:
        for bench in (False, True):
            if cudnn is not None:
                cudnn.benchmark = bench
            runs = {name: [] for _, name in DTYPES}
            for _ in range(args.rounds):
                for dtype, name in DTYPES:
                    runs[name].append(bare_loop(device, arch, batch, args.size, args.steps, args.warmup, dtype))
            row = {"arch": arch, "batch": batch, "cudnn_benchmark": bench,
                   "fps": {k: sum(v) / len(v) for k, v in runs.items()}, "runs": runs}
            row["fp16_over_bf16"] = row["fps"]["float16"] / row["fps"]["bfloat16"]
            results.append(row)
            print("{:<24} bs {:>4} cudnn.benchmark {:<5} | ".format(arch, batch, str(bench)) + " | ".join(
                "{} {:>7.0f} img/s ({:.0f}-{:.0f}, x{:.2f})".format(k, row["fps"][k], min(runs[k]), max(runs[k]),
                                                                     row["fps"][k] / row["fps"]["float32"])
                for k in runs) + " | fp16/bf16 {:.3f}".format(row["fp16_over_bf16"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
