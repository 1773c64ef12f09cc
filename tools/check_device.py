#!/usr/bin/env python3
"""What to run first on a new GPU or NPU box: a short battery that shows the trainer can be trusted there.

    python3 -m tools.check_device [--device auto|npu|cuda|cpu] [--json FILE] [--work-dir DIR]
                                  [--only NAME[,NAME...]] [--small] [--decode-ahead auto|on|off]

Checks (each PASS or FAIL, or SKIP where the installed torch cannot run it; a table and JSON):
  contract        every optimizer x loss-scaler pairing the device layer returns: an inf gradient leaves
                  parameters and momentum bitwise unchanged, and the next steps equal plain SGD's
  train-fp32      a short run on generated JPEG images: the loss falls, Acc@1 clears chance, status ok
  train-amp       the same with --amp (the device's automatic dtype); skipped steps bounded
  train-fp16      the same with --amp --amp-dtype float16 (float16 + loss scaler), where auto is not float16
  amp-dtype       what --amp (auto) trains in (on a CPU: the probe's verdict, both its rates and its cost) beside
                  bare loops of float32 and of the dtype auto offers: PASS where auto's choice is not slower
  guard           --amp with lr 1e12: status diverged, exit code 4, the checkpoint left as it was
  fps-resnet50, fps-shufflenet
                  the trainer's images/s (--dummy, --amp, channels-last) against a bare forward/backward/
                  step loop with the same precision on one batch kept on the device, in this process;
                  PASS at 90 % of the bare loop or more (75 % with --small); then the trainer fed from
                  photo-like JPEGs (tools/make_dataset.py --photos, hard-linked to enough files; the
                  default --data-backend, with a worker per CPU core), which must reach 90 % (ResNet50)
                  / 70 % (ShuffleNetV2) of the synthetic images/s (no bound with --small); where the
                  device can decode JPEGs, the other backend is measured too and reported beside it, and
                  where the device backend decodes in a thread beside the step (CUDA, or --decode-ahead on),
                  also without it
  fps-compiled    the synthetic-data runs of the FPS checks again with --compile (graph mode; ResNet50's
                  only with --small): PASS where each compiles and trains; its images/s, compile time and
                  ratio to the eager run are reported (a CPU may run slower compiled: docs/RUNNING.md
                  "Graph mode"); SKIP on a torch without torch.compile
  backends        train-fp32's run once per data backend (cpu, and the device's JPEG decoder), same seed:
                  both train, their Acc@1 differ by at most 15 points, and each model validated through
                  the other backend scores within 3 points of its own; on a CPU the device backend's
                  batched roi_align crops (what an accelerator runs) are forced
  onnx            export of the train-amp checkpoint, checked with onnxruntime
  precision       CPU against the device, both in strict float32, per module (tools/compare_precision.py):
                  every output, gradient and BN buffer within 1e-3 of its largest value
  ddp             a one-device run spawned through --multiprocessing-distributed (nccl / hccl / gloo)

--small uses tiny models and images (a 2-core CPU runs the 11 checks other than fps-compiled and amp-dtype in
about 90 s; amp-dtype times ResNet18 at 224 px, batch 8, wherever a verdict is to be read: about 25 s more);
without it the sizes are the ones that matter on an accelerator (ResNet50 at batch 256, ShuffleNetV2 at batch
1024, 224 px).
Exit codes: 0 no FAIL, 1 a FAIL, 2 a usage error. Training output goes to --work-dir/*.log.
"""
if not __package__:  # python3 tools/check_device.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from tools._battery import (_Capture, _f, _tail, amp_dtype_verdict, backends_alike, bare_loop, epoch_losses,
                            fps_amp, overflow_contract, train_in_process)
from trainer import errors, options
from trainer.device_names import DEVICE_DECODE, HOST_DECODE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = ("contract", "train-fp32", "train-amp", "train-fp16", "amp-dtype", "guard", "fps-resnet50", "fps-shufflenet",
          "fps-compiled", "backends", "onnx", "precision", "ddp")
