"""SGD with momentum: the device's fastest implementation that is safe with a loss scaler. The device says what it
has (``Device.native_fused_sgd``, e.g. torch_npu's NpuFusedSGD; ``Device.prefers_torch_fused_sgd``); this module
picks, and proves at start-up on the device that torch's fused SGD skips an overflow step."""
import inspect

import torch

from trainer.optim import groups
from trainer.optim.choice import OptimizerChoice


def zero_momentum_buffers(optimizer):
    """Create every SGD momentum buffer as zeros now (first step then equals torch's: buf = grad)."""
    for group in optimizer.param_groups:
        for p in group["params"] if group.get("momentum", 0) else ():
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


_fused_sgd_verdict = {}


def fused_sgd_skips_overflow(device):
    """Whether torch's fused SGD + GradScaler skips an overflow step entirely, proven bitwise on ``device`` (cached)."""
    if device.name not in _fused_sgd_verdict:
        try:
            _fused_sgd_verdict[device.name] = _probe_fused_sgd(device)
        except Exception:
            _fused_sgd_verdict[device.name] = False
    return _fused_sgd_verdict[device.name]


def _probe_fused_sgd(device):
    dev = device.torch_device
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0, 0.5], device=dev))
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9, weight_decay=0.01, fused=True)
    zero_momentum_buffers(opt)
    scaler = device.grad_scaler(None)
    before, buf_before = w.detach().clone(), opt.state[w]["momentum_buffer"].clone()
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


def build_sgd(params, lr, momentum, decay, device, with_scaler=False, apex_amp_in_use=False, fused=None):
    """SGD with momentum for ``device``, safe with a GradScaler; ``fused``: torch's fused kernel (None: the device's
    choice), its momentum buffers zeros up front (torch's ``empty_like`` ones are garbage after an overflow)."""
    weight_decay = decay.weights
    param_groups, names = groups.weight_decay_groups(params if isinstance(params, torch.nn.Module) else list(params),
                                                     weight_decay, decay.norm_and_bias)
    native = device.native_fused_sgd(apex_amp_in_use) if fused is None else None
    if native is not None:
        opt_cls, name = native
        # vendor fused optimizers keep gradients in one flat buffer: zero_grad(set_to_none=True) raises
        return OptimizerChoice(opt_cls(param_groups, lr=lr, momentum=momentum, weight_decay=weight_decay), name,
                               grads_to_none=False, groups=names)
    want = device.prefers_torch_fused_sgd if fused is None else bool(fused)
    want = want and "fused" in inspect.signature(torch.optim.SGD).parameters  # where this torch has it
    note = None
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
