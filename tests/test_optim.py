"""Optimizers by name (trainer/optim): the registry and --optimizer, LARS's update against a hand computation,
its BatchNorm/bias exclusion, the overflow-skip contract under a loss scaler, and exact resume of a real run."""
import copy
import json
import math
import os
import subprocess

import pytest
import torch

from conftest import (IMPORTS_FAKE_NPU, ONCE, PY, ROOT, SMALL, STACK, assert_one_line_error, needs_cpu_float16,
                      read_summary, run_main)
from trainer.precision import amp as ampmod
from trainer import optim
from trainer.config import OptimConfig, build_parser
from trainer.device import Device, torch_load
from trainer.errors import UsageError
from trainer.optim.lars import LARS, lars_groups

pytestmark = [STACK, pytest.mark.timeout(300)]

CPU = Device("cpu", None)
LR, MOMENTUM, WD = 0.05, 0.9, 1e-3


# ---------------------------------------------------------------- the registry


def test_registry_names_are_the_flag_choices_and_each_builds():
    action = next(a for a in build_parser()._actions if a.dest == "optimizer")
    assert tuple(action.choices) == tuple(optim.OPTIMIZERS) and action.default == optim.DEFAULT_OPTIMIZER
    assert set(optim.OPTIMIZERS) >= {"sgd", "lars"}
    for name in optim.OPTIMIZERS:
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        choice = optim.create_optimizer(name, model, LR, MOMENTUM, WD, CPU)
        assert isinstance(choice.optimizer, torch.optim.Optimizer) and choice.name
        got = {id(p) for g in choice.optimizer.param_groups for p in g["params"]}
        assert got == {id(p) for p in model.parameters()}, name  # every parameter, once
    assert optim.create_optimizer("sgd", model, LR, MOMENTUM, WD, CPU).name.startswith("torch.optim.SGD")
    assert optim.create_optimizer("lars", model, LR, MOMENTUM, WD, CPU).name == "trainer.optim.LARS"
    with pytest.raises(UsageError, match="--optimizer 'adamw' is not known: choose one of sgd, lars"):
        optim.create_optimizer("adamw", model, LR, MOMENTUM, WD, CPU)
    with pytest.raises(UsageError, match="no fused kernel"):
        optim.create_optimizer("lars", model, LR, MOMENTUM, WD, CPU, fused=True)


@ONCE
def test_the_flag_parses_without_importing_torch():
    code = ("import sys; from trainer.config import build_parser; "
            "print(build_parser().parse_args(['--optimizer', 'lars']).optimizer, 'torch' in sys.modules)")
    proc = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["lars", "False"], proc.stderr


@ONCE
def test_bogus_optimizer_is_one_line():
    assert_one_line_error(run_main(["--dummy", "--optimizer", "bogus"]), "--optimizer", "'bogus'", "sgd", "lars")


# ---------------------------------------------------------------- LARS's update


def norm(values):
    return math.sqrt(sum(v * v for v in values))


def test_lars_matches_a_hand_computation():
    """Two steps on one 2x2 weight and its bias, every number computed here in plain Python."""
    w0, b0 = [0.5, -1.0, 2.0, 0.25], [0.1, -0.2]
    layer = torch.nn.Linear(2, 2).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(w0, dtype=torch.float64).view(2, 2))
        layer.bias.copy_(torch.tensor(b0, dtype=torch.float64))
    lr, mom, wd, eta = 0.1, 0.9, 0.01, 0.02
    opt = LARS(lars_groups(layer, wd), lr=lr, momentum=mom, weight_decay=wd, eta=eta)
    grads = [([0.3, -0.4, 1.0, 2.0], [0.5, -1.5]), ([-0.2, 0.1, 0.7, -0.3], [1.0, 0.25])]
    w, b, vw, vb = list(w0), list(b0), [0.0] * 4, [0.0] * 2
    for gw, gb in grads:
        layer.weight.grad = torch.tensor(gw, dtype=torch.float64).view(2, 2)
        layer.bias.grad = torch.tensor(gb, dtype=torch.float64)
        opt.step()
        trust = eta * norm(w) / (norm(gw) + wd * norm(w))
        vw = [mom * v + trust * (g + wd * x) for v, g, x in zip(vw, gw, w)]
        w = [x - lr * v for x, v in zip(w, vw)]
        vb = [mom * v + g for v, g in zip(vb, gb)]  # the bias: no trust ratio, no weight decay
        b = [x - lr * v for x, v in zip(b, vb)]
        assert layer.weight.detach().view(-1).tolist() == pytest.approx(w, rel=1e-12, abs=1e-15)
        assert layer.bias.detach().tolist() == pytest.approx(b, rel=1e-12, abs=1e-15)
        assert opt.state[layer.weight]["momentum_buffer"].view(-1).tolist() == pytest.approx(vw, rel=1e-12)
    assert trust != pytest.approx(1.0)  # the ratio did scale the weight's step


