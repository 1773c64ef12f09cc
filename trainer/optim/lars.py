"""LARS: layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017), as MLPerf's ResNet-50 uses it. Each weight
tensor's step is scaled by its trust ratio ``eta * ||w|| / (||g|| + wd * ||w||)`` (1 where either norm is zero), with
SGD momentum as torch's SGD applies it: ``d = trust * (g + wd * w)``, ``buf = momentum * buf + d``, ``w -= lr * buf``.
BatchNorm parameters and biases are excluded, as in MLPerf's reference: no trust ratio and no weight decay (``d = g``;
with ``--norm-weight-decay WD``, ``d = g + WD * w``). No host sync; the momentum buffers are zeros from the start, so a
checkpoint always holds them.
"""
import torch

from trainer.errors import UsageError
from trainer.optim import groups
from trainer.optim.choice import OptimizerChoice


def lars_groups(params_or_model, weight_decay, norm_weight_decay=None):
    """LARS's groups: weights, and norm parameters and biases (no trust ratio; ``norm_weight_decay``, 0 if None)."""
    return _groups(params_or_model, weight_decay, norm_weight_decay)[0]


def _groups(params_or_model, weight_decay, norm_weight_decay):
    return groups.weight_decay_groups(params_or_model, weight_decay, norm_weight_decay or 0.0, {"lars_exclude": True})


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a layer-wise trust ratio (see the module docstring)."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError("LARS: lr, momentum and weight_decay must be >= 0 and eta > 0")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta, "lars_exclude": False}
        super(LARS, self).__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                d = g.clone() if wd == 0 else g.add(p, alpha=wd)
                if not group["lars_exclude"]:
                    w_norm, g_norm = torch.norm(p), torch.norm(g)
                    d.mul_(torch.where((w_norm > 0) & (g_norm > 0), eta * w_norm / (g_norm + wd * w_norm),
                                       torch.ones_like(w_norm)))
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                buf.mul_(momentum).add_(d)
                p.add_(buf, alpha=-lr)
        return loss


def build_lars(params_or_model, lr, momentum, decay, device, with_scaler=False, apex_amp_in_use=False, fused=None):
    """``--optimizer lars``: plain torch, the same on every device; a GradScaler skips its overflow steps."""
    if fused:
        raise UsageError("--optimizer lars has no fused kernel: torch's fused SGD applies to --optimizer sgd only")
    param_groups, names = _groups(params_or_model, decay.weights, decay.norm_and_bias)
    return OptimizerChoice(LARS(param_groups, lr=lr, momentum=momentum, weight_decay=decay.weights),
                           "trainer.optim.LARS", grads_to_none=True, groups=names)
