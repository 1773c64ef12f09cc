#!/usr/bin/env python3
"""Training-step time in NCHW against NHWC (channels-last), same model, batch and resolution, interleaved.

    python3 -m bench.channels_last [--arch resnet18 shufflenet_v2_x1_0] [--batch-size 16] [--image-size 160]
                                   [--steps 8] [--device cpu] [--json FILE]

One step = zero grads, forward, cross-entropy, backward, SGD step, in float32. Each round times both
formats back to back in a rotating order (noise hits both alike); reported: median ms per step and the
speed-up of channels-last (NCHW median / NHWC median; above 1 = channels-last faster).
"""
import argparse
import json
import statistics
import sys
import time

import torch

import models
from trainer.device import Device


def step_fn(arch, fmt, batch, size, device):
    torch.manual_seed(0)
    model = models.get_model(arch, num_classes=1000).to(device.torch_device)
    x = torch.randn(batch, 3, size, size, device=device.torch_device)
    if fmt == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device.torch_device)
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)

    def run():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        device.synchronize()
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", default=["resnet18", "shufflenet_v2_x1_0"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=160)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    device = Device.create(a.device)
    out = {}
    print("| arch | NCHW ms/step | NHWC ms/step | channels-last speed-up |")
    print("| --- | ---: | ---: | ---: |")
    for arch in a.arch:
        fns = {f: step_fn(arch, f, a.batch_size, a.image_size, device) for f in ("contiguous", "channels_last")}
        for fn in fns.values():
            fn()  # warm-up
        times = {f: [] for f in fns}
        for r in range(a.steps):
            for f in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                t0 = time.perf_counter()
                fns[f]()
                times[f].append(1000 * (time.perf_counter() - t0))
        med = {f: statistics.median(v) for f, v in times.items()}
        out[arch] = {"nchw_ms": med["contiguous"], "nhwc_ms": med["channels_last"],
                     "speedup": med["contiguous"] / med["channels_last"]}
        print("| {} | {:.1f} | {:.1f} | {:.2f} |".format(arch, med["contiguous"], med["channels_last"],
                                                       out[arch]["speedup"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": device.description(), "torch": torch.__version__, "batch_size": a.batch_size,
                       "image_size": a.image_size, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
