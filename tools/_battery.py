"""The parts of tools/check_device.py's battery that are not the checks themselves: a main.py run in this
process with the device data backend's choices, the overflow contract of one optimizer step, the bare
training loop the FPS checks measure against, the backends check's verdict, and output helpers."""
import contextlib
import copy
import json
import os
import re
import time

import torch



def epoch_losses(text):
    """Last printed running loss of each epoch, from the examples-format lines."""
    last = {}
    for m in re.finditer(r"^Epoch: \[(\d+)\]\[\s*\d+/\d+\].*?Loss \S+ \((\S+)\)", text, re.M):
        last[int(m.group(1))] = float(m.group(2))
    return [last[k] for k in sorted(last)]


def train_in_process(out, args, batched=True, decode_ahead=None):
    """main.py ``args`` run in this process (output in ``out``, its log in ``out``.log); the device data
    backend crops with its batched roi_align (what accelerators run; a CPU's own choice is image by image)
    unless ``batched`` is False (then: the device's choice); ``decode_ahead`` True or False decides whether it
    prepares the next batch in a thread (None: the device's choice, ``Device.decode_ahead``). Returns (exit
    code, summary dict (the evaluation's with -e), epoch losses)."""
    import dataclasses
    from trainer import run
    from trainer.record import summary
    from trainer.config import parse_config
    from trainer.plan import plan
    parsed = parse_config(args + ["--output-dir", out, "--no-tensorboard", "--progress", "lines"], env={})
    # the device backend's ways of working have no flags: this tool asks for them in the data section
    asked = dataclasses.replace(parsed.cfg, data=parsed.cfg.data.replace(
        decode_ahead=decode_ahead, batched_crops=True if batched else None))
    cfg = plan(asked, env={}, notes=parsed.notes)
    with open(out + ".log", "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        code = run.worker(cfg)
    with open(out + ".log") as f:
        text = f.read()
    s = {}
    path = os.path.join(out, summary.EVAL_SUMMARY if cfg.run.evaluate else summary.SUMMARY)
    if os.path.exists(path):
        with open(path) as f:
            s = json.load(f)
    return code, s, epoch_losses(text)


def backends_alike(runs, gap, cross_gap):
    """(ok, detail) for {backend: {"acc1", "losses", "acc1_<other backend>"}}: every run's loss fell by a
    fifth and its Acc@1 is at least twice chance on 10 classes (20 %); the runs' Acc@1 differ by at most
    ``gap`` points (different training data: seed-like noise); each model scores within ``cross_gap``
    points when its validation images come from the other backend (the same model on the same images:
    only the pipelines differ)."""
    trained = all(len(r["losses"]) >= 2 and r["losses"][-1] < 0.8 * r["losses"][0] and r["acc1"] > 20.0
                  for r in runs.values())
    accs = [r["acc1"] for r in runs.values()]
    spread = max(accs) - min(accs)
    cross = {b: max([abs(r["acc1"] - v) for k, v in r.items() if k.startswith("acc1_")] or [0.0])
             for b, r in runs.items()}
    parts = []
    for b, r in runs.items():
        others = ", ".join("{:.1f} % through {}".format(v, k[5:]) for k, v in sorted(r.items())
                           if k.startswith("acc1_"))
        parts.append("{}: loss {} -> {}, Acc@1 {:.1f} %{}".format(
            b, _f(r["losses"][0] if r["losses"] else None), _f(r["losses"][-1] if r["losses"] else None), r["acc1"],
            " ({})".format(others) if others else ""))
    worst_cross = max(cross.values())
    ok = trained and spread <= gap and worst_cross <= cross_gap
    return ok, "; ".join(parts) + "; Acc@1 gap {:.1f} points (at most {:g}), through the other backend {:.1f} " \
        "(at most {:g})".format(spread, gap, worst_cross, cross_gap)


def overflow_contract(device, precision, fused):
    """(problem or None, optimizer name): one overflow step then two finite ones against plain SGD."""
    from trainer.precision import amp as ampmod
    from trainer import optim
    from trainer.config import OptimConfig
    torch.manual_seed(0)
    dev = device.torch_device
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
    ref = copy.deepcopy(model)
    choice = optim.build(OptimConfig(lr=0.05, momentum=0.9, weight_decay=1e-3), model, device, precision, fused=fused)
    model, step = ampmod.wrap(choice, precision, device, model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=gen).to(dev), torch.randint(0, 4, (8,), generator=gen).to(dev))
               for _ in range(3)]
    if precision.scaled:
        before = [p.detach().clone() for p in model.parameters()]
        state = copy.deepcopy(step.optimizer.state_dict()["state"])
        x, y = batches[0]
        step.zero_grad()
        step(torch.nn.functional.cross_entropy(model(x), y) * float("inf"))
        if not all(torch.equal(a, b) for a, b in zip(before, model.parameters())):
            return "parameters moved on an overflow step", step.name
        after = step.optimizer.state_dict()["state"]
        if state.keys() != after.keys() or any(not torch.equal(state[k][n], after[k][n]) for k in state
                                               for n in state[k] if torch.is_tensor(state[k][n])):
            return "momentum changed on an overflow step", step.name
    for x, y in batches:
        step.zero_grad()
        step(torch.nn.functional.cross_entropy(model(x), y))
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    worst = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
                for a, b in zip((p.detach() for p in model.parameters()), (p.detach() for p in ref.parameters())))
    if not worst <= 1e-5:
        return "finite steps differ from plain SGD (rel {:.1e})".format(worst), step.name
    return None, step.name


