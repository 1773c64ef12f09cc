#!/usr/bin/env python3
"""Export a trained model to ONNX and check the file against PyTorch with onnxruntime.

    python3 -m tools.export_onnx CHECKPOINT [--arch A] [--num-classes N] [--image-size 224]
                                 [--opset 11] --output FILE [--rtol 1e-4] [--atol 1e-5] [--force] [--no-verify]

CHECKPOINT is a checkpoint this trainer writes (checkpoint.pth.tar / model_best.pth.tar: a dict with
arch, num_classes, state_dict, ...) or a plain state dict (.pth), with or without
DistributedDataParallel's ``module.`` prefix. --arch and --num-classes default to the checkpoint's
(for a plain state dict --arch is needed; the class count is read from the classifier's weight).

The model is built on the CPU, loaded strictly, put in eval mode and exported with the TorchScript
exporter (opset 11 by default, as the ATC converter expects) with an input named "input", an output
named "output" and a dynamic batch axis ("batch_size"). The file is written to a temporary name and
renamed, so a failed export leaves nothing behind; an existing --output is kept unless --force.

Then onnxruntime runs the file at batch sizes 1 and 5 and each output is compared with PyTorch's,
relative to its magnitude: a batch passes when max|onnxruntime - PyTorch| <= atol + rtol * max|PyTorch|.
Two float32 engines that order their sums differently legitimately differ by ~1e-5 of the output's
magnitude on a deep network; a wrong graph or weight differs by far more. Exit codes: 0 all within
tolerance; 1 a difference over it (the file is kept for inspection); 2 a usage error (one line on stderr).
"""
if not __package__:  # python3 tools/export_onnx.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import argparse
import functools
import inspect
import os
import sys
import warnings

import torch

from trainer import errors, options
from trainer.errors import UsageError

VERIFY_BATCHES = (1, 5)
ATC_OPSETS = (9, 13)  # the ATC converter takes opsets 9-13 (porting guide)
MIN_OPSET = 7


def max_opset():
    """Highest opset the TorchScript exporter of this torch writes."""
    import importlib

    def module(name):
        try:
            return importlib.import_module(name)
        except Exception:
            return None

    consts = module("torch.onnx._constants")  # torch >= 1.13
    for name in ("ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", "ONNX_MAX_OPSET"):
        if consts is not None and hasattr(consts, name):
            return int(getattr(consts, name))
    helper = module("torch.onnx.symbolic_helper")  # torch 1.11
    if helper is not None and getattr(helper, "_onnx_stable_opsets", None):
        return int(max(helper._onnx_stable_opsets))
    return 13


def _opset(text):
    top = max_opset()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not MIN_OPSET <= value <= top:
        raise argparse.ArgumentTypeError("must be an integer from {} to {} (this torch's TorchScript "
                                         "exporter; ATC takes {}-{}), got '{}'".format(
                                             MIN_OPSET, top, ATC_OPSETS[0], ATC_OPSETS[1], text))
    return value


