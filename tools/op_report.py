#!/usr/bin/env python3
"""Op inventory of a training step: every operator, its input shapes, and the dynamic-shape check.

    python3 -m tools.op_report --arch A [--steps 3] [--warmup-steps 1] [--batch-size 8] [--image-size 64]
                               [--num-classes 10] [--device cpu] [--amp] [--supported-ops FILE]
                               [--output-dir op_report] [--force]

The porting guide's "dump op" method, as a tool: a few training steps (forward, loss, backward, SGD
step) of a registry model on fixed-shape random batches, each step recorded separately by the
profiler with ``record_shapes=True``. Written into --output-dir:

* ``all_ops.txt``: op name, calls over the recorded steps, the distinct input shapes;
* ``dynamic_ops.txt``: ops whose input shapes in a later step are not among those of the first
  recorded step (or that the first step never ran): the guide's dynamic-shape check. Dynamic shapes
  make the NPU compile an operator again for every new shape;
* ``unsupported_ops.txt`` (with --supported-ops FILE, one op name per line, e.g. copied from the
  vendor's op support table): the recorded ops the list does not name;
* ``op_report.json``: all of the above.

--warmup-steps (default 1) run before recording: the first optimizer step creates the momentum
buffers with other ops than every later step, which would otherwise look like a dynamic shape.
Host-side operator names are the same on every device, so the report is usually made on the CPU
before porting; --device runs it on another device of this machine.

The core is ``op_report(model, make_batch, steps, ...)``, usable on any model and batch source.
Exit codes: 0 done; 1 dynamic or unsupported ops found with --strict; 2 a usage error.
"""
if not __package__:  # python3 tools/op_report.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import argparse
import functools
import json
import os
import sys

import torch

from trainer import errors, options
from trainer.plan import check_arch
from trainer.precision.amp import inspection_dtype
from trainer.errors import UsageError

FILES = ("all_ops.txt", "dynamic_ops.txt", "unsupported_ops.txt", "op_report.json")
_NOT_OPS = ("autograd::", "torch::autograd::", "profiler::")


def is_op(name):
    """Operator events (``aten::add_``, ``torchvision::nms``, ...), not autograd nodes or markers."""
    return "::" in name and not name.startswith(_NOT_OPS) and " " not in name


def shapes_key(shapes):
    return json.dumps(shapes, separators=(",", ":"))


# ---------------------------------------------------------------- recording


