"""Forward+backward time: ShuffleNetV2 NPU variant vs torchvision's, same batch and resolution.

Two scopes (``--scope both`` by default), each timed with the candidates interleaved (a rotating
order every round) so that machine noise hits all of them alike:

[model]   whole network, one step = zero grads, forward, cross-entropy, backward (no optimizer):
  torchvision       torchvision.models.shufflenet_v2_x<W>
  npu(auto)         models.shufflenet_v2_x<W>_npu as the registry builds it (shuffle_impl="auto":
                    "index_select" on NPU, "view" elsewhere)
  npu(index_select) the same with shuffle_impl="index_select" (the NPU form: fused Functions)
  npu(view)         the same with shuffle_impl="view"
[shuffle] only the ops that differ between the models: each stage's blocks with branch1/branch2
          replaced by an out-of-place ReLU, fwd+bwd (torchvision / fused index_select / view).
          Much shorter per repetition, so far less exposed to a noisy shared machine.

Reported: median, mean and min ms, the ratio of medians to torchvision's, and the paired ratio
(median over rounds of this candidate's time / torchvision's time in the same round).

Example (about 1 minute on an idle 2-core CPU, 2-4 minutes on a shared one):
  python3 -m bench.shufflenet_shuffle --device cpu --batch-size 32 --image-size 224 --steps 10
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

import models
from trainer.device import npu_module

WIDTHS = ("0_5", "1_0", "1_5", "2_0")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto",
                   help="cpu, cuda[:N], npu[:N] or auto (cuda if available, else cpu)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    p.add_argument("--width", default="1_0", choices=WIDTHS + ("0.5", "1.0", "1.5", "2.0"))
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--index-dtype", default="int64", choices=("int64", "int32"),
                   help="dtype of the shuffle indices of the variant")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: leave torch's default, the core count)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scope", default="both", choices=("model", "shuffle", "both"),
                   help="model: whole-network fwd+bwd; shuffle: only the split/concat/shuffle ops "
                        "of each stage (branches replaced by ReLU); both (default)")
    p.add_argument("--shuffle-reps", type=int, default=30, help="timed reps of the shuffle scope")
    p.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    return p.parse_args(argv)


def resolve_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("npu"):
        import torch_npu  # noqa: F401  (registers the npu device)
    return torch.device(name)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        npu_module().npu.synchronize()


def build_models(width, num_classes, device, index_dtype):
    tv = torchvision.models.__dict__["shufflenet_v2_x" + width](num_classes=num_classes)
    entries = [("torchvision", tv)]
    for impl in ("auto", "index_select", "view"):
        m = models.get_model("shufflenet_v2_x{}_npu".format(width), num_classes=num_classes)
        m.load_state_dict(tv.state_dict(), strict=True)
        m.set_shuffle_impl(impl)
        m.set_index_dtype(index_dtype)
        entries.append(("npu({})".format(impl), m))
    return [(name, m.to(device).train()) for name, m in entries]


def step(model, x, y):
    for p in model.parameters():
        p.grad = None
    loss = F.cross_entropy(model(x), y)
    loss.backward()


def _summarise(times, base_name):
    base = statistics.median(times[base_name])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        # Paired: the candidates of one step ran back to back, so the per-step ratio cancels
        # most of the slow drift of a shared machine.
        paired = statistics.median(a / b for a, b in zip(ts, times[base_name]))
        rows.append({"model": name, "median_ms": med, "mean_ms": statistics.mean(ts),
                     "min_ms": min(ts), "ratio_vs_torchvision": med / base,
                     "paired_ratio_vs_torchvision": paired})
    return rows


def _print_rows(rows):
    print("{:<18} {:>10} {:>10} {:>10} {:>7} {:>7}".format(
        "model", "median ms", "mean ms", "min ms", "ratio", "paired"))
    for r in rows:
        print("{:<18} {:>10.2f} {:>10.2f} {:>10.2f} {:>7.3f} {:>7.3f}".format(
            r["model"], r["median_ms"], r["mean_ms"], r["min_ms"], r["ratio_vs_torchvision"],
            r["paired_ratio_vs_torchvision"]))


def _interleaved(candidates, warmup, steps, device):
    """candidates: list of (name, zero-arg callable). Returns {name: [ms, ...]}."""
    times = {name: [] for name, _ in candidates}
    n = len(candidates)
    for it in range(warmup + steps):
        for k in range(n):
            name, fn = candidates[(it + k) % n]  # rotate the order every step
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            if it >= warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def shuffle_scope(width, batch, image_size, device, index_dtype, warmup, reps):
    """Only the data movement that differs between the models: for every stage, its blocks with
    branch1/branch2 replaced by an out-of-place ReLU (the same stand-in for every form), fwd+bwd.
    Spatial size is the stage's (image/8, /16, /32); the stage input has C/2 channels."""
    import torch.nn as nn
    from torchvision.models import shufflenetv2 as tvs
    from models.shufflenet_npu import InvertedResidual, forward_stage_fused

    channels = {"0_5": [48, 96, 192], "1_0": [116, 232, 464], "1_5": [176, 352, 704],
                "2_0": [244, 488, 976]}[width]
    repeats = [4, 8, 4]

    def stub(block, stride):
        if stride > 1:
            block.branch1 = nn.ReLU()
        block.branch2 = nn.ReLU()
        return block

    stages = []
    for c, r, div in zip(channels, repeats, (8, 16, 32)):
        size = max(1, image_size // div)
        x = torch.randn(batch, c // 2, size, size, device=device, requires_grad=True)
        tv = nn.Sequential(*[stub(tvs.InvertedResidual(c, c, 1), 2 if i == 0 else 1)
                             for i in range(r)])
        ours = nn.Sequential(*[stub(InvertedResidual(c, c, 1), 2 if i == 0 else 1)
                               for i in range(r)])
        for seq in (tv, ours):
            seq[0].stride = 2  # take the stride-2 code path (two branches, no split)
        for blk in ours:
            blk.shuffle_impl = "view"  # used by the plain path; the fused path ignores it
            for name in ("shuffle_index", "shuffle_index1", "shuffle_index2",
                         "unshuffle_index1", "unshuffle_index2"):
                setattr(blk, name, getattr(blk, name).to(index_dtype))
        stages.append((x, tv.to(device), ours.to(device)))

    def run(kind):
        def fn():
            for x, tv, ours in stages:
                x.grad = None
                if kind == "torchvision":
                    out = tv(x)
                elif kind == "npu(index_select)":
                    out = forward_stage_fused(ours, x)
                else:
                    out = ours(x)
                out.sum().backward()
        return fn

    cands = [(k, run(k)) for k in ("torchvision", "npu(index_select)", "npu(view)")]
    return _interleaved(cands, warmup, reps, device)


def _loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return None


def main(argv=None):
    args = parse_args(argv)
    width = args.width.replace(".", "_")
    device = resolve_device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = _loadavg()
    torch.manual_seed(args.seed)
    index_dtype = torch.int32 if args.index_dtype == "int32" else torch.int64
    entries = build_models(width, args.num_classes, device, index_dtype)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)

    header = "ShuffleNetV2 x{} fwd+bwd, device={}, batch={}, image={}, torch {}, threads {}".format(
        width.replace("_", "."), device, args.batch_size, args.image_size, torch.__version__,
        torch.get_num_threads())
    print(header)
    result = {}
    if args.scope in ("model", "both"):
        cands = [(name, (lambda m=m: step(m, x, y))) for name, m in entries]
        times = _interleaved(cands, args.warmup, args.steps, device)
        rows = _summarise(times, "torchvision")
        print("\n[model] whole network, {} timed steps (+{} warm-up), ms/step".format(
            args.steps, args.warmup))
        _print_rows(rows)
        result["model"] = {"results": rows, "raw_ms": times}
    if args.scope in ("shuffle", "both"):
        times = shuffle_scope(width, args.batch_size, args.image_size, device, index_dtype,
                              3, args.shuffle_reps)
        rows = _summarise(times, "torchvision")
        print("\n[shuffle] split/concat/shuffle ops of stages 2-4 only (branches = ReLU), "
              "{} timed reps, ms/rep".format(args.shuffle_reps))
        _print_rows(rows)
        result["shuffle"] = {"results": rows, "raw_ms": times}
    load_after = _loadavg()
    if load_before:
        print("\nload average (1/5/15 min) before: {}, after: {}".format(
            " ".join(load_before), " ".join(load_after or [])))
    print("ratio = median / torchvision median; paired = median over steps of "
          "(this step / torchvision's step in the same round)")

    if args.json:
        out = {
            "benchmark": "shufflenet_shuffle", "width": width, "device": str(device),
            "batch_size": args.batch_size, "image_size": args.image_size, "steps": args.steps,
            "warmup": args.warmup, "shuffle_reps": args.shuffle_reps,
            "index_dtype": args.index_dtype, "torch": torch.__version__,
            "torchvision": torchvision.__version__, "threads": torch.get_num_threads(),
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "loadavg_before": load_before, "loadavg_after": load_after,
        }
        out.update(result)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return result


if __name__ == "__main__":
    main()
