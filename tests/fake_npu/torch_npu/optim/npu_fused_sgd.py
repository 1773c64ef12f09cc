"""FAKE torch_npu.optim.NpuFusedSGD (test-only).

Real (torch_npu/optim/npu_fused_sgd.py, the same in 2.1.0.post17 and 2.14.0):
``NpuFusedSGD(params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)``,
the SGD update applied to the parameters and gradients fused into one flat buffer per dtype; usable
on its own (no apex).
Its ``zero_grad(set_to_none=False)`` raises ValueError for ``set_to_none=True`` (the flat gradient
buffer must stay in place), and only float32/float16 parameters are accepted.
The fake is torch.optim.SGD with those two checks; it records its construction.
"""

import torch
from torch.optim.optimizer import required

import torch_npu

__all__ = ["NpuFusedSGD"]


class NpuFusedSGD(torch.optim.SGD):
    is_fused_optimizer = True

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        if lr is required:
            raise ValueError("parameter group didn't specify a value of required optimization parameter lr")
        torch_npu._record("NpuFusedSGD", {"lr": lr, "momentum": momentum, "dampening": dampening,
                                          "weight_decay": weight_decay, "nesterov": nesterov})
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, foreach=False)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in (torch.float32, torch.float16):
                    raise TypeError("Fused optimizer's parameters must be either float32 or float16, "
                                    "but received {}".format(p.dtype))

    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise ValueError("set_to_none is not supported in fused optimizers")
        super().zero_grad(set_to_none=False)
