"""SGD with momentum: the device's fastest implementation that is safe with a loss scaler.

The device says what it has (``Device.native_fused_sgd``: a vendor's fused SGD such as torch_npu's
NpuFusedSGD; ``Device.prefers_torch_fused_sgd``: whether torch's fused kernel is the default there); this
module picks among them and proves at start-up, on the device, that torch's fused SGD skips an overflow step.
"""
import inspect

import torch

from trainer.optim import groups
from trainer.optim.choice import OptimizerChoice


SGDChoice = OptimizerChoice  # the name it had when SGD was the only optimizer


def zero_momentum_buffers(optimizer):
    """Create every SGD momentum buffer as zeros now (first step then equals torch's: buf = grad)."""
    for group in optimizer.param_groups:
        if group.get("momentum", 0) == 0:
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


_fused_sgd_verdict = {}


def fused_sgd_skips_overflow(device):
    """Prove on ``device`` that torch's fused SGD + GradScaler skips an overflow step entirely.

    Runs one tiny step with an inf gradient, then one finite step, and compares parameters and momentum
    bitwise with the expected values. Cached per device; False when anything in it fails.
    """
    key = device.name
    if key not in _fused_sgd_verdict:
        try:
            _fused_sgd_verdict[key] = _probe_fused_sgd(device)
        except Exception:
            _fused_sgd_verdict[key] = False
    return _fused_sgd_verdict[key]


def _probe_fused_sgd(device):
    dev = device.torch_device
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0, 0.5], device=dev))
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9, weight_decay=0.01, fused=True)
    zero_momentum_buffers(opt)
    scaler = device.grad_scaler(None)
    before = w.detach().clone()
    buf_before = opt.state[w]["momentum_buffer"].clone()
    scaler.scale((w * torch.tensor([1.0, float("inf"), 1.0, 1.0], device=dev)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    if not (torch.equal(w.detach(), before) and torch.equal(opt.state[w]["momentum_buffer"], buf_before)):
        return False
    g = torch.tensor([0.25, 0.5, -1.0, 2.0], device=dev)
    opt.zero_grad()
    scaler.scale((w * g).sum()).backward()
    scaler.step(opt)
    scaler.update()
    d = g + 0.01 * before  # first finite step of torch's SGD: buf = d, w -= lr * buf
    return bool(torch.allclose(w.detach(), before - 0.5 * d, rtol=1e-6, atol=1e-7))


def torch_has_fused_sgd():
    return "fused" in inspect.signature(torch.optim.SGD).parameters


def build_sgd(params, lr, momentum, decay, device, with_scaler=False, apex_amp_in_use=False, fused=None):
    """An ``OptimizerChoice``: SGD with momentum for ``device``, safe with a GradScaler (``params``: parameters,
    or a model; ``decay``: an optim.WeightDecay, the norm parameters' and biases' in a group of their own where
    given: trainer/optim/groups.py).

    ``fused`` None: the device's fastest SGD (its vendor's fused SGD where it has one, torch's fused SGD where
    the device prefers it, torch's default elsewhere); True/False forces torch's fused kernel on or off (tests
    exercise the accelerator pairing on the CPU this way). torch's fused SGD is used with a GradScaler only
    when ``fused_sgd_skips_overflow`` proves, on this device, that an overflow step leaves parameters and
    momentum untouched; its momentum buffers are created as zeros up front, because torch creates them with
    ``empty_like`` on the first step and an overflow there leaves them garbage.
    """
    if not isinstance(params, torch.nn.Module):
        params = list(params)
    weight_decay = decay.weights
    param_groups, names = groups.weight_decay_groups(params, weight_decay, decay.norm_and_bias)
    if fused is None:
        native = device.native_fused_sgd(apex_amp_in_use)
        if native is not None:
            opt_cls, name = native
            # vendor fused optimizers keep gradients in one flat buffer: zero_grad(set_to_none=True) raises
            return OptimizerChoice(opt_cls(param_groups, lr=lr, momentum=momentum, weight_decay=weight_decay), name,
                                   grads_to_none=False, groups=names)
    want = device.prefers_torch_fused_sgd if fused is None else bool(fused)
    note = None
    if want and not torch_has_fused_sgd():
        want = False
    if want and with_scaler and not fused_sgd_skips_overflow(device):
        want = False
        note = ("torch {}'s fused SGD does not skip overflow steps cleanly on {}: using the unfused SGD "
                "with the loss scaler".format(torch.__version__, device.name))
    if want:
        opt = torch.optim.SGD(param_groups, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True)
        zero_momentum_buffers(opt)
        return OptimizerChoice(opt, "torch.optim.SGD(fused)", grads_to_none=True, note=note, groups=names)
    return OptimizerChoice(torch.optim.SGD(param_groups, lr=lr, momentum=momentum, weight_decay=weight_decay),
                           "torch.optim.SGD", grads_to_none=True, note=note, groups=names)


def after_load(optimizer):
    """Called after ``load_state_dict`` from a checkpoint: fused SGD's momentum buffers exist from the start
    (a checkpoint saved before any step has none)."""
    if optimizer.defaults.get("fused"):
        zero_momentum_buffers(optimizer)
