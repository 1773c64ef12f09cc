"""Mixed precision you can trust: the optimizer x loss-scaler contract for every pairing the device
layer can return, the --amp-dtype decision with the capability probes forced both ways, and the
divergence guard (in-process units, then whole runs on 1 and 2 processes)."""
import copy
import inspect
import os

import pytest
import torch

from conftest import (ONCE, RANKS, SMALL, STACK, WAYS, assert_one_line_error, needs_cpu_float16, read_summary,
                      run_main)
from trainer.precision import amp as ampmod
from trainer import device as devmod
from trainer.device import Device
from trainer.device import host as hostmod
from trainer import optim
from trainer.config import OptimConfig
from trainer.optim import create_optimizer
from trainer.optim import sgd as sgdmod
from trainer.guard import MAX_CONSECUTIVE_OVERFLOWS, Diverged, Guard
from trainer.job.distributed import Dist

pytestmark = [STACK, pytest.mark.timeout(300)]

CPU = Device("cpu", None)
HAS_FUSED_CPU = "fused" in __import__("inspect").signature(torch.optim.SGD).parameters
LR, MOMENTUM, WD = 0.05, 0.9, 1e-3


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def precision(kind, loss_scale=None):
    if kind == "fp32":
        return ampmod.Precision("auto", "none", None, None)
    if kind == "bf16":
        return ampmod.Precision("bfloat16", "native", torch.bfloat16, None)
    return ampmod.Precision("float16", "native", torch.float16, loss_scale)


def _stepped(prec, model, fused=None):
    """(model, OptimizerStep) as the trainer builds them: trainer.optim's SGD for ``prec``, stepped by amp.wrap."""
    choice = optim.build(OptimConfig(lr=LR, momentum=MOMENTUM, weight_decay=WD), model, CPU, prec, fused=fused)
    return ampmod.wrap(choice, prec, CPU, model)


# (precision, loss scale, fused SGD): every pairing trainer.optim's SGD + amp.wrap can return off NPU
PAIRINGS = [("fp32", None, False), ("bf16", None, False), ("fp16", None, False), ("fp16", 128.0, False)]
if HAS_FUSED_CPU:
    PAIRINGS += [("bf16", None, True), ("fp16", None, True), ("fp16", 128.0, True)]
PAIRINGS = [pytest.param(*p, marks=needs_cpu_float16) if p[0] == "fp16" else p for p in PAIRINGS]


def snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    state = copy.deepcopy(optimizer.state_dict()["state"])
    return params, state


def same_state(a, b):
    if a.keys() != b.keys():
        return False
    for k in a:
        if a[k].keys() != b[k].keys():
            return False
        for name in a[k]:
            x, y = a[k][name], b[k][name]
            if torch.is_tensor(x) and not torch.equal(x, y):
                return False
    return True


@pytest.mark.parametrize("kind,loss_scale,fused", PAIRINGS)
def test_overflow_step_changes_nothing_and_next_steps_equal_plain_sgd(kind, loss_scale, fused):
    model = tiny_model()
    ref = copy.deepcopy(model)
    model, step = _stepped(precision(kind, loss_scale), model, fused=fused)
    assert step.optimizer.defaults.get("fused") in ((True,) if fused else (None, False))
    # the reference: torch's single-tensor SGD (torch 1.11's SGD is that one and takes no ``foreach``)
    loop = {"foreach": False} if "foreach" in inspect.signature(torch.optim.SGD).parameters else {}
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD, **loop)
    poison = {"on": False}
    first_weight = next(model.parameters())
    first_weight.register_hook(lambda g: g.clone().fill_(float("inf")) if poison["on"] else g)
    x, y = batch(0)

    # step 0 (the optimizer's very first step, where torch's fused SGD creates its momentum) overflows
    before = snapshot(model, step.optimizer)
    poison["on"] = kind == "fp16"  # only a loss scaler can skip; unscaled runs see a finite step 0
    if kind == "fp16":
        step.zero_grad()
        found = step(torch.nn.functional.cross_entropy(model(x), y))
        assert float(found) == 1.0
        after = snapshot(model, step.optimizer)
        assert all(torch.equal(a, b) for a, b in zip(before[0], after[0])), "parameters moved on an overflow"
        assert same_state(before[1], after[1]), "optimizer state (momentum) changed on an overflow"
        assert step.overflow_steps() == 1
    poison["on"] = False

    # then finite steps: exactly what plain SGD does from the same weights
    for i in range(3):
        x, y = batch(i)
        step.zero_grad()
        step(torch.nn.functional.cross_entropy(model(x), y))
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-6, atol=1e-7)
    if kind == "fp16":
        assert step.overflow_steps() == 1
        expected = 128.0 if loss_scale else 65536.0 / 2
        assert step.loss_scale() == expected