def test_lars_trust_ratio_is_one_where_a_norm_is_zero():
    w = torch.nn.Parameter(torch.zeros(3, 2))
    opt = LARS([w], lr=0.5, momentum=0.0, weight_decay=0.1)
    w.grad = torch.ones(3, 2)
    opt.step()
    assert torch.equal(w.detach(), torch.full((3, 2), -0.5))  # ||w|| = 0: the plain SGD step


def bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(16, 3))


def test_batchnorm_and_biases_are_excluded_from_trust_ratio_and_weight_decay():
    model = bn_model().double()  # float64: the weights' steps are ~1e-8 of the weights
    conv, bn, fc = model[0], model[1], model[4]
    groups = lars_groups(model, WD)
    assert [id(p) for p in groups[0]["params"]] == [id(conv.weight), id(fc.weight)]
    assert {id(p) for p in groups[1]["params"]} == {id(bn.weight), id(bn.bias), id(fc.bias)}
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["lars_exclude"] is True
    # bare parameters: 1-D ones (biases, norm scales) are the excluded ones
    bare = lars_groups(list(model.parameters()), WD)
    assert [len(g["params"]) for g in bare] == [2, 3]

    opt = LARS(groups, lr=LR, momentum=MOMENTUM, weight_decay=WD)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 2])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    for n, p in model.named_parameters():
        step = before[n] - p.detach()
        if n in ("1.weight", "1.bias", "4.bias"):  # exactly lr * g: no ratio, no decay
            torch.testing.assert_close(step, LR * grads[n], rtol=1e-9, atol=1e-15)
        else:
            d = grads[n] + WD * before[n]
            trust = 0.001 * before[n].norm() / (grads[n].norm() + WD * before[n].norm())
            torch.testing.assert_close(step, LR * trust * d, rtol=1e-7, atol=1e-15)
            assert float(trust) < 0.5  # eta 0.001: a real scaling, not the identity


# ---------------------------------------------------------------- under a loss scaler


def snapshot(model, optimizer):
    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(optimizer.state_dict()["state"])


def same(a, b):
    if a[1].keys() != b[1].keys():
        return False
    tensors_equal = all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    return tensors_equal and all(torch.equal(a[1][k]["momentum_buffer"], b[1][k]["momentum_buffer"]) for k in a[1])


