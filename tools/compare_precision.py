#!/usr/bin/env python3
"""Compare a training step on two devices (or precisions), module by module.

    python3 -m tools.compare_precision --arch A [--reference cpu] [--target auto|npu|cuda|cpu] [--target-amp]
                                       [--amp-dtype auto|float16|bfloat16] [--steps 1] [--rtol 1e-3] [--atol 1e-5]
                                       [--batch-size 4] [--image-size 64]
                                       [--num-classes 10] [--loss-scale 128] [--top 15] [--output FILE.json] [--force]

The porting guide's whole-network precision check: the same initial weights and the same input
batches on both sides; forward hooks record every module's output (in execution order), tensor hooks
every parameter's gradient (in the order backward produces them), then the loss, and after the SGD
step every floating buffer (BatchNorm running mean / variance). With --steps N each side trains N
steps on its own, so drift accumulates as it would in training.

Each recorded tensor of the target is compared with the reference's: max abs difference, mean abs
difference, the relative error max|t - r| / max|r| and the mean relative error mean|t - r| / mean|r|.
A tensor is over tolerance when max|t - r| > atol + rtol * max|r|. Beside it, the porting guide's own
criterion (its whole-network CPU-vs-NPU check): the mean abs difference should not exceed 1e-4 ("guide"
column). Printed: the worst relative errors, and the first module (in execution order) over tolerance,
the place to start looking. --output writes every comparison as JSON.

Dropout modules are switched off on both sides (their masks come from different random generators
on different devices); BatchNorm trains as usual. --target-amp runs the target's forward pass under
autocast in --amp-dtype (auto: what main.py --amp uses on that device, bfloat16 on a CPU where it would
train float32); with float16 the loss is multiplied by --loss-scale for backward and the gradients are
divided by it again.

float32 is strict float32 on both sides: the reduced-precision float32 shortcuts a device takes by
default (TF32 on CUDA, HF32 on newer NPUs) are off during the comparison.

The usual check is the CPU (reference, float32) against the accelerator: --target cuda or npu. A
process drives one accelerator, so the two sides cannot be two different accelerators: a GPU box against an NPU
box is msprobe's comparison of two runs' dumps (main.py --precision-dump, python3 -m tools.align compare). This tool
keeps what that does not do: both sides in one process, float32 against autocast on one device, the guide's
mean-difference criterion.
Exit codes: 0 all within tolerance; 1 something over tolerance; 2 a usage error.
"""
if not __package__:  # python3 tools/compare_precision.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import argparse
import collections
import contextlib
import copy
import functools
import json
import math
import os
import sys

import torch

from trainer import errors, options
from trainer.plan import check_arch
from trainer.errors import UsageError

ROOT_NAME = "(model)"
GUIDE_MEAN_ABS = 1e-4  # the porting guide: mean |cpu - npu| "generally not above 1e-4" is normal


# ---------------------------------------------------------------- recording


def _flat_tensors(value, name):
    if torch.is_tensor(value):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        out = []
        for i, v in enumerate(value):
            out.extend(_flat_tensors(v, "{}[{}]".format(name, i)))
        return out
    if isinstance(value, dict):
        out = []
        for k in value:
            out.extend(_flat_tensors(value[k], "{}[{}]".format(name, k)))
        return out
    return []


def _keep(t):
    return t.detach().to("cpu", torch.float32, copy=True)