def bare_loop(device, arch, batch, size, steps, warm, amp_dtype="auto"):
    """images/s of a bare forward/backward/step loop with the trainer's precision choice for ``--amp
    --amp-dtype amp_dtype`` (None: float32), on one batch kept on the device (no data pipeline)."""
    import models
    from trainer.precision import amp as ampmod
    from trainer import optim
    from trainer.config import OptimConfig
    dtype = None if amp_dtype is None else device.resolve_amp_dtype(amp_dtype)[0]
    # what the trainer's native --amp (no --loss-scale: the dynamic scaler where float16 needs one) resolves to
    prec = (ampmod.Precision(amp_dtype or "auto", "none", None, None) if dtype is None else
            ampmod.Precision(amp_dtype, "native", dtype, None))
    torch.manual_seed(0)
    model = models.get_model(arch, num_classes=1000)
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    model = model.to(device.torch_device).to(memory_format=torch.channels_last)
    model, step = ampmod.wrap(optim.build(OptimConfig(lr=0.1, momentum=0.9, weight_decay=1e-4), model, device, prec),
                              prec, device, model)
    x = torch.randn(batch, 3, size, size, device=device.torch_device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device.torch_device).to(device.target_dtype)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()
    t0 = None
    for i in range(warm + steps):
        if i == warm:
            device.synchronize()
            t0 = time.time()
        with step.autocast():
            loss = criterion(model(x), y)
        step.zero_grad()
        step(loss)
    device.synchronize()
    return steps * batch / (time.time() - t0)


def auto_choice(device, arch, batch, size):
    """What ``--amp`` (auto) trains ``arch`` in on ``device`` at ``size`` px: {"choice": dtype name, ...}; where the
    device measures its choice (``Device.measures_amp_dtype``), the probe's record (precision/amp_probe.py: both rates
    and its cost, measured afresh rather than read from the cache), else {"choice", "rule"}."""
    import models
    from trainer.precision import amp_probe
    candidate, note = device.resolve_amp_dtype("auto")
    if not device.measures_amp_dtype or candidate is None:
        return {"choice": amp_probe.dtype_name(candidate), "rule": note or "the device's rule"}
    torch.manual_seed(0)
    model = models.get_model(arch, num_classes=1000)
    if hasattr(model, "set_index_dtype"):
        model.set_index_dtype(device.index_dtype)
    model = model.to(device.torch_device).to(memory_format=torch.channels_last)
    shape = {"arch": arch, "size": size, "batch": min(amp_probe.BATCH, batch), "channels_last": True,
             "backward": True}
    return amp_probe.measure(model, device, shape, candidate, cache=False).as_dict()


def fps_amp(device, arch, batch, size):
    """(main.py's precision flags, ``bare_loop``'s amp_dtype) of check_device's FPS checks: --amp, and the dtype it
    trains in; where the device measures its choice, measured once here and given to both (one verdict)."""
    if not device.measures_amp_dtype:
        return ["--amp"], "auto"
    choice = auto_choice(device, arch, batch, size)["choice"]
    return (["--amp", "--amp-dtype", choice], choice) if choice != "float32" else ([], None)


def describe_auto(auto):
    """One line for ``auto_choice``'s answer."""
    if "float32_img_s" not in auto:
        return "auto: {} ({})".format(auto["choice"], auto["rule"])
    return "auto: {} (probe: float32 {:.1f}, bfloat16 {:.1f} img/s = x{:.2f}, {:.1f} s)".format(
        auto["choice"], auto["float32_img_s"], auto["bfloat16_img_s"], auto["bfloat16_over_float32"], auto["seconds"])


def amp_dtype_verdict(device, arch, batch, size, steps, warm, slack=0.9):
    """(ok, detail, values) of the amp-dtype check: ``auto_choice`` beside bare loops (``bare_loop``) of float32
    and of the dtype auto offers, two rounds interleaved. ok: auto's choice runs at least ``slack`` of the other's
    images/s (--amp is never a slowdown); nothing to compare where auto is float32 by the device's rule (bfloat16
    is emulated there: its loop would take minutes)."""
    auto = auto_choice(device, arch, batch, size)
    offered = device.resolve_amp_dtype("auto")[0]
    if offered is None:
        return True, "{} bs {} {} px: {}".format(arch, batch, size, describe_auto(auto)), {"auto": auto}
    other = str(offered).replace("torch.", "")
    loops = {"float32": [], other: []}
    for _ in range(2):
        for name in loops:
            loops[name].append(bare_loop(device, arch, batch, size, steps, warm, None if name == "float32" else other))
    fps = {k: sum(v) / len(v) for k, v in loops.items()}
    chosen = auto["choice"]
    rest = [k for k in fps if k != chosen]
    ratio = fps[chosen] / fps[rest[0]] if rest and fps[rest[0]] else 1.0
    detail = "{} bs {} {} px: bare loops {}; {}: x{:.2f} the other".format(
        arch, batch, size, ", ".join("{} {:.1f} img/s".format(k, v) for k, v in fps.items()), describe_auto(auto),
        ratio)
    return ratio >= slack, detail, {"auto": auto, "bare_fps": fps, "bare_runs": loops, "ratio": ratio}


class _Capture:
    def __init__(self):
        self.parts = []

    def write(self, s):
        self.parts.append(s)

    def flush(self):
        pass

    def text(self):
        return "".join(self.parts)


def _tail(text, n=300):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:n]


def _f(v):
    return "-" if v is None else "{:.3f}".format(v)