def _train_step(model, criterion, optimizer, images, target, autocast):
    with autocast():
        output = model(images)
        if isinstance(output, tuple):  # (logits, aux logits) of Inception / GoogLeNet in training
            output = output[0]
        loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def record_steps(model, make_batch, steps, device=None, warmup_steps=1, lr=0.01, amp=False):
    """Train ``warmup_steps`` + ``steps`` steps; per recorded step ``{op: {shapes_key: calls}}``.

    ``make_batch(step)`` (step counted from 0 over warm-up and recorded steps) returns
    ``(images, target)``; ``device`` is a ``trainer.device.Device`` (None: the CPU).
    """

    if device is None:
        from trainer.device import Device
        device = Device("cpu", None)
    model = model.to(device.torch_device)
    model.train()
    criterion = torch.nn.CrossEntropyLoss().to(device.torch_device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    dtype = inspection_dtype(device)[0] if amp else None

    def autocast():
        return device.autocast(dtype)

    def batch(step):
        images, target = make_batch(step)
        return device.move(images), device.move(target).to(device.target_dtype)

    for s in range(warmup_steps):
        _train_step(model, criterion, optimizer, *batch(s), autocast=autocast)
    device.synchronize()
    per_step = []
    prof_mod = torch.profiler
    for s in range(warmup_steps, warmup_steps + steps):
        images, target = batch(s)
        with prof_mod.profile(activities=[prof_mod.ProfilerActivity.CPU], record_shapes=True) as prof:
            _train_step(model, criterion, optimizer, images, target, autocast=autocast)
            device.synchronize()
        ops = {}
        for evt in prof.key_averages(group_by_input_shape=True):
            if not is_op(evt.key):
                continue
            key = shapes_key(evt.input_shapes)
            ops.setdefault(evt.key, {})
            ops[evt.key][key] = ops[evt.key].get(key, 0) + int(evt.count)
        per_step.append(ops)
    return per_step


# ---------------------------------------------------------------- analysis


def find_dynamic(per_step):
    """The guide's check: {op: [(step number from 1, new shapes key), ...]} against the first step."""
    first = per_step[0]
    dynamic = {}
    for number, ops in enumerate(per_step[1:], start=2):
        for op, shapes in ops.items():
            seen = first.get(op, {})
            for key in shapes:
                if key not in seen:
                    dynamic.setdefault(op, []).append((number, key))
    return dynamic


def read_supported(path):
    """Op names, one a line ('#' comments and blank lines skipped)."""
    if not os.path.isfile(path):
        raise UsageError("--supported-ops '{}' does not exist or is not a file".format(path))
    try:
        with open(path, encoding="utf-8") as f:
            names = [ln.split("#", 1)[0].strip() for ln in f]
    except UnicodeDecodeError:
        raise UsageError("--supported-ops '{}' is not a text file".format(path))
    names = {n for n in names if n}
    if not names:
        raise UsageError("--supported-ops '{}' names no op (one op name per line)".format(path))
    return names


def name_forms(name):
    """``aten::add_.Tensor`` -> the names a support list may use for it, most specific first."""
    base = name.split("::", 1)[1] if "::" in name else name
    plain = base.split(".", 1)[0]
    forms = [name, base, plain]
    if plain.endswith("_") and not plain.endswith("__"):
        forms.append(plain[:-1])  # in-place variant of a listed op
    return forms


def expand_supported(names):
    """A support list's names plus their forms without namespace (``aten::add`` -> ``add``)."""
    wanted = set()
    for s in names:
        wanted.update(name_forms(s)[:2] if "::" in s else [s])
    return wanted


def is_supported(name, wanted):
    """Whether ``name`` or a more general form of it is in ``wanted`` (see ``expand_supported``)."""
    return any(f in wanted for f in name_forms(name))


def op_report(model, make_batch, steps=3, device=None, warmup_steps=1, supported_ops=None, amp=False, lr=0.01):
    """Record ``steps`` training steps and return the report dict (``write_report`` writes its files)."""
    if steps < 2:
        raise UsageError("--steps must be at least 2: the dynamic-shape check compares later steps with the first")
    per_step = record_steps(model, make_batch, steps, device, warmup_steps, lr, amp)
    dynamic = find_dynamic(per_step)
    names = sorted(set().union(*[set(s) for s in per_step]))
    wanted = expand_supported(supported_ops) if supported_ops is not None else None
    ops = []
    for name in names:
        calls = [sum(s.get(name, {}).values()) for s in per_step]
        shapes = []
        for s in per_step:
            for key in s.get(name, {}):
                if key not in shapes:
                    shapes.append(key)
        entry = {"name": name, "calls": sum(calls), "calls_per_step": calls,
                 "input_shapes": [json.loads(k) for k in shapes], "dynamic": name in dynamic}
        if dynamic.get(name):
            entry["first_step_shapes"] = [json.loads(k) for k in per_step[0].get(name, {})]
            entry["new_shapes"] = [{"step": n, "input_shapes": json.loads(k)} for n, k in dynamic[name]]
        if supported_ops is not None:
            entry["supported"] = is_supported(name, wanted)
        ops.append(entry)
    return {
        "steps": steps, "warmup_steps": warmup_steps, "amp": bool(amp),
        "ops": ops,
        "all_ops": names,
        "dynamic_ops": [o["name"] for o in ops if o["dynamic"]],
        "unsupported_ops": ([o["name"] for o in ops if not o["supported"]] if supported_ops is not None else None),
    }


def _shapes_text(shape_list):
    return " | ".join(json.dumps(s, separators=(",", ":")) for s in shape_list)


def write_report(report, output_dir):
    os.makedirs(output_dir, exist_ok=True)
    ops = report["ops"]
    with open(os.path.join(output_dir, "all_ops.txt"), "w") as f:
        f.write("# {} ops over {} recorded training steps; op<TAB>calls<TAB>distinct input shapes\n".format(
            len(ops), report["steps"]))
        for o in ops:
            f.write("{}\t{}\t{}\n".format(o["name"], o["calls"], _shapes_text(o["input_shapes"])))
    with open(os.path.join(output_dir, "dynamic_ops.txt"), "w") as f:
        dyn = [o for o in ops if o["dynamic"]]
        f.write("# {} op(s) with input shapes not seen in the first recorded step; "
                "op<TAB>first-step shapes<TAB>new shapes (step)\n".format(len(dyn)))
        for o in dyn:
            new = " | ".join("{} (step {})".format(json.dumps(n["input_shapes"], separators=(",", ":")), n["step"])
                             for n in o["new_shapes"])
            f.write("{}\t{}\t{}\n".format(o["name"], _shapes_text(o["first_step_shapes"]) or "-", new))
    path = os.path.join(output_dir, "unsupported_ops.txt")
    if report["unsupported_ops"] is not None:
        with open(path, "w") as f:
            f.write("# {} recorded op(s) not named by the supported-op list\n".format(len(report["unsupported_ops"])))
            for name in report["unsupported_ops"]:
                f.write(name + "\n")
    with open(os.path.join(output_dir, "op_report.json"), "w") as f:
        json.dump(report, f, indent=1)


# ---------------------------------------------------------------- command line


def build_parser():
    from trainer.device import KINDS
    p = options.UsageParser(prog="op_report.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-a", "--arch", required=True, help="model of the registry (main.py --list-models)")
    p.add_argument("--steps", type=options.number(int, 2), default=3,
                   help="recorded training steps (>= 2: later steps are compared with the first)")
    p.add_argument("--warmup-steps", type=options.number(int, 0), default=1, help="steps run before recording")
    p.add_argument("-b", "--batch-size", type=options.number(int, 1), default=8)
    p.add_argument("--image-size", type=options.number(int, 1), default=64)
    p.add_argument("--num-classes", type=options.number(int, 1), default=10)
    p.add_argument("--device", choices=("auto",) + KINDS, default="cpu")
    p.add_argument("--amp", action="store_true", help="train under the device's autocast")
    p.add_argument("--supported-ops", default=None, metavar="FILE",
                   help="supported op names, one a line: lists the recorded ops it lacks")
    p.add_argument("--output-dir", default="op_report", metavar="DIR")
    p.add_argument("--force", action="store_true", help="overwrite the report files of an earlier run")
    p.add_argument("--strict", action="store_true", help="exit 1 when dynamic or unsupported ops are found")
    p.add_argument("--seed", type=int, default=0)
    return p


def _first_names(names):
    """" (a, b, ...)": the first 8 names, for the summary lines ("" when there are none)."""
    return " (" + ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") + ")" if names else ""