def disable_dropout(model):
    """Dropout modules to eval mode (identity); returns how many."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.eval()
            n += 1
    return n


def record_run(model, batches, device, amp_dtype=None, lr=0.01, loss_scale=None, seed=0):
    """Train ``model`` on ``batches`` on ``device``; returns [(name, kind, cpu float32 tensor)] in order.

    ``kind`` is one of forward, loss, grad, buffer; ``amp_dtype`` None runs float32. ``loss_scale`` multiplies
    the loss for backward; gradients are divided by it before they are recorded and applied.
    """
    model = model.to(device.torch_device)
    model.train()
    n_dropout = disable_dropout(model)
    criterion = torch.nn.CrossEntropyLoss().to(device.torch_device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    records = []
    prefix = {"step": ""}
    calls = {}
    handles = []
    scale = float(loss_scale) if loss_scale else 1.0

    def forward_hook(name):
        def hook(module, inputs, output):
            calls[name] = calls.get(name, 0) + 1
            label = name if calls[name] == 1 else "{}#{}".format(name, calls[name])
            for sub, t in _flat_tensors(output, label):
                if t.is_floating_point():
                    records.append((prefix["step"] + "forward/" + sub, "forward", _keep(t)))
        return hook

    def grad_hook(name):
        def hook(grad):
            records.append((prefix["step"] + "grad/" + name, "grad", _keep(grad) / scale))
        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(forward_hook(name or ROOT_NAME)))
    for name, p in model.named_parameters():
        if p.requires_grad:
            handles.append(p.register_hook(grad_hook(name)))
    try:
        for step, (images, target) in enumerate(batches, start=1):
            prefix["step"] = "step{}/".format(step)
            calls.clear()
            torch.manual_seed(seed + step)
            x = device.move(images)
            y = device.move(target).to(device.target_dtype)
            with device.autocast(amp_dtype):
                output = model(x)
                if isinstance(output, tuple):  # (logits, aux logits) of Inception / GoogLeNet in training
                    output = output[0]
                loss = criterion(output, y)
            records.append((prefix["step"] + "loss", "loss", _keep(loss)))
            optimizer.zero_grad()
            (loss * scale if scale != 1.0 else loss).backward()
            if scale != 1.0:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.div_(scale)
            optimizer.step()
            for name, b in model.named_buffers():
                if b.is_floating_point():
                    records.append((prefix["step"] + "buffer/" + name, "buffer", _keep(b)))
        device.synchronize()
    finally:
        for h in handles:
            h.remove()
    return records, n_dropout


# ---------------------------------------------------------------- comparison


def compare_tensors(ref, tgt, rtol, atol):
    """Metrics of ``tgt`` against ``ref`` (float64)."""
    if tuple(ref.shape) != tuple(tgt.shape):
        return {"shape": list(ref.shape), "target_shape": list(tgt.shape), "max_abs": None, "mean_abs": None,
                "rel": None, "mean_rel": None, "guide_ok": False, "ref_max": None, "over": True,
                "note": "shape differs"}
    r, t = ref.double(), tgt.double()
    finite = bool(torch.isfinite(t).all()) and bool(torch.isfinite(r).all())
    if r.numel() == 0:
        return {"shape": list(ref.shape), "max_abs": 0.0, "mean_abs": 0.0, "rel": 0.0, "mean_rel": 0.0,
                "guide_ok": True, "ref_max": 0.0, "over": False}
    if not finite:
        same = bool(((r == t) | (torch.isnan(r) & torch.isnan(t))).all())
        return {"shape": list(ref.shape), "max_abs": None if not same else 0.0, "mean_abs": None,
                "rel": None if not same else 0.0, "mean_rel": None if not same else 0.0, "guide_ok": same,
                "ref_max": None, "over": not same, "note": "inf/nan"}
    diff = (t - r).abs()
    max_abs = float(diff.max())
    ref_max = float(r.abs().max())
    rel = max_abs / ref_max if ref_max > 0 else (0.0 if max_abs == 0 else math.inf)
    mean_abs, ref_mean = float(diff.mean()), float(r.abs().mean())
    mean_rel = mean_abs / ref_mean if ref_mean > 0 else (0.0 if mean_abs == 0 else math.inf)
    return {"shape": list(ref.shape), "max_abs": max_abs, "mean_abs": mean_abs, "rel": rel, "mean_rel": mean_rel,
            "guide_ok": mean_abs <= GUIDE_MEAN_ABS, "ref_max": ref_max, "over": max_abs > atol + rtol * ref_max}


def compare_records(ref_records, tgt_records, rtol, atol):
    """Comparisons in the reference's execution order, plus the names found on one side only."""
    tgt = {}
    for name, kind, t in tgt_records:
        tgt[name] = t
    rows = []
    ref_names = set()
    for order, (name, kind, r) in enumerate(ref_records):
        ref_names.add(name)
        if name not in tgt:
            continue
        row = {"order": order, "name": name, "kind": kind}
        row.update(compare_tensors(r, tgt[name], rtol, atol))
        rows.append(row)
    only_ref = [n for n, _, _ in ref_records if n not in tgt]
    only_tgt = [n for n, _, _ in tgt_records if n not in ref_names]
    return rows, only_ref, only_tgt


def module_of(name):
    """'step1/forward/layer1.0.conv1#2[0]' -> 'layer1.0.conv1'."""
    part = name.split("/", 2)[-1]
    for sep in ("#", "["):
        part = part.split(sep, 1)[0]
    return part


def summarize(rows):
    over = [r for r in rows if r["over"]]
    first_forward = next((r for r in rows if r["over"] and r["kind"] == "forward"), None)
    first_any = over[0] if over else None

    def key(r):
        return -(r["rel"] if r["rel"] is not None else math.inf)

    worst = sorted(rows, key=key)
    return {
        "compared": len(rows), "over_tolerance": len(over),
        "guide_over": sum(1 for r in rows if not r["guide_ok"]),
        "max_rel": max((r["rel"] for r in rows if r["rel"] is not None), default=0.0),
        "first_over": first_any["name"] if first_any else None,
        "first_module_over": module_of(first_forward["name"]) if first_forward else None,
        "first_forward_over": first_forward["name"] if first_forward else None,
        "worst": [r["name"] for r in worst[:50]],
    }


