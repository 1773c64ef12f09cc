"""FAKE torch_npu.npu.amp.GradScaler (test-only).

Real: torch_npu/npu/amp/grad_scaler.py. Both releases the fake follows (torch_npu/_release.py) hold
the same code apart from its base class: ``torch.cuda.amp.GradScaler`` in 2.1.0.post17 (``:8-10``,
``:28``), ``torch.amp.GradScaler`` in 2.14.0 (``:8-9``, ``:27``). Line numbers below are 2.1.0.post17's
(2.14.0's are one less).

* ``__init__(init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
  dynamic=True, enabled=True)`` (``:94-127``) sets the scaler's attributes itself and never calls the
  base class's ``__init__``; without an NPU the scaler is disabled with a warning.
* It overrides everything that touches a device: ``scale`` (``:148``), ``_unscale_grads_`` (``:206``),
  ``unscale_`` (``:275``), ``_maybe_opt_step`` (``:330``), ``step`` (``:338``), ``update`` (``:401``).
  torch's own are ``get_scale``, ``_check_scale_growth_tracker``, ``_found_inf_per_device`` and the
  base of ``state_dict`` / ``load_state_dict``.
* ``dynamic=True``: the grads go through ``torch._amp_foreach_non_finite_check_and_unscale_``; an
  inf/NaN sets ``_has_overflow`` and adds 1 to that kernel's found_inf (``:267-271``, so an overflow
  step reports 2 there, not torch's 1); ``step`` then skips ``optimizer.step()`` and prints
  "Gradient overflow. Skipping step" (``:330-336``); ``update`` multiplies the scale by
  ``backoff_factor``, or by ``growth_factor`` after ``growth_interval`` clean steps, and prints the
  new scale (``_npu_update_scale``, ``:490-506``).
* ``dynamic=False``: the grads are multiplied by 1/scale without a check, the optimizer always steps
  and ``update()`` keeps the scale.
* Saturation mode (``npu.utils.is_support_inf_nan()`` False, the 910A): ``scale`` first clears the
  NPU overflow flag, and ranks all-reduce an overflow count so that all skip together
  (``_sync_dist_overflow_count``, ``:476-488``).
* ``state_dict()`` adds "dynamic" to torch's keys; ``load_state_dict`` raises on an empty dict.

The fake is that code on CPU tensors: no ``pin_memory()`` (a host without an accelerator has no
pinned memory), no "must be an NPU tensor" checks, the NPU overflow flag is a recorded call, and
torch_npu.optim.NpuFusedSGD (the fake keeps per-parameter gradients, not a combined buffer) goes
through the per-parameter branch. Its calls are recorded: ("GradScaler", {...}),
("GradScaler.step", "stepped" | "skipped"), ("GradScaler.update", scale).

torch 2.1's ``torch.cuda.amp.GradScaler`` cannot run on CPU tensors: its ``__init__`` disables it
without CUDA, ``scale`` and ``_MultiDeviceReplicator`` assert CUDA tensors, and torch < 2.3 has no
CPU kernel for ``_amp_foreach_non_finite_check_and_unscale_`` or ``_amp_update_scale_``. The real
torch_npu overrides those very methods (it brings an NPU kernel for the unscale,
csrc/aten/npu_native_functions_by_codegen.yaml:894, and updates the scale with plain tensor ops), so
following it leaves to torch only methods that run anywhere; the one gap is the unscale kernel, which
``_non_finite_check_and_unscale_`` below replaces with the same tensor ops where torch has no CPU
kernel, without registering anything in torch.
"""

import collections.abc as container_abcs
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist

import torch_npu
from torch_npu import _faults, _release

if _release.V2_1:
    from torch.cuda.amp.grad_scaler import GradScaler as _BaseGradScaler
    from torch.cuda.amp.grad_scaler import OptState, _refresh_per_optimizer_state
else:
    from torch.amp.grad_scaler import GradScaler as _BaseGradScaler
    from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

__all__ = ["GradScaler"]

_CPU_UNSCALE_KERNEL = torch._C._dispatch_has_kernel_for_dispatch_key(
    "aten::_amp_foreach_non_finite_check_and_unscale_", "CPU")  # torch >= 2.3


def _non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """``torch._amp_foreach_non_finite_check_and_unscale_`` on CPU tensors: found_inf = 1 when a grad
    holds inf/NaN, every grad multiplied by inv_scale. torch's CPU kernel where it has one."""
    if _CPU_UNSCALE_KERNEL:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return
    for grad in grads:  # on the device, as the kernel: no read of the flag on the host
        found_inf.copy_(torch.maximum(found_inf, (~torch.isfinite(grad)).any().to(found_inf.dtype)))
        grad.mul_(inv_scale)


def _held(scale):
    """The scale for the call record, read from the double's host tensor behind it (``_data``) so that the read
    is not counted as a copy from the device: the real ``update`` makes no such read."""
    return float(getattr(scale, "_data", scale))