def run(args, out=None):
    import models
    from trainer.device import Device

    log = functools.partial(print, file=out, flush=True)

    check_arch(args.arch)
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise UsageError("--output-dir '{}' is a file, not a folder".format(args.output_dir))
    held = [f for f in FILES if os.path.exists(os.path.join(args.output_dir, f))]
    if held and not args.force:
        raise UsageError("--output-dir '{}' already holds a report ({}); pass --force to overwrite it".format(
            args.output_dir, ", ".join(held)))
    supported = read_supported(args.supported_ops) if args.supported_ops else None
    device = Device.create(args.device)
    torch.manual_seed(args.seed)
    model = models.get_model(args.arch, num_classes=args.num_classes)
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    gen = torch.Generator().manual_seed(args.seed)
    size = args.image_size

    def make_batch(step):
        return (torch.randn(args.batch_size, 3, size, size, generator=gen),
                torch.randint(0, args.num_classes, (args.batch_size,), generator=gen))

    log("=> {} on {}: {} warm-up + {} recorded training step(s), batch {} x 3x{}x{}{}".format(
        args.arch, device.name, args.warmup_steps, args.steps, args.batch_size, size, size,
        " (amp)" if args.amp else ""))
    try:
        report = dict({"arch": args.arch, "device": device.name, "batch_size": args.batch_size,
                       "image_size": size, "num_classes": args.num_classes},
                      **op_report(model, make_batch, args.steps, device, args.warmup_steps, supported, args.amp))
    except (RuntimeError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UsageError("--arch {} does not train on {}x3x{}x{} batches ({}); try another --image-size".format(
            args.arch, args.batch_size, size, size, first))
    if report["unsupported_ops"] is None:
        stale = os.path.join(args.output_dir, "unsupported_ops.txt")
        if os.path.exists(stale):  # --force: an earlier run's list must not pass for this one's
            os.remove(stale)
    write_report(report, args.output_dir)
    log("=> {} ops recorded: {}".format(len(report["all_ops"]), os.path.join(args.output_dir, "all_ops.txt")))
    dyn = report["dynamic_ops"]
    log("=> {} dynamic-shape op(s){}: {}".format(len(dyn), _first_names(dyn),
                                                 os.path.join(args.output_dir, "dynamic_ops.txt")))
    if supported is not None:
        miss = report["unsupported_ops"]
        log("=> {} op(s) not in '{}'{}: {}".format(
            len(miss), args.supported_ops, _first_names(miss),
            os.path.join(args.output_dir, "unsupported_ops.txt")))
    log("=> report: {}".format(os.path.join(args.output_dir, "op_report.json")))
    if args.strict and (dyn or (supported is not None and report["unsupported_ops"])):
        return 1
    return 0


def main(argv=None):
    return errors.run(lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