# the backends check: the largest Acc@1 gap between the runs trained from each data backend that still reads
# as "alike" (the spread between seeds of one backend is of this order: docs/BENCHMARKS.md), and between a
# model's Acc@1 through either backend's validation pipeline (same images, same model)
BACKEND_ACC_GAP = 15.0
BACKEND_CROSS_GAP = 3.0
FPS_PASS = 0.90
SMALL_FPS_PASS = 0.75  # --small: tiny models, where the trainer's per-step overhead weighs more
PRECISION_RTOL = 1e-3  # strict float32 on both sides: only summation order differs


class Sizes:
    def __init__(self, small):
        self.small = small
        self.image = 32 if small else 64  # generated JPEGs
        self.train_per_class, self.val_per_class = (150, 10) if small else (200, 20)
        self.train_arch = "tiny_cnn" if small else "resnet18"
        # tiny_cnn has no BatchNorm: without the warm-up, lr 0.1 sometimes stalls or diverges in the first
        # steps (seen on one CPU model and not another)
        self.train_args = (["-b", "16", "--lr", "0.1", "--epochs", "3", "--wd", "0", "--warmup-epochs", "1",
                            "--lr-schedule", "cosine"] if small else
                           ["-b", "32", "--lr", "0.05", "--epochs", "6", "--warmup-epochs", "1",
                            "--lr-schedule", "cosine", "--wd", "5e-5"])
        crop = self.image if small else 56
        self.crop = ["--train-crop-size", str(crop), "--val-resize-size", str(self.image),
                     "--val-crop-size", str(crop), "--crop-scale-min", "0.35"]
        self.fps = ({"fps-resnet50": ("tiny_cnn", 16, 32), "fps-shufflenet": ("shufflenet_v2_x0_5_npu", 16, 32)}
                    if small else
                    {"fps-resnet50": ("resnet50", 256, 224), "fps-shufflenet": ("shufflenet_v2_x1_0_npu", 1024, 224)})
        self.fps_steps, self.fps_warmup = (8, 3) if small else (60, 15)
        # amp-dtype: (arch, batch, px, steps, warm-up) of a model whose verdict matters (a CPU's is real ResNet18)
        self.amp_dtype = ("resnet18", 8, 224, 3, 1) if small else ("resnet50", 256, 224, 20, 5)
        self.compiled = ("fps-resnet50",) if small else ("fps-resnet50", "fps-shufflenet")  # fps-compiled's
        # JPEG-fed FPS as a fraction of the synthetic FPS: a tiny CPU model is decode-bound by nature; on an
        # accelerator ResNet50 must be fed at 90 % and ShuffleNetV2 (3x the images/s) at 70 %
        self.jpeg_pass = ({"fps-resnet50": 0.0, "fps-shufflenet": 0.0} if small else
                          {"fps-resnet50": 0.90, "fps-shufflenet": 0.70})
        # a 32-px tiny model on a CPU is dominated by the trainer's per-step bookkeeping (meters, guard,
        # LR), which is a rounding error beside a real model's step on an accelerator
        self.fps_pass = SMALL_FPS_PASS if small else FPS_PASS
        self.precision_arch = "tiny_cnn" if small else "resnet18"