@pytest.mark.skipif(not HAS_FUSED_CPU, reason="this torch has no fused SGD")
def test_fused_sgd_probe_passes_and_catches_a_broken_pairing(monkeypatch):
    sgdmod._fused_sgd_verdict.clear()
    assert sgdmod.fused_sgd_skips_overflow(CPU) is True
    # without zero-initialised momentum, torch's fused SGD leaves garbage momentum after an overflow on
    # its first step: the probe must see it and the device layer must fall back to the unfused SGD
    sgdmod._fused_sgd_verdict.clear()
    monkeypatch.setattr(sgdmod, "zero_momentum_buffers", lambda opt: None)
    assert sgdmod.fused_sgd_skips_overflow(CPU) is False
    choice = create_optimizer("sgd", tiny_model().parameters(), LR, MOMENTUM, WD, CPU, with_scaler=True,
                              fused=True)
    assert not choice.optimizer.defaults.get("fused") and choice.name == "torch.optim.SGD"
    assert "does not skip overflow steps" in choice.note
    # without a scaler there is no overflow to skip: fused stays
    assert create_optimizer("sgd", tiny_model().parameters(), LR, MOMENTUM, WD, CPU, with_scaler=False,
                            fused=True).fused
    sgdmod._fused_sgd_verdict.clear()


@needs_cpu_float16
def test_resume_restores_scaler_and_overflow_count():
    model, step = _stepped(precision("fp16", None), tiny_model())
    x, y = batch(0)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    step.zero_grad()
    step(loss * float("inf"))
    entries = step.checkpoint_entries()
    assert set(entries) == {"optimizer", "precision", "scaler"}  # no "amp": that key is apex's (the guide's)
    model2, step2 = _stepped(precision("fp16", None), tiny_model())
    notes = []
    step2.restore(entries, notes.append)
    assert step2.loss_scale() == 32768.0 and step2.overflow_steps() == 1 and not notes
    # a format-1 checkpoint of this project kept it all under "amp"
    legacy = {"optimizer": entries["optimizer"], "amp": dict(entries["precision"], scaler=entries["scaler"])}
    _, step4 = _stepped(precision("fp16", None), tiny_model())
    step4.restore(legacy, notes.append)
    assert step4.loss_scale() == 32768.0 and step4.overflow_steps() == 1 and not notes
    _, step3 = _stepped(precision("bf16"), tiny_model())
    step3.restore(entries, notes.append)
    assert "not restored" in notes[0]


# ---------------------------------------------------------------- --amp-dtype decision


@ONCE
@pytest.mark.parametrize("native", [True, False])
def test_cpu_auto_dtype_follows_the_bf16_probe(monkeypatch, native):
    monkeypatch.setattr(hostmod, "cpu_native_bf16", lambda: native)
    dtype, note = CPU.resolve_amp_dtype("auto")
    if native:
        assert dtype == torch.bfloat16 and note is None
    else:
        assert dtype is None and "no native bfloat16" in note and "float32" in note
    # an explicit request is honoured either way, with a warning where it will be slow
    dtype, note = CPU.resolve_amp_dtype("bfloat16")
    assert dtype == torch.bfloat16 and (note is None) == native