def _fmt(v):
    if v is None:
        return "-"
    if v == math.inf:
        return "inf"
    return "{:.3e}".format(v)


def table(rows, top):
    worst = sorted(rows, key=lambda r: -(r["rel"] if r["rel"] is not None else math.inf))[:top]
    width = max([len(r["name"]) for r in worst] + [6])
    lines = ["{:<{w}}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>5}  {:>5}  {}".format(
        "tensor", "rel", "mean_rel", "max_abs", "mean_abs", "ref_max", "guide", "order", "", w=width)]
    for r in worst:
        lines.append("{:<{w}}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}  {:>5}  {:>5}  {}".format(
            r["name"], _fmt(r["rel"]), _fmt(r["mean_rel"]), _fmt(r["max_abs"]), _fmt(r["mean_abs"]),
            _fmt(r["ref_max"]), "ok" if r["guide_ok"] else "OVER", r["order"],
            ("OVER" if r["over"] else "ok") + (" ({})".format(r["note"]) if r.get("note") else ""), w=width))
    return "\n".join(lines)


Training = collections.namedtuple("Training", "lr loss_scale seed")  # the steps both sides take (record_run's)


def compare_precision(model, batches, ref_device, tgt_device, amp_dtype=None, rtol=1e-3, atol=1e-5,
                      training=Training(0.01, None, 0)):
    """Run the same steps on both sides and compare; returns the result dict (no printing)."""
    lr, loss_scale, seed = training
    tgt_model = copy.deepcopy(model)
    if hasattr(tgt_model, "set_index_dtype"):
        tgt_model.set_index_dtype(tgt_device.index_dtype)
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(ref_device.index_dtype)
    scale = loss_scale if amp_dtype == torch.float16 else None
    with ref_device.strict_float32():
        ref_records, n_dropout = record_run(model, batches, ref_device, None, lr, None, seed)
    strict = tgt_device.strict_float32() if amp_dtype is None else contextlib.nullcontext()
    with strict:
        tgt_records, _ = record_run(tgt_model, batches, tgt_device, amp_dtype, lr, scale, seed)
    rows, only_ref, only_tgt = compare_records(ref_records, tgt_records, rtol, atol)
    result = {
        "reference": {"device": ref_device.name, "amp": False},
        "target": {"device": tgt_device.name, "amp": amp_dtype is not None,
                   "amp_dtype": str(amp_dtype).replace("torch.", "") if amp_dtype is not None else None,
                   "loss_scale": scale},
        "rtol": rtol, "atol": atol, "steps": len(batches), "dropout_disabled": n_dropout,
        "only_in_reference": only_ref, "only_in_target": only_tgt,
        "rows": rows,
    }
    result.update(summarize(rows))
    return result


# ---------------------------------------------------------------- command line