@needs_cpu_float16
@pytest.mark.parametrize("loss_scale", [None, 128.0])
def test_lars_overflow_step_changes_nothing_and_next_steps_equal_plain_lars(loss_scale):
    model = bn_model()
    ref = copy.deepcopy(model)
    prec = ampmod.Precision("float16", "native", torch.float16, loss_scale)
    model, step = ampmod.wrap(optim.build(OptimConfig("lars", LR, MOMENTUM, WD), model, CPU, prec), prec, CPU, model)
    assert isinstance(step.optimizer, LARS) and step.name == "trainer.optim.LARS"
    ref_opt = LARS(lars_groups(ref, WD), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    poison = {"on": True}
    next(model.parameters()).register_hook(lambda g: g.clone().fill_(float("inf")) if poison["on"] else g)
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(4, 3, 4, 4, generator=gen), torch.randint(0, 3, (4,), generator=gen)

    before = snapshot(model, step.optimizer)
    step.zero_grad()
    assert float(step(torch.nn.functional.cross_entropy(model(x), y))) == 1.0
    assert same(before, snapshot(model, step.optimizer)), "an overflow step changed weights or momentum"
    assert step.overflow_steps() == 1
    poison["on"] = False
    ref.load_state_dict(model.state_dict())  # BN running statistics moved in the skipped forward
    for _ in range(3):
        step.zero_grad()
        step(torch.nn.functional.cross_entropy(model(x), y))
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
    assert step.overflow_steps() == 1


def test_lars_state_round_trips_through_a_state_dict():
    model = bn_model()
    opt = LARS(lars_groups(model, WD), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.tensor([1, 0])).backward()
        opt.step()
    twin = copy.deepcopy(model)
    opt2 = LARS(lars_groups(twin, WD), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for m, o in ((model, opt), (twin, opt2)):
        o.zero_grad()
        torch.nn.functional.cross_entropy(m(x), torch.tensor([1, 0])).backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


# ---------------------------------------------------------------- whole runs

BASE = ["-a", "resnet18", "-b", "8", "--max-steps-per-epoch", "3", "--seed", "4", "--lr", "0.2"] + SMALL
RUN = BASE + ["--optimizer", "lars"]


def test_lars_run_resumes_exactly_and_a_resume_with_another_optimizer_is_one_line(shapes, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    proc = run_main([shapes, "--epochs", "2", "--output-dir", str(full)] + RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_summary(full)
    assert s["optimizer"] == "trainer.optim.LARS" and s["amp"]["optimizer"] == "trainer.optim.LARS"
    first = run_main([shapes, "--epochs", "1", "--output-dir", str(part)] + RUN)
    assert first.returncode == 0, first.stderr[-3000:]

    wrong = run_main([shapes, "--epochs", "2", "--resume", "auto", "--output-dir", str(part)] + BASE)
    assert_one_line_error(wrong, "trained with --optimizer lars", "asks for --optimizer sgd",
                          "resume with --optimizer lars")

    resumed = run_main([shapes, "--epochs", "2", "--resume", "auto", "--output-dir", str(part)] + RUN)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "=> resumed" in resumed.stdout
    a = torch_load(os.path.join(str(full), "checkpoint.pth.tar"))
    b = torch_load(os.path.join(str(part), "checkpoint.pth.tar"))
    assert a["config"]["optimizer"] == b["config"]["optimizer"] == "lars"
    assert a["epoch"] == b["epoch"] == 2
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) == sum(len(g["params"]) for g in a["optimizer"]["param_groups"])
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]), k
    groups = a["optimizer"]["param_groups"]
    assert [g["lars_exclude"] for g in groups] == [False, True] and groups[1]["weight_decay"] == 0.0


# ---------------------------------------------------------------- the NPU paths (tests/fake_npu)

NPU_SCRIPT = r"""
import json, torch
import torch_npu, apex  # the fakes
assert getattr(torch_npu, "FAKE", False)
from trainer.precision import amp as ampmod
from trainer.device import Device
from trainer.optim import create_optimizer
from trainer.optim.lars import LARS
dev = Device.create("npu", 0)
obs = {"sgd": create_optimizer("sgd", torch.nn.Linear(4, 3), 0.1, 0.9, 0.0, dev).name}
choice = create_optimizer("lars", torch.nn.Linear(4, 3), 0.1, 0.9, 0.0, dev, apex_amp_in_use=True)
obs["lars"], obs["lars_to_none"] = choice.name, choice.grads_to_none
for impl in ("native", "apex"):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    prec = ampmod.Precision("float16", impl, torch.float16, 128.0, "O2" if impl == "apex" else None)
    m, step = ampmod.wrap(create_optimizer("lars", m, 0.1, 0.9, 1e-4, dev, with_scaler=prec.scaled,
                                           apex_amp_in_use=impl == "apex"), prec, dev, m)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    trace = []
    for i in range(3):
        before = [p.detach().clone() for p in m.parameters()]
        with step.autocast():
            loss = torch.nn.functional.cross_entropy(m(x).float(), y)
        step.zero_grad()
        step(loss * float("inf") if i == 0 else loss)
        trace.append(all(torch.equal(a, p.detach()) for a, p in zip(before, m.parameters())))
    obs[impl] = {"name": step.name, "lars": isinstance(step.optimizer, LARS) or
                 isinstance(getattr(step.optimizer, "optimizer", None), LARS),
                 "unchanged": trace, "overflows": step.overflow_steps()}
obs["apex_initialized"] = [c[0] for c in apex.calls].count("initialize")
print(json.dumps(obs))
"""


@IMPORTS_FAKE_NPU
def test_lars_on_the_npu_paths_native_and_apex():
    """On NPU the SGD is the device's NpuFusedSGD; LARS is this package's own, under torch_npu's GradScaler and
    under Ascend apex.amp alike, and skips an overflow step in both."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests", "fake_npu"), ROOT]),
               FAKE_NPU_DEVICE_COUNT="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([PY, "-c", NPU_SCRIPT], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    obs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert obs["sgd"] == "torch_npu.optim.NpuFusedSGD"
    assert obs["lars"] == "trainer.optim.LARS" and obs["lars_to_none"] is True
    for impl in ("native", "apex"):
        assert obs[impl]["name"] == "trainer.optim.LARS" and obs[impl]["lars"], obs
        assert obs[impl]["unchanged"] == [True, False, False], (impl, obs)
        assert obs[impl]["overflows"] == 1, (impl, obs)
    assert obs["apex_initialized"] == 1


# ---------------------------------------------------------------- --lr-schedule poly (MLPerf ResNet-50 with LARS)


def poly(lr, t, warm, total, end=1e-4):
    """MLPerf's LARS schedule at global step ``t``: linear warm-up, then (lr - end) x (1 - progress)^2 + end."""
    if t < warm:
        return lr * (t + 1) / warm
    end = min(end, lr)
    return end + (lr - end) * (1 - (t - warm) / float(total - warm)) ** 2


@ONCE
def test_poly_schedule_is_mlperfs_polynomial_per_step_and_per_epoch():
    from trainer.optim.schedule import Schedule
    s = Schedule(10.5, "poly", 5, 1, 4)
    assert [s(e, i) for e in range(5) for i in range(4)] == pytest.approx(
        [poly(10.5, t, 4, 20) for t in range(20)], rel=1e-12)
    assert s(1, 0) == 10.5 and s(4, 3) == pytest.approx(1e-4 + (10.5 - 1e-4) / 256)  # peak after warm-up; near end
    assert all(a > b for a, b in zip([s(e, i) for e in range(1, 5) for i in range(4)],
                                     [s(e, i) for e in range(1, 5) for i in range(4)][1:]))  # falls every step
    assert Schedule(5e-5, "poly", 3, 0, 2)(2, 1) == 5e-5  # an LR below the end LR stays put
    per_epoch = Schedule(10.5, "poly", 5, 1, 4, unit="epoch")
    assert [per_epoch(e, 2) for e in range(5)] == pytest.approx(
        [10.5 / 1] + [1e-4 + (10.5 - 1e-4) * (1 - (e - 1) / 4.0) ** 2 for e in range(1, 5)])


@ONCE
def test_a_lars_run_with_the_poly_schedule_follows_it_every_step(shapes, tmp_path):
    out = str(tmp_path)
    proc = run_main([shapes, "--output-dir", out, "--device", "cpu", "-a", "tiny_cnn", "-b", "16", "--lr", "2.0",
                     "--optimizer", "lars", "--lr-schedule", "poly", "--warmup-epochs", "1", "--epochs", "3",
                     "--max-steps-per-epoch", "2", "--no-validate"] + SMALL + ["-p", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lrs = [lr for r in map(json.loads, f) for _, lr in r["step_lrs"]]
    assert lrs == pytest.approx([poly(2.0, t, 2, 6) for t in range(6)], rel=1e-12)
    assert torch_load(os.path.join(out, "checkpoint.pth.tar"))["lr_schedule"]["kind"] == "poly"