class GradScaler(_BaseGradScaler):
    def __init__(self,
                 init_scale=2. ** 16,
                 growth_factor=2.0,
                 backoff_factor=0.5,
                 growth_interval=2000,
                 dynamic=True,
                 enabled=True):
        if enabled and not torch_npu.npu.is_available():
            warnings.warn("torch_npu.amp.GradScaler is enabled, but NPU is not available. Disabling.")
            self._enabled = False
        else:
            self._enabled = enabled
        torch_npu._record("GradScaler", {
            "init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor,
            "growth_interval": growth_interval, "dynamic": dynamic, "enabled": self._enabled})
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale = None  # created by the first scale()
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._dynamic = dynamic
            self._init_growth_tracker = 0
            self._growth_tracker = None
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            self._has_overflow = False
            self._clear_overflow_flag = False
            self._dist_initialized = False
            self._dist_overflow_count = None

    def _lazy_init_scale_growth_tracker(self, dev):
        if self._growth_tracker is not None:
            raise RuntimeError("_growth_tracker initialized before _scale")
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=dev)

    def _lazy_init_dist_flag_and_dist_overflow_count(self):
        self._dist_initialized = dist.is_available() and dist.is_initialized()
        self._dist_overflow_count = torch.Tensor([0.])

    def scale(self, outputs):
        if not self._enabled:
            return outputs
        if self._dist_overflow_count is None:
            self._lazy_init_dist_flag_and_dist_overflow_count()
        if self._dynamic and not self._clear_overflow_flag:
            if not torch_npu.npu.utils.is_support_inf_nan():
                GradScaler.clear_npu_overflow_flag()
            self._clear_overflow_flag = True

        def apply_scale(val):
            if isinstance(val, torch.Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(val.device)
                return val * self._scale.to(device=val.device)
            if isinstance(val, container_abcs.Iterable):
                iterable = map(apply_scale, val)
                return type(val)(iterable) if isinstance(val, (list, tuple)) else iterable
            raise TypeError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        per_device_and_dtype_grads = defaultdict(lambda: defaultdict(list))
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if (not allow_fp16) and param.grad.dtype == torch.float16:
                        raise TypeError("Attempting to unscale FP16 gradients.")
                    if param.grad.is_sparse:
                        if param.grad.dtype == torch.float16:
                            param.grad = param.grad.coalesce()
                        to_unscale = param.grad._values()
                    else:
                        to_unscale = param.grad
                    per_device_and_dtype_grads[to_unscale.device][to_unscale.dtype].append(to_unscale)
            _faults.poison([g for per_dtype in per_device_and_dtype_grads.values() for grads in per_dtype.values()
                            for g in grads])  # FAKE_NPU_INF_GRAD_STEPS
            for per_dtype_grads in per_device_and_dtype_grads.values():
                for grads in per_dtype_grads.values():
                    if self._dynamic:
                        _non_finite_check_and_unscale_(grads, found_inf, inv_scale)
                        if found_inf.item() > 0:
                            self._has_overflow = True
                    else:
                        for grad in grads:
                            grad.mul_(inv_scale)
            self._sync_dist_overflow_count()
            if self._has_overflow:
                found_inf.add_(1)
        return {found_inf.device: found_inf}

    def unscale_(self, optimizer):
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.float().reciprocal()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()) and not self._has_overflow:
            torch_npu._record("GradScaler.step", "stepped")
            return optimizer.step(*args, **kwargs)
        print("Gradient overflow. Skipping step")
        torch_npu._record("GradScaler.step", "skipped")
        return None

    def step(self, optimizer, *args, **kwargs):
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            retval = optimizer.step(*args, **dict(kwargs, grad_scaler=self))
            optimizer_state["stage"] = OptState.STEPPED
            return retval
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) <= 0:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        if self._dynamic:
            retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        else:
            torch_npu._record("GradScaler.step", "stepped")
            retval = optimizer.step(*args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale=None):
        if not self._enabled:
            return
        _scale, _ = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                self._scale = torch.full((), new_scale, dtype=torch.float32, device=_scale.device)
            else:
                reason = "new_scale should be a float or a 1-element torch.npu.FloatTensor with requires_grad=False."
                if not isinstance(new_scale, torch.Tensor) or new_scale.dtype != torch.float32:
                    raise TypeError(reason)
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError(reason)
                self._scale = new_scale
        elif self._dynamic:
            self._npu_update_scale()
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._has_overflow = False
        self._clear_overflow_flag = False
        torch_npu._record("GradScaler.update", _held(self._scale))

    def state_dict(self):
        state = super(GradScaler, self).state_dict()
        if self._enabled:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        super(GradScaler, self).load_state_dict(state_dict)
        self._dynamic = state_dict["dynamic"]

    @staticmethod
    def get_npu_overflow_flag():
        torch_npu._record("npu_get_float_status")
        return False

    @staticmethod
    def clear_npu_overflow_flag():
        torch_npu._record("npu_clear_float_status")

    def _sync_dist_overflow_count(self):
        if torch_npu.npu.utils.is_support_inf_nan():
            return
        if self._dynamic and self._dist_initialized:
            if self._has_overflow:
                self._dist_overflow_count.add_(1)
                dist.all_reduce(self._dist_overflow_count)
                self._dist_overflow_count.zero_()
            else:
                dist.all_reduce(self._dist_overflow_count)
                if self._dist_overflow_count.item() != 0:
                    self._has_overflow = True
                self._dist_overflow_count.zero_()

    def _npu_update_scale(self):
        if self._has_overflow:
            self._scale.mul_(self._backoff_factor)
            self._growth_tracker.zero_()
            print("Loss scaler reducing loss scale to {}".format(self._scale.item()))
        else:
            self._growth_tracker.add_(1)
            if self._growth_tracker.item() == self._growth_interval:
                new_scale = self._scale * self._growth_factor
                if not torch.isinf(new_scale):
                    self._scale = new_scale
                self._growth_tracker.zero_()
                print("Loss scaler increasing loss scale to {}".format(self._scale.item()))