def build_parser():
    p = options.UsageParser(prog="export_onnx.py", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint (.pth.tar) or state dict (.pth)")
    p.add_argument("-a", "--arch", default=None, help="architecture (default: the checkpoint's)")
    p.add_argument("--num-classes", type=options.number(int, 1), default=None,
                   help="classifier outputs (default: the checkpoint's, else read from its weights)")
    p.add_argument("--image-size", type=options.number(int, 1), default=224,
                   help="height and width of the exported input")
    p.add_argument("--opset", type=_opset, default=11, help="ONNX opset version")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the .onnx file to write")
    p.add_argument("--rtol", type=options.number(float, 0.0), default=1e-4,
                   help="accepted difference to PyTorch, relative to the largest |output| of the batch")
    p.add_argument("--atol", type=options.number(float, 0.0, exclusive=True), default=1e-5,
                   help="accepted absolute difference added to the relative one (for outputs near zero)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check")
    return p


# ---------------------------------------------------------------- loading


def _classes_from_state_dict(sd):
    """Output count of the last 2-D weight (the classifier), or None."""
    last = None
    for k, v in sd.items():
        if k.endswith("weight") and v.dim() == 2:
            last = v
    return int(last.shape[0]) if last is not None else None


def load_model(path, arch=None, num_classes=None, log=print):
    """(model in eval mode on the CPU, arch, num_classes) from a checkpoint or state dict."""
    import models
    from trainer.record import checkpoint

    obj = checkpoint.read(path)
    sd = checkpoint.state_dict_of(obj, path)
    meta = obj if isinstance(obj, dict) and "state_dict" in obj else {}
    saved_arch = meta.get("arch") if isinstance(meta.get("arch"), str) else None
    if arch is None:
        if saved_arch is None:
            raise UsageError("'{}' does not name its architecture (a plain state dict): pass --arch".format(path))
        arch = saved_arch
    if not models.known(arch):
        raise UsageError(models.unknown_message(arch))
    if saved_arch is not None and saved_arch != arch:
        log("note: '{}' was trained as --arch {}; exporting it as {}".format(path, saved_arch, arch))
    if num_classes is None:
        saved = meta.get("num_classes")
        num_classes = int(saved) if isinstance(saved, int) and saved > 0 else _classes_from_state_dict(sd)
        if num_classes is None:
            raise UsageError("cannot tell the class count of '{}': pass --num-classes".format(path))
    model = models.get_model(arch, num_classes=num_classes)
    checkpoint.check_fits(model, sd, "'{}' does not fit --arch {} with {} classes".format(path, arch, num_classes))
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model, arch, num_classes


# ---------------------------------------------------------------- export and check


def export(model, path, image_size, opset):
    """TorchScript-exporter ONNX file at ``path`` (written via a temporary file)."""
    dummy = torch.randn(1, 3, image_size, image_size)
    kwargs = dict(input_names=["input"], output_names=["output"], opset_version=opset,
                  dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}},
                  do_constant_folding=True)
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False  # opset 11 needs the TorchScript exporter
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, ".{}.tmp-{}".format(os.path.basename(path), os.getpid()))
    try:
        with torch.no_grad():
            try:
                model(dummy)
            except (RuntimeError, ValueError) as exc:
                raise UsageError("the model does not run on a 3x{0}x{0} input ({1}); choose another --image-size"
                                 .format(image_size, _first_line(exc)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(model, (dummy,), tmp, **kwargs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def verify(model, path, image_size, seed=0):
    """[(batch, max abs difference, max |PyTorch output|)] between onnxruntime and PyTorch."""
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs, outputs = sess.get_inputs(), sess.get_outputs()
    if [i.name for i in inputs] != ["input"] or [o.name for o in outputs] != ["output"]:
        raise RuntimeError("unexpected graph inputs/outputs {} / {}".format(
            [i.name for i in inputs], [o.name for o in outputs]))
    if isinstance(inputs[0].shape[0], int):
        raise RuntimeError("the batch axis of 'input' is fixed ({}), not dynamic".format(inputs[0].shape[0]))
    gen = torch.Generator().manual_seed(seed)
    diffs = []
    for batch in VERIFY_BATCHES:
        x = torch.randn(batch, 3, image_size, image_size, generator=gen)
        with torch.no_grad():
            ref = model(x).numpy()
        got = sess.run(["output"], {"input": x.numpy()})[0]
        if got.shape != ref.shape:
            raise RuntimeError("batch {}: onnxruntime output shape {} vs PyTorch {}".format(
                batch, got.shape, ref.shape))
        diffs.append((batch, float(abs(got.astype("float64") - ref.astype("float64")).max()),
                      float(abs(ref.astype("float64")).max())))
    return diffs


def within(diff, ref_max, rtol, atol):
    """The acceptance rule: ``diff <= atol + rtol * ref_max`` (False for NaN)."""
    return diff <= atol + rtol * ref_max


def _first_line(exc):
    return ((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:200]


def run(args, out=None):
    log = functools.partial(print, file=out, flush=True)

    output = args.output
    if os.path.isdir(output):
        raise UsageError("--output '{}' is a folder; give a file name".format(output))
    if os.path.exists(output) and not args.force:
        raise UsageError("--output '{}' already exists; pass --force to overwrite it".format(output))
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise UsageError("--output folder '{}' does not exist".format(folder))
    if not args.no_verify:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise UsageError("onnxruntime is not installed: `pip install onnxruntime`, or pass --no-verify")
    if not ATC_OPSETS[0] <= args.opset <= ATC_OPSETS[1]:
        log("note: --opset {} is outside the {}-{} the ATC converter takes".format(args.opset, *ATC_OPSETS))

    model, arch, num_classes = load_model(args.checkpoint, args.arch, args.num_classes, log)
    try:
        export(model, output, args.image_size, args.opset)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError("export of --arch {} at opset {} failed ({}: {})".format(
            arch, args.opset, type(exc).__name__, _first_line(exc)))
    log("=> exported {} ({} classes, input 3x{}x{}, opset {}, dynamic batch) to {} ({:.1f} MB)".format(
        arch, num_classes, args.image_size, args.image_size, args.opset, os.path.abspath(output),
        os.path.getsize(output) / 1e6))
    if args.no_verify:
        log("=> not verified (--no-verify)")
        return 0
    try:
        import onnx
        onnx.checker.check_model(output)
    except ImportError:
        pass
    except Exception as exc:
        sys.stderr.write("error: the ONNX checker rejects {} ({})\n".format(output, _first_line(exc)))
        return 1
    try:
        diffs = verify(model, output, args.image_size)
    except Exception as exc:
        sys.stderr.write("error: onnxruntime cannot run {} ({}: {})\n".format(
            output, type(exc).__name__, _first_line(exc)))
        return 1
    rule = "atol {:g} + rtol {:g} x max|output|".format(args.atol, args.rtol)
    bad = [b for b, d, m in diffs if not within(d, m, args.rtol, args.atol)]
    for batch, diff, ref_max in diffs:
        log("   onnxruntime vs PyTorch, batch {}: max abs difference {:.3e} on outputs up to {:.3e} "
            "(relative {:.1e}; {})".format(batch, diff, ref_max, diff / ref_max if ref_max else 0.0,
                                           "ok" if batch not in bad else "OVER tolerance"))
    if bad:
        sys.stderr.write("error: onnxruntime differs from PyTorch by more than {} at batch size(s) {} "
                         "(file kept for inspection: {})\n".format(rule, ", ".join(str(b) for b in bad), output))
        return 1
    log("=> verified: onnxruntime matches PyTorch within {} at batch sizes {}".format(
        rule, ", ".join(str(b) for b in VERIFY_BATCHES)))
    return 0


def main(argv=None):
    return errors.run(lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