class Battery:
    def __init__(self, device, work, sizes, log, decode_ahead=None):
        self.device, self.work, self.sizes, self.log = device, work, sizes, log
        # the device data backend's runs: the next batch prepared in a thread beside the step (True), on the
        # training thread (False), or as the device chooses (None: Device.decode_ahead)
        self.decode_ahead = decode_ahead
        self.results = []
        self.data = None

    # -- plumbing
    def main_py(self, name, args, timeout=900):
        """Run main.py in a child process; (exit code, summary dict or None, output text)."""
        out_dir = os.path.join(self.work, name)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "main.py")] + args + ["--output-dir", out_dir],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        with open(os.path.join(self.work, name + ".log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        summary = None
        path = os.path.join(out_dir, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                summary = json.load(f)
        return proc.returncode, summary, proc.stdout + proc.stderr

    def dataset(self):
        if self.data is None:
            from tools.make_dataset import generate
            self.data = generate(os.path.join(self.work, "data"), classes=10,
                                 train_per_class=self.sizes.train_per_class, val_per_class=self.sizes.val_per_class,
                                 size=self.sizes.image, seed=0)
        return self.data

    def base(self):
        return ["--device", self.device.kind, "--seed", "0", "-p", "10", "-j", "4"] + self.sizes.crop

    def record(self, name, ok, detail, **values):
        row = {"name": name, "status": "SKIP" if ok is None else "PASS" if ok else "FAIL", "detail": detail}
        row.update(values)
        self.results.append(row)
        self.log("{:<16} {}  {}".format(name, row["status"], detail))

    # -- checks
    def check_contract(self):
        from trainer.precision import amp as ampmod
        from trainer.optim.sgd import fused_sgd_skips_overflow
        skipped = self.device.float16_missing()
        pairings = [] if skipped else [("float16", None), ("float16", 128.0)]
        try:
            self.device.resolve_amp_dtype("bfloat16")
            pairings.append(("bfloat16", None))
        except errors.UsageError:  # a device without bfloat16
            pass
        bad, names = [], []
        for dtype_name, scale in pairings:
            dtype = getattr(torch, dtype_name)
            prec = ampmod.Precision(dtype_name, "native", dtype, scale)
            for fused in (None, False):  # the device's own choice, and torch's unfused SGD
                problem, name = overflow_contract(self.device, prec, fused)
                names.append("{}{}+{}".format(dtype_name, "" if scale is None else "@{:g}".format(scale), name))
                if problem:
                    bad.append("{}: {}".format(names[-1], problem))
        fused_ok = fused_sgd_skips_overflow(self.device)
        detail = "; ".join(bad) if bad else "{} pairings hold ({})".format(len(names), ", ".join(names))
        if skipped:
            detail += "; float16 not checked: it {}".format(skipped)
        self.record("contract", not bad, detail, pairings=names, fused_probe=fused_ok)

    def _train(self, name, extra, min_drop=0.2):
        rc, s, text = self.main_py(name, [self.dataset(), "-a", self.sizes.train_arch] + self.base()
                                   + self.sizes.train_args + extra)
        losses = epoch_losses(text)
        if rc != 0 or s is None or s.get("status") != "ok":
            self.record(name, False, "exit {} status {}: {}".format(rc, s and s.get("status"), _tail(text)))
            return s
        fell = len(losses) >= 2 and losses[-1] < (1 - min_drop) * losses[0]
        acc = s.get("final_acc1") or 0.0
        steps = max(1, s.get("trained_steps") or 1)
        overflow = s.get("overflow_steps") or 0
        bounded = overflow <= max(5, 0.1 * steps)
        ok = fell and acc > 20.0 and bounded
        self.record(name, ok, "{} {}: loss {} -> {}, Acc@1 {:.1f} %, {} of {} steps skipped, {:.0f} img/s".format(
            s["amp"]["dtype"], s.get("optimizer"), _f(losses[0] if losses else None),
            _f(losses[-1] if losses else None), acc, overflow, steps, s.get("train_fps") or 0),
            losses=losses, acc1=acc, overflow_steps=overflow,
            trained_steps=steps, dtype=s["amp"]["dtype"], optimizer=s.get("optimizer"), train_fps=s.get("train_fps"))
        return s

    def check_train_fp32(self):
        self._train("train-fp32", [])

    def check_train_amp(self):
        self._train("train-amp", ["--amp"])

    def check_train_fp16(self):
        auto, _ = self.device.resolve_amp_dtype("auto")
        if auto == torch.float16:
            self.record("train-fp16", True, "auto is float16 here: train-amp covered it")
            return
        missing = self.device.float16_missing()
        if missing:
            self.record("train-fp16", None, "not run: float16 {}".format(missing))
            return
        self._train("train-fp16", ["--amp", "--amp-dtype", "float16"])

    def check_amp_dtype(self):
        arch, batch, size, steps, warm = self.sizes.amp_dtype
        ok, detail, values = amp_dtype_verdict(self.device, arch, batch, size, steps, warm)
        self.record("amp-dtype", ok, detail, arch=arch, batch=batch, image_size=size, **values)

    def check_guard(self):
        name = "guard"
        args = [self.dataset(), "-a", self.sizes.train_arch] + self.base() + ["-b", "16", "--max-steps-per-epoch",
                                                                             "6", "-p", "2"]
        rc, _, text = self.main_py(name, args + ["--epochs", "1"])
        ckpt = os.path.join(self.work, name, "checkpoint.pth.tar")
        if rc != 0 or not os.path.exists(ckpt):
            self.record(name, False, "the first epoch failed: " + _tail(text))
            return
        with open(ckpt, "rb") as f:
            before = f.read()
        rc, s, text = self.main_py(name, args + ["--epochs", "2", "--resume", "auto", "--lr", "1e12", "--amp"])
        with open(ckpt, "rb") as f:
            kept = f.read() == before
        ok = rc == 4 and s is not None and s.get("status") == "diverged" and kept
        self.record(name, ok, "exit {}, status {}, checkpoint {}: {}".format(
            rc, s and s.get("status"), "unchanged" if kept else "CHANGED", (s or {}).get("error")))

    def check_fps(self, name):
        work = arch, batch, size, steps, warm = self.sizes.fps[name] + (self.sizes.fps_steps, self.sizes.fps_warmup)
        amp, bare_dtype = fps_amp(self.device, arch, batch, size)
        bare1 = bare_loop(self.device, arch, batch, size, steps, warm, bare_dtype)
        trainer = self._trainer_fps(name, work, amp=amp)
        bare2 = bare_loop(self.device, arch, batch, size, steps, warm, bare_dtype)
        bare = (bare1 + bare2) / 2.0
        ratio = trainer / bare if bare and trainer else 0.0
        data = self.jpeg_data((steps + warm) * batch)
        jpeg, backend = self._trainer_fps(name + "-jpeg", work, data=data, amp=amp)
        fed = jpeg / trainer if trainer and jpeg else 0.0
        need = self.sizes.jpeg_pass[name]
        detail = ("{} bs {} {} px: trainer {:.0f} img/s, bare loop {:.0f} ({:.0f} / {:.0f}) = {:.3f}; from JPEGs "
                  "({} backend, the default) {:.0f} img/s = {:.2f} of synthetic (needs {:.2f})".format(
                      arch, batch, size, trainer or 0, bare, bare1, bare2, ratio, backend, jpeg, fed, need))
        by_backend = {backend: jpeg}
        other = self.other_data_backend(backend)
        if other is not None:  # both backends in one call: which one --data-backend auto should be
            by_backend[other], _ = self._trainer_fps(name + "-jpeg-" + other, work, data=data, backend=other,
                                                     amp=amp)
            detail += "; {} backend {:.0f} img/s = {:.2f}{}".format(
                other, by_backend[other], by_backend[other] / trainer if trainer else 0.0,
                " (faster than the default)" if by_backend[other] > jpeg else "")
        extra = {}
        ahead = self.device.decode_ahead if self.decode_ahead is None else self.decode_ahead
        if DEVICE_DECODE in by_backend and ahead:  # what the decode thread gives, same run
            extra["jpeg_fps_decode_on_training_thread"], _ = self._trainer_fps(
                name + "-jpeg-" + DEVICE_DECODE + "-inline", work, data=data, backend=DEVICE_DECODE,
                decode_ahead=False, amp=amp)
            detail += "; {} backend decoding on the training thread {:.0f} img/s".format(
                DEVICE_DECODE, extra["jpeg_fps_decode_on_training_thread"])
        self.record(name, ratio >= self.sizes.fps_pass and fed >= need, detail,
                    arch=arch, batch=batch, image_size=size, trainer_fps=trainer, bare_fps=[bare1, bare2], ratio=ratio,
                    jpeg_fps=jpeg, jpeg_ratio=fed, data_backend=backend, jpeg_fps_by_backend=by_backend, **extra)

    def check_fps_compiled(self):
        missing = self.device.compile_missing()
        if missing:
            return self.record("fps-compiled", None, missing)
        rows, parts = {}, []
        steps, warm = self.sizes.fps_steps, self.sizes.fps_warmup
        for name in self.sizes.compiled:
            arch, batch, size = self.sizes.fps[name]
            amp = fps_amp(self.device, arch, batch, size)[0]
            eager = self._trainer_fps(name + "-eager", (arch, batch, size, steps, warm), amp=amp)
            fps, s = self._trainer_fps(name + "-compiled", (arch, batch, size, steps, warm), compiled=True, amp=amp)
            graph = s.get("compile") or {}
            rows[arch] = {"eager_fps": eager, "compiled_fps": fps, "ratio": fps / eager if eager else None,
                          "compile_seconds": s.get("compile_seconds"), "status": s.get("status"),
                          "compile": graph.get("status"), "note": graph.get("note")}
            parts.append("{} bs {} {} px: {} in {:.0f} s, {:.0f} img/s = {:.2f} of eager ({:.0f})".format(
                arch, batch, size, graph.get("status"), s.get("compile_seconds") or 0, fps, rows[arch]["ratio"] or 0,
                eager) if graph.get("status") == "compiled" else "{}: {}".format(arch, graph.get("note")))
        ok = all(r["status"] == "ok" and r["compile"] == "compiled" for r in rows.values())
        self.record("fps-compiled", ok, "; ".join(parts), models=rows)

    def other_data_backend(self, backend):
        """The data backend the default did not pick, where this device can run it; else None."""
        if backend == DEVICE_DECODE:
            return HOST_DECODE
        return DEVICE_DECODE if backend == HOST_DECODE and self.device.jpeg_decoder() is not None else None

    def jpeg_data(self, images):
        """A training folder of at least ``images`` JPEGs: photo-like ones of ImageNet's sizes (small mode: the
        battery's generated shapes), a set of unique files hard-linked over and over (decoding costs the same
        per file; the files stay in the page cache)."""
        if getattr(self, "_jpeg", None) is None:
            from tools.make_dataset import generate
            root = os.path.join(self.work, "jpeg-data")
            if self.sizes.small:
                src = self.dataset()
            else:
                src = generate(os.path.join(self.work, "photos"), classes=10, train_per_class=60, val_per_class=1,
                               photos=True, seed=0)
            files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(src, "train")) for f in sorted(fs)]
            self._jpeg = (root, src, files, 0)
        root, src, files, made = self._jpeg
        while made < images:
            cls = os.path.join(root, "train", "c{}".format(made % 10))
            os.makedirs(cls, exist_ok=True)
            os.link(files[made % len(files)], os.path.join(cls, "{}.JPEG".format(made)))
            made += 1
        for k in range(10):  # val/ needs the classes of train/ (the FPS runs do not validate)
            cls = os.path.join(root, "val", "c{}".format(k))
            if not os.path.isdir(cls):
                os.makedirs(cls)
                os.link(files[k % len(files)], os.path.join(cls, "v.JPEG"))
        self._jpeg = (root, src, files, made)
        return root

    def _trainer_fps(self, name, work, data=None, backend=None, decode_ahead=None, compiled=False, amp=("--amp",)):
        """main.py's train_fps for ``work`` (arch, batch, image size, timed and warm-up steps) on synthetic data, or
        (train_fps, data backend) fed from the JPEGs in ``data`` (``backend``: a --data-backend, default the trainer's;
        ``decode_ahead``: see train_in_process, None the battery's; ``amp``: its precision flags); ``compiled``:
        with --compile, (train_fps, summary)."""
        arch, batch, size, steps, warm = work
        decode_ahead = self.decode_ahead if decode_ahead is None else decode_ahead
        source = ["--dummy"] if data is None else [data, "-j", str(min(32, os.cpu_count() or 1))]
        if backend is not None:
            source += ["--data-backend", backend]
        _, s, _ = train_in_process(os.path.join(self.work, name), source + [
            "-a", arch, "-b", str(batch)] + list(amp) + [
            "--channels-last", "--device", self.device.kind, "--epochs", "1",
            "--max-steps-per-epoch", str(steps + warm), "--fps-warmup-steps", str(warm), "--no-validate",
            "--train-crop-size", str(size), "--seed", "0", "-p", str(steps + warm)]
            + (["--compile"] if compiled else []), batched=False, decode_ahead=decode_ahead)
        fps = s.get("train_fps") or 0.0
        if compiled:
            return fps, s
        return fps if data is None else (fps, s.get("data_backend"))

    def check_backends(self):
        if self.device.jpeg_decoder() is None:
            self.record("backends", True, "{} has no JPEG decoder: only the cpu backend runs here".format(
                self.device.kind))
            return
        common = [self.dataset(), "-a", self.sizes.train_arch] + self.base()
        runs, backends = {}, (HOST_DECODE, DEVICE_DECODE)
        for backend in backends:
            out = os.path.join(self.work, "backends-" + backend)
            code, s, losses = train_in_process(out, common + self.sizes.train_args + ["--data-backend", backend],
                                               decode_ahead=self.decode_ahead)
            if code != 0 or s.get("status") != "ok":
                self.record("backends", False, "--data-backend {}: exit {}, status {}".format(
                    backend, code, s.get("status")))
                return
            runs[backend] = {"acc1": s.get("final_acc1") or 0.0, "losses": losses, "train_fps": s.get("train_fps"),
                             "checkpoint": os.path.join(out, "checkpoint.pth.tar")}
        for backend, r in runs.items():  # each model validated through the other backend's pipeline too
            other = [b for b in backends if b != backend][0]
            code, s, _ = train_in_process(os.path.join(self.work, "backends-{}-val-{}".format(backend, other)),
                                          common + ["-e", "--resume", r["checkpoint"], "--data-backend", other],
                                          decode_ahead=self.decode_ahead)
            if code != 0 or s.get("status") != "ok":
                self.record("backends", False, "-e --data-backend {} of the {} run: exit {}, status {}".format(
                    other, backend, code, s.get("status")))
                return
            r["acc1_" + other] = s.get("final_acc1") or 0.0
        ok, detail = backends_alike(runs, BACKEND_ACC_GAP, BACKEND_CROSS_GAP)
        self.record("backends", ok, detail, runs=runs)

    def check_onnx(self):
        ckpt = os.path.join(self.work, "train-amp", "checkpoint.pth.tar")
        if not os.path.exists(ckpt):
            self.record("onnx", False, "no train-amp checkpoint (run train-amp first)")
            return
        from tools import export_onnx
        buf = _Capture()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = export_onnx.main([ckpt, "--image-size", str(self.sizes.image), "--force",
                                     "--output", os.path.join(self.work, "model.onnx")])
        lines = [ln.strip() for ln in buf.text().splitlines() if "batch" in ln or "error" in ln]
        self.record("onnx", code == 0, "; ".join(lines[-3:]) or buf.text()[-300:])

    def check_precision(self):
        from tools import compare_precision
        out = os.path.join(self.work, "precision.json")
        buf = _Capture()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = compare_precision.main(["-a", self.sizes.precision_arch, "--reference", "cpu", "--target",
                                           self.device.kind, "--image-size", "64", "--rtol", str(PRECISION_RTOL),
                                           "--atol", "1e-5", "--output", out, "--force"])
        if code == 2 or not os.path.exists(out):
            self.record("precision", False, buf.text()[-300:])
            return
        with open(out) as f:
            res = json.load(f)
        worst = {}
        for r in res["rows"]:
            rel = r["rel"] if isinstance(r["rel"], float) else float("inf")
            worst[r["kind"]] = max(worst.get(r["kind"], 0.0), rel)
        self.record("precision", res["over_tolerance"] == 0,
                    "strict float32, {} tensors, {} over rtol {:g}; max rel {}; the guide's mean-abs criterion: {} "
                    "over; first over: {}".format(
                        res["compared"], res["over_tolerance"], PRECISION_RTOL,
                        ", ".join("{} {:.1e}".format(k, v) for k, v in sorted(worst.items())), res["guide_over"],
                        res["first_over"]),
                    compared=res["compared"], over=res["over_tolerance"], guide_over=res["guide_over"],
                    max_rel_by_kind=worst, first_over=res["first_over"])

    def check_ddp(self):
        rc, s, text = self.main_py("ddp", ["--dummy", "-a", self.sizes.train_arch, "--device", self.device.kind,
                                           "--multiprocessing-distributed", "--device-list", "0", "--port", "0",
                                           "-b", "16", "--epochs", "1", "--max-steps-per-epoch", "4",
                                           "--no-validate", "--seed", "0", "--train-crop-size", "32"])
        ok = rc == 0 and s is not None and s.get("status") == "ok" and s.get("world_size") == 1
        backend = self.device.dist_backend
        self.record("ddp", ok, "{} spawned, 1 process: exit {}, status {}".format(
            backend, rc, s and s.get("status")) + ("" if ok else ": " + _tail(text)))


def build_parser():
    from trainer.device import KINDS
    p = options.UsageParser(prog="check_device.py", description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("auto",) + KINDS, default="auto",
                   help="the device to check (auto: the accelerator if there is one)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the results here")
    p.add_argument("--work-dir", default=None, metavar="DIR", help="data, runs and logs (default: a temp folder)")
    p.add_argument("--only", default=None, metavar="NAMES", help="comma-separated subset of: " + ", ".join(CHECKS))
    p.add_argument("--small", action="store_true", help="tiny models and images (for a CPU)")
    p.add_argument("--decode-ahead", choices=("auto", "on", "off"), default="auto",
                   help="the device data backend's runs prepare the next batch in a thread beside the step (on) or "
                        "on the training thread (off); auto: as the device does (Device.decode_ahead: on for "
                        "CUDA). Where it is on, the FPS checks also measure the training thread")
    return p


def run(args, out=None):
    from trainer.device import Device, versions
    log = functools.partial(print, file=out, flush=True)
    only = CHECKS if args.only is None else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [c for c in only if c not in CHECKS]
    if unknown or not only:
        raise errors.UsageError("--only: unknown check '{}' (known: {})".format(
            unknown[0] if unknown else args.only, ", ".join(CHECKS)))
    if args.json is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise errors.UsageError("--json folder '{}' does not exist".format(os.path.dirname(os.path.abspath(args.json))))
    device = Device.create(args.device)
    work = args.work_dir or tempfile.mkdtemp(prefix="check_device-")
    if os.path.exists(work) and not os.path.isdir(work):
        raise errors.UsageError("--work-dir '{}' is a file".format(work))
    os.makedirs(work, exist_ok=True)
    if args.work_dir and any(os.path.exists(os.path.join(work, c)) for c in CHECKS):
        raise errors.UsageError("--work-dir '{}' holds an earlier battery; choose an empty folder".format(work))
    name = device.description()
    log("=> checking {} | torch {} | work dir {}".format(name, torch.__version__, work))
    battery = Battery(device, work, Sizes(args.small or device.kind == "cpu"), log,
                      decode_ahead={"auto": None, "on": True, "off": False}[args.decode_ahead])
    t0 = time.time()
    for check in only:
        started = time.time()
        try:
            if check.startswith("fps-") and check != "fps-compiled":
                battery.check_fps(check)
            else:
                getattr(battery, "check_" + check.replace("-", "_"))()
        except Exception as exc:  # a check that breaks is a FAIL with its reason, not a crash of the battery
            battery.record(check, False, "{}: {}".format(type(exc).__name__, _tail(str(exc) or "")))
        battery.results[-1]["seconds"] = round(time.time() - started, 1)
    passed = all(r["status"] != "FAIL" for r in battery.results)
    skips = sum(r["status"] == "SKIP" for r in battery.results)
    log("=> {} of {} checks passed{} in {:.0f} s{}".format(
        sum(r["status"] == "PASS" for r in battery.results), len(battery.results),
        " ({} skipped: this torch cannot run them)".format(skips) if skips else "", time.time() - t0,
        "" if passed else ": FAIL"))
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump({"device": name, "versions": versions(), "passed": passed, "seconds": round(time.time() - t0, 1),
                       "checks": battery.results}, f, indent=1, default=str)
        log("=> results: {}".format(os.path.abspath(args.json)))
    return 0 if passed else 1


def main(argv=None):
    return errors.run(lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
