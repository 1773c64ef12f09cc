"""FAKE torch_npu.npu.amp.GradScaler (test-only).

Real (torch_npu 2.14.0, torch_npu/npu/amp/grad_scaler.py): a subclass of torch.amp.GradScaler with
``__init__(init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
dynamic=True, enabled=True)``. ``dynamic=False`` keeps the scale fixed: gradients are unscaled
without an inf/NaN check, the optimizer always steps and ``update()`` leaves the scale alone.
``state_dict()`` adds the key "dynamic" to torch's keys. Disabled (with a warning) when no NPU
is available.

The fake reuses torch's GradScaler logic on the CPU, so scaling, unscaling, skipping a step on
inf/NaN and the backoff/growth of the scale are torch's own.
"""

import warnings
from collections import defaultdict

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

import torch_npu

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    def __init__(self,
                 init_scale=2. ** 16,
                 growth_factor=2.0,
                 backoff_factor=0.5,
                 growth_interval=2000,
                 dynamic=True,
                 enabled=True):
        if enabled and not torch_npu.npu.is_available():
            warnings.warn("torch_npu.amp.GradScaler is enabled, but NPU is not available. Disabling.")
            enabled = False
        if enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        torch_npu._record("GradScaler", {
            "init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
            "growth_interval": growth_interval, "dynamic": dynamic, "enabled": enabled})
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        found_inf = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
        if self._dynamic and found_inf:
            torch_npu._record("GradScaler.step", "skipped")
            return None
        torch_npu._record("GradScaler.step", "stepped")
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if new_scale is None and not self._dynamic:
            self._check_scale_growth_tracker("update")
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        else:
            super().update(new_scale)
        torch_npu._record("GradScaler.update", self.get_scale())

    def state_dict(self):
        state = super().state_dict()
        if self._enabled:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        super().load_state_dict(state_dict)
        self._dynamic = state_dict["dynamic"]
