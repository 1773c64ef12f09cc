#!/usr/bin/env python3
"""Why the trainer zero-initialises fused SGD's momentum: torch's fused SGD + GradScaler when the very
first step overflows (as it does with a dynamic scale that starts at 2**16).

    python3 -m bench.fused_sgd_overflow [--device cuda|cpu] [--steps 30]

Trains a small MLP on random data for --steps steps with float16-style loss scaling (a GradScaler
starting at 2**16 and an inf injected into the gradients of step 0) three ways and prints the final
loss and the largest |weight|:
  unfused     torch.optim.SGD (foreach), the reference
  fused-raw   torch.optim.SGD(fused=True) as torch builds it: momentum buffers come from empty_like on the
              first step, and an overflow there returns before they are written
  fused-zero  the same with the momentum buffers created as zeros first (what trainer/optim/sgd.py does)
The last line says whether fused-raw diverged and whether fused-zero matches unfused.
"""
import argparse
import sys

import torch

from trainer.device import Device
from trainer.optim.sgd import zero_momentum_buffers


def train(kind, device, steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          **({"fused": True} if kind != "unfused" else {}))
    if kind == "fused-zero":
        zero_momentum_buffers(opt)
    scaler = Device(device.type, device.index).grad_scaler(2.0 ** 16)
    gen = torch.Generator().manual_seed(1)
    loss = None
    for i in range(steps):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randint(0, 10, (32,), generator=gen).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss * (float("inf") if i == 0 else 1.0)).backward()
        scaler.step(opt)
        scaler.update()
    biggest = max(float(p.detach().abs().max()) for p in model.parameters())
    return float(loss.detach()), biggest, [p.detach().clone() for p in model.parameters()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    print("torch {} on {}".format(torch.__version__, device))
    runs = {}
    for kind in ("unfused", "fused-raw", "fused-zero"):
        loss, biggest, params = train(kind, device, args.steps)
        runs[kind] = params
        print("{:<11} final loss {:>10.4g}   max |weight| {:.4g}".format(kind, loss, biggest))
    raw_ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(runs["fused-raw"], runs["unfused"]))
    zero_ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(runs["fused-zero"], runs["unfused"]))
    print("=> fused-raw {} unfused; fused-zero {} unfused".format("matches" if raw_ok else "DIFFERS FROM",
                                                                  "matches" if zero_ok else "DIFFERS FROM"))
    return 0 if zero_ok else 1


if __name__ == "__main__":
    sys.exit(main())
