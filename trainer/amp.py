"""Mixed precision: native autocast + GradScaler, or apex.amp (NVIDIA or Ascend).

native: autocast in the device's low-precision dtype (float16 on NPU/CUDA with a
        GradScaler; bfloat16 on CPU, which needs no scaler). ``--loss-scale N`` keeps the
        scale fixed at N; ``dynamic`` (default) lets the scaler grow and back off.
apex:   ``amp.initialize(model, optimizer, opt_level, loss_scale[, combine_grad=True])``
        (combine_grad where the installed apex accepts it, as Ascend's does) and backward
        through ``amp.scale_loss``.
Steps skipped because of an overflow are counted on the device and reported.
The scaler / amp state goes into every checkpoint and comes back on resume.
"""
import contextlib
import inspect


from trainer import device as devmod
from trainer.errors import UsageError


class MixedPrecision:
    def __init__(self, cfg, device):
        self.enabled = bool(cfg.amp)
        self.impl = cfg.amp_impl if self.enabled else "none"
        self.opt_level = cfg.opt_level if self.impl == "apex" else None
        self.loss_scale = cfg.loss_scale
        self.device = device
        self.scaler = None
        self.apex = None
        self._overflows = None
        self._apex_overflows = 0
        self.notes = []

    # -- construction
    @classmethod
    def check(cls, cfg, kind):
        """Fail early (before any process starts) on an impossible combination."""
        if cfg.amp and cfg.amp_impl == "apex":
            if devmod.apex_amp() is None:
                raise UsageError("--amp-impl apex: apex with amp is not installed (NVIDIA apex, or Ascend apex "
                                 "for NPU; the PyPI package named 'apex' is unrelated); use --amp-impl native")
            if not devmod.supports_apex(kind):
                raise UsageError("--amp-impl apex runs on NPU or CUDA only; use --amp-impl native on CPU")

    def setup(self, model, optimizer):
        """Returns (model, optimizer), initialised by apex when it is used."""
        if self.impl == "apex":
            amp = devmod.apex_amp()
            kwargs = {"opt_level": self.opt_level,
                      "loss_scale": "dynamic" if self.loss_scale is None else self.loss_scale}
            if "combine_grad" in inspect.signature(amp.initialize).parameters:
                kwargs["combine_grad"] = True
            model, optimizer = amp.initialize(model, optimizer, **kwargs)
            self.apex = amp
        elif self.enabled:
            self.scaler = self.device.grad_scaler(self.loss_scale)
            if self.scaler is None and self.loss_scale is not None:
                self.notes.append("{} autocast needs no loss scaling: --loss-scale {} is not used on {}".format(
                    str(self.device.amp_dtype).replace("torch.", ""), self.loss_scale, self.device.kind))
        return model, optimizer

    @property
    def dtype(self):
        if not self.enabled:
            return "float32"
        if self.impl == "apex":
            return "float16"
        return str(self.device.amp_dtype).replace("torch.", "")

    # -- per step
    def autocast(self):
        if self.impl == "native":
            return self.device.autocast(True)
        return contextlib.nullcontext()

    def backward_step(self, loss, optimizer):
        if self.apex is not None:
            with self.apex.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
            self._apex_overflows += _apex_overflowed(self.apex)
            return
        if self.scaler is None:
            loss.backward()
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        found = _found_inf(self.scaler, optimizer)
        if found is not None:
            self._overflows = found if self._overflows is None else self._overflows + found
        if self.loss_scale is not None:
            self.scaler.update(self.loss_scale)  # static scale: set it back every step
        else:
            self.scaler.update()

    def overflow_steps(self):
        """Steps skipped for inf/nan gradients so far (a host sync; call at epoch end)."""
        n = self._apex_overflows
        if self._overflows is not None:
            n += int(self._overflows.item())
        return n

    def current_scale(self):
        if self.scaler is not None:
            return float(self.scaler.get_scale())
        if self.apex is not None:
            scalers = getattr(getattr(self.apex, "_amp_state", None), "loss_scalers", None)
            if scalers:
                return float(scalers[0].loss_scale())
        return None

    # -- checkpoint
    def state_dict(self):
        state = {"impl": self.impl, "overflow_steps": self.overflow_steps()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.apex is not None:
            state["amp"] = self.apex.state_dict()
        return state

    def load_state_dict(self, state, log):
        if not state:
            return
        if state.get("impl") != self.impl:
            log("note: the checkpoint's mixed precision was '{}', this run uses '{}': its scaler state is "
                "not restored".format(state.get("impl"), self.impl))
            return
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.apex is not None and state.get("amp"):
            self.apex.load_state_dict(state["amp"])
        self._apex_overflows = int(state.get("overflow_steps", 0))

    def describe(self):
        return {"enabled": self.enabled, "impl": self.impl, "dtype": self.dtype, "opt_level": self.opt_level,
                "loss_scale": "dynamic" if self.loss_scale is None else self.loss_scale,
                "final_loss_scale": self.current_scale(), "overflow_steps": self.overflow_steps()}


def _found_inf(scaler, optimizer):
    """Device tensor: 1 if this step found inf/nan (and was skipped), else 0."""
    try:
        per_device = scaler._found_inf_per_device(optimizer)
    except Exception:
        return None
    if not per_device:
        return None
    return sum(v.float() for v in per_device.values())


def _apex_overflowed(amp):
    scalers = getattr(getattr(amp, "_amp_state", None), "loss_scalers", None)
    if scalers and getattr(scalers[0], "_has_overflow", False):
        return 1
    return 0