def build_parser():
    from trainer.device import KINDS

    p = options.UsageParser(prog="compare_precision.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-a", "--arch", required=True, help="model of the registry (main.py --list-models)")
    p.add_argument("--reference", choices=("auto",) + KINDS, default=KINDS[-1],
                   help="device of the reference side (float32)")
    p.add_argument("--target", choices=("auto",) + KINDS, default="auto", help="device of the compared side")
    p.add_argument("--target-amp", action="store_true", help="run the target under autocast in --amp-dtype")
    p.add_argument("--amp-dtype", choices=("auto", "float16", "bfloat16"), default="auto",
                   help="autocast dtype of --target-amp (auto: main.py --amp's choice on the target device)")
    p.add_argument("--steps", type=options.number(int, 1), default=1, help="training steps on each side")
    p.add_argument("--rtol", type=options.number(float, 0.0), default=1e-3,
                   help="relative tolerance (to max|reference|)")
    p.add_argument("--atol", type=options.number(float, 0.0), default=1e-5, help="absolute tolerance")
    p.add_argument("-b", "--batch-size", type=options.number(int, 1), default=4)
    p.add_argument("--image-size", type=options.number(int, 1), default=64)
    p.add_argument("--num-classes", type=options.number(int, 1), default=10)
    p.add_argument("--lr", type=options.number(float, 0.0), default=0.01, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--loss-scale", type=options.number(float, 0.0, exclusive=True), default=128.0,
                   help="static loss scale of float16 autocast targets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=options.number(int, 1), default=15, help="rows of the printed table")
    p.add_argument("--output", default=None, metavar="FILE.json", help="write every comparison here")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    return p


def run(args, out=None):
    import models

    log = functools.partial(print, file=out, flush=True)
    check_arch(args.arch)
    _check_output(args)
    ref, tgt, amp_dtype = _sides(args, log)
    torch.manual_seed(args.seed)
    model = models.get_model(args.arch, num_classes=args.num_classes)
    gen = torch.Generator().manual_seed(args.seed)
    s = args.image_size
    batches = [(torch.randn(args.batch_size, 3, s, s, generator=gen),
                torch.randint(0, args.num_classes, (args.batch_size,), generator=gen)) for _ in range(args.steps)]
    log("=> {}: reference {} float32 vs target {} {} | {} step(s), batch {} x 3x{}x{} | rtol {:g}, atol {:g}".format(
        args.arch, ref.name, tgt.name,
        str(amp_dtype).replace("torch.", "") + " autocast" if amp_dtype is not None else "float32",
        args.steps, args.batch_size, s, s, args.rtol, args.atol))
    try:
        result = compare_precision(model, batches, ref, tgt, amp_dtype, args.rtol, args.atol,
                                   Training(args.lr, args.loss_scale, args.seed))
    except (RuntimeError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UsageError("--arch {} does not train on {}x3x{}x{} batches on {} ({}); try another --image-size or "
                         "--batch-size".format(args.arch, args.batch_size, s, s, tgt.name, first))
    result.update({"arch": args.arch, "batch_size": args.batch_size, "image_size": s,
                   "num_classes": args.num_classes, "seed": args.seed, "lr": args.lr})
    _report(result, args.top, log)
    if args.output is not None:
        tmp = args.output + ".tmp-{}".format(os.getpid())
        with open(tmp, "w") as f:
            json.dump(_jsonable(result), f, indent=1)
        os.replace(tmp, args.output)
        log("=> comparison: {}".format(os.path.abspath(args.output)))
    return 1 if result["over_tolerance"] else 0


def _check_output(args):
    """--output names a file that can be written (and is new, unless --force)."""
    if args.output is None:
        return
    if os.path.isdir(args.output):
        raise UsageError("--output '{}' is a folder; give a file name".format(args.output))
    if os.path.exists(args.output) and not args.force:
        raise UsageError("--output '{}' already exists; pass --force to overwrite it".format(args.output))
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise UsageError("--output folder '{}' does not exist".format(folder))


def _sides(args, log):
    """(the reference Device, the target Device, the target's autocast dtype or None)."""
    from trainer.device import Device

    def create(kind, flag):
        try:
            return Device.create(kind)
        except UsageError as exc:  # the device layer's message speaks of --device
            raise UsageError(str(exc).replace("--device", flag))

    ref = create(args.reference, "--reference")
    try:
        tgt = create(args.target, "--target")
    except RuntimeError as exc:  # a second accelerator in this process
        raise UsageError("--reference {} and --target {}: one process drives one accelerator ({}); "
                         "compare each with the CPU".format(args.reference, args.target, str(exc).splitlines()[0]))
    if tgt.name == ref.name and not args.target_amp:
        log("note: reference and target are both {} in float32: this checks that a step is reproducible".format(
            ref.name))
    amp_dtype = None
    if args.target_amp:
        from trainer.precision.amp import inspection_dtype
        amp_dtype, note = inspection_dtype(tgt, args.amp_dtype)
        if note:
            log("note: " + note)
    elif args.amp_dtype != "auto":
        raise UsageError("--amp-dtype {} needs --target-amp".format(args.amp_dtype))
    return ref, tgt, amp_dtype


def _report(result, top, log):
    """The table of the ``top`` worst tensors and the verdict's lines."""
    rows = result["rows"]
    log(table(rows, top))
    if result["dropout_disabled"]:
        log("note: {} dropout module(s) switched off on both sides".format(result["dropout_disabled"]))
    if result["only_in_reference"] or result["only_in_target"]:
        log("note: {} tensor(s) only in the reference, {} only in the target (the model takes another path "
            "there; not compared)".format(len(result["only_in_reference"]), len(result["only_in_target"])))
    if result["over_tolerance"]:
        first = next(r for r in rows if r["name"] == result["first_over"])
        log("=> {} of {} tensors over tolerance (largest relative error {}); first in execution order: {} "
            "(rel {}, max abs {})".format(result["over_tolerance"], result["compared"], _fmt(result["max_rel"]),
                                          first["name"], _fmt(first["rel"]), _fmt(first["max_abs"])))
        if result["first_module_over"] is not None:
            log("=> first module over tolerance: {} ({})".format(result["first_module_over"],
                                                                  result["first_forward_over"]))
    else:
        log("=> all {} tensors within tolerance (largest relative error {})".format(
            result["compared"], _fmt(result["max_rel"])))
    log("=> the guide's criterion (mean abs difference <= {:g}): {} of {} tensors over".format(
        GUIDE_MEAN_ABS, result["guide_over"], result["compared"]))


def _jsonable(obj):
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv=None):
    return errors.run(lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
