"""FAKE apex.optimizers.NpuFusedSGD (test-only).

Real (gitee ascend/apex src/apex/optimizers/npu_fused_sgd.py): ``NpuFusedSGD(params, lr=required,
momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)`` with ``is_npu_fused_optimizer =
True``; its ``step()`` raises RuntimeError unless the optimizer went through ``amp.initialize``
(opt_level O1 or O2). The fake is torch.optim.SGD with that check; it records its construction.
"""

import torch
from torch.optim.optimizer import required

import apex


class NpuFusedSGD(torch.optim.SGD):
    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        if lr is required:
            raise ValueError("parameter group didn't specify a value of required optimization parameter lr")
        apex._record("NpuFusedSGD", {"lr": lr, "momentum": momentum, "dampening": dampening,
                                     "weight_decay": weight_decay, "nesterov": nesterov})
        self.is_npu_fused_optimizer = True
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, foreach=False)

    @torch.no_grad()
    def step(self, closure=None):
        if not hasattr(self, "_amp_stash"):
            raise RuntimeError("apex.optimizers.NpuFusedSGD should be used with AMP.")
        return super().step(closure)
