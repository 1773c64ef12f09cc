#!/usr/bin/env python3
"""Training images/s in graph mode (--compile) against eager, same model, batch, dtype and device, interleaved.

    python3 -m bench.compile [--arch resnet18 shufflenet_v2_x1_0] [--dtype float32 bfloat16] [--batch-size 32]
                             [--image-size 224] [--steps 8] [--model-impl auto] [--mode default]
                             [--device auto] [--json FILE]

One step = zero grads, forward under autocast (``--dtype`` bfloat16/float16) or in float32, cross-entropy,
backward, SGD step: the trainer's step, on the model the trainer builds for ``--arch`` (models.resolve: the NPU
ShuffleNetV2 for shufflenet_v2_*), in the device's memory format (channels-last on CPU), compiled through the
device layer as ``main.py --compile`` does (``Device.compile``), with host memory kept as the trainer keeps it.
The first compiled step is timed apart (compile_seconds); then each round times both back to back in a rotating
order (noise hits both alike). Reported: median images/s and compiled / eager (above 1 = graph mode faster).
A dtype the device has no native support for (bfloat16 on a CPU without avx512_bf16 or AMX) is skipped, with a
note, unless given explicitly.
"""
import argparse
import json
import statistics
import sys
import time

import torch

import models
from trainer.config import ModelConfig
from trainer.device import Device
from trainer.graph import wrap

DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def step_fn(name, dtype, batch, size, device, compiled, mode):
    torch.manual_seed(0)
    model = models.get_model(name, num_classes=1000).to(device.torch_device)
    x = torch.randn(batch, 3, size, size, device=device.torch_device)
    if device.prefers_channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device.torch_device)
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    scaler = device.grad_scaler() if dtype == torch.float16 else None
    graph = wrap(model, model, device, ModelConfig(compile=compiled, compile_mode=mode), print).train()

    def run():
        opt.zero_grad(set_to_none=True)
        with device.autocast(dtype):
            loss = torch.nn.functional.cross_entropy(graph(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return None, loss, None
    return graph, run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", default=["resnet18", "shufflenet_v2_x1_0"])
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=None,
                   help="default: float32, and the device's --amp dtype where it has one natively")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--model-impl", default="auto", choices=("auto", "torchvision"),
                   help="as main.py's: auto builds this project's variant (the NPU ShuffleNetV2)")
    p.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune"))
    p.add_argument("--device", default="auto")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    device = Device.create(a.device)
    host_memory = device.keep_host_memory()
    dtypes = a.dtype
    if dtypes is None:
        amp_dtype, note = device.resolve_amp_dtype("auto")
        dtypes = ["float32"] + ([str(amp_dtype).replace("torch.", "")] if amp_dtype is not None else [])
        if note:
            print("note: " + note)
    out = []
    print("device: {} | torch {} | batch {} | {} px | host memory: {}".format(
        device.description(), torch.__version__, a.batch_size, a.image_size, host_memory))
    print("| model | dtype | eager img/s | compiled img/s | compiled / eager | compile s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for arch in a.arch:
        name = models.resolve(arch, a.model_impl)
        for dt in dtypes:
            dtype = DTYPES[dt]
            eager_graph, eager = step_fn(name, dtype, a.batch_size, a.image_size, device, False, a.mode)
            graph, compiled = step_fn(name, dtype, a.batch_size, a.image_size, device, True, a.mode)
            graph.first_step(compiled, device, lambda line: print("  " + line, flush=True))
            if graph.status != "compiled":
                print("| {} | {} | | | (eager: {}) | |".format(name, dt, graph.note))
                continue
            fns = {"eager": eager, "compiled": compiled}
            for fn in fns.values():
                fn()  # warm-up
            times = {k: [] for k in fns}
            for r in range(a.steps):
                for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    device.synchronize()
                    t0 = time.perf_counter()
                    fns[k]()
                    device.synchronize()
                    times[k].append(time.perf_counter() - t0)
            ips = {k: a.batch_size / statistics.median(v) for k, v in times.items()}
            row = {"arch": arch, "model": name, "dtype": dt, "eager_img_s": ips["eager"],
                   "compiled_img_s": ips["compiled"], "ratio": ips["compiled"] / ips["eager"],
                   "compile_seconds": graph.seconds}
            out.append(row)
            print("| {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.0f} |".format(
                name, dt, row["eager_img_s"], row["compiled_img_s"], row["ratio"], graph.seconds), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": device.description(), "torch": torch.__version__, "batch_size": a.batch_size,
                       "image_size": a.image_size, "mode": a.mode, "steps": a.steps, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