@ONCE
def test_cpu_auto_dtype_is_float32_on_a_torch_without_native_bf16_kernels(monkeypatch):
    """torch 1.11 on an AVX-512 BF16 CPU: bfloat16 autocast measured about 115x float32's step (docs/PRECISION.md),
    so auto trains in float32 without timing it, and a forced bfloat16 is warned of."""
    monkeypatch.setattr(hostmod, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(torch, "__version__", "1.11.0+cu102")
    dtype, note = CPU.resolve_amp_dtype("auto")
    assert dtype is None and "torch 1.11.0+cu102's CPU kernels have no native bfloat16" in note and "float32" in note
    dtype, note = CPU.resolve_amp_dtype("bfloat16")
    assert dtype == torch.bfloat16 and "expect float32 to be several times faster" in note
    monkeypatch.setattr(torch, "__version__", "2.1.0")
    assert CPU.resolve_amp_dtype("auto") == (torch.bfloat16, None)


@ONCE
@pytest.mark.parametrize("capability,expected", [((7, 0), torch.float16), ((8, 0), torch.bfloat16),
                                                 ((9, 0), torch.bfloat16)])
def test_cuda_auto_dtype_follows_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    assert Device("cuda", 0).resolve_amp_dtype("auto") == (expected, None)


@ONCE
def test_cpu_bf16_probe_reads_cpuinfo_when_torch_has_no_probe(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert "avx512_bf16" in hostmod._cpuinfo_flags(str(info))
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", None, raising=False)
    monkeypatch.setattr(hostmod, "_cpuinfo_flags", lambda path=None: {"avx2", "avx512_bf16"})
    assert hostmod.cpu_native_bf16() is True
    monkeypatch.setattr(hostmod, "_cpuinfo_flags", lambda path=None: {"avx2", "fma"})
    assert hostmod.cpu_native_bf16() is False
    monkeypatch.setattr(hostmod, "_cpuinfo_flags", lambda path=None: {"fp", "asimd", "bf16"})  # aarch64
    assert hostmod.cpu_native_bf16() is True


@WAYS
def test_amp_on_this_cpu_is_never_a_slow_bf16_run(shapes, tmp_path):
    proc = run_main([shapes, "--epochs", "1", "--amp", "--max-steps-per-epoch", "2", "--output-dir",
                     str(tmp_path), "-a", "tiny_cnn", "-b", "8"] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    amp = read_summary(tmp_path)["amp"]
    if not devmod.cpu_slow_bf16():  # measured: the faster of the two (tests/test_amp_probe.py forces each)
        assert amp["dtype"] == amp["probe"]["choice"] and amp["enabled"] == (amp["dtype"] == "bfloat16")
    else:
        assert amp["dtype"] == "float32" and not amp["enabled"] and "no native bfloat16" in amp["note"]
        assert "no native bfloat16" in proc.stdout


@ONCE
def test_amp_dtype_needs_amp():
    assert_one_line_error(run_main(["--dummy", "--amp-dtype", "bfloat16"]), "--amp-dtype bfloat16 needs --amp")


# ---------------------------------------------------------------- divergence guard


@ONCE
def test_guard_reports_first_non_finite_step():
    g = Guard(CPU)
    for loss in (1.0, 2.0, float("nan"), float("inf"), 1.0):
        g.observe(torch.tensor(loss), None)
    with pytest.raises(Diverged) as exc:
        g.check(Dist(), 3, lambda i: 0.1 * (i + 1))
    assert exc.value.info["step"] == 3 and exc.value.info["lr"] == pytest.approx(0.3)
    assert "epoch 3 step 3" in exc.value.message() and "lower --lr" in exc.value.message()


@ONCE
def test_guard_counts_consecutive_overflows_only():
    g = Guard(CPU)
    pattern = [1] * MAX_CONSECUTIVE_OVERFLOWS + [0] + [1] * 5  # a long run that ended is within the limit
    for f in pattern:
        g.observe(torch.tensor(1.0), torch.tensor(float(f)))
    g.check(Dist(), 0, lambda i: 0.1)
    g.observe(torch.tensor(1.0), 1)  # host flags (apex) count alike
    for _ in range(MAX_CONSECUTIVE_OVERFLOWS):
        g.observe(torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(Diverged, match="consecutive steps skipped"):
        g.check(Dist(), 0, lambda i: 0.1, lambda: 1e-20)


HUGE = ["-a", "tiny_cnn", "-b", "8", "--seed", "3", "--max-steps-per-epoch", "4", "-p", "2"] + SMALL


def _files(folder):
    return {f: open(os.path.join(str(folder), f), "rb").read()
            for f in ("checkpoint.pth.tar", "model_best.pth.tar") if os.path.exists(os.path.join(str(folder), f))}


@pytest.mark.parametrize("procs", [1, pytest.param(2, marks=RANKS)])
def test_huge_lr_stops_as_diverged_and_keeps_the_last_good_checkpoints(shapes, tmp_path, procs):
    dist = [] if procs == 1 else ["--multiprocessing-distributed", "--device-list", "0,1", "--port", "0"]
    good = run_main([shapes, "--epochs", "1", "--output-dir", str(tmp_path)] + HUGE + dist)
    assert good.returncode == 0, good.stderr[-3000:]
    kept = _files(tmp_path)
    assert len(kept) == 2
    proc = run_main([shapes, "--epochs", "3", "--resume", "auto", "--lr", "1e12", "--output-dir", str(tmp_path)]
                    + HUGE + dist)
    assert proc.returncode == 4, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: training diverged at epoch 1"), proc.stderr
    assert "Traceback" not in proc.stderr
    s = read_summary(tmp_path)
    assert s["status"] == "diverged" and s["diverged"]["lr"] == 1e12 and s["epochs_completed"] == 1
    assert s["diverged"]["reason"] == "non-finite training loss"
    assert _files(tmp_path) == kept  # byte for byte: no NaN weights were written
