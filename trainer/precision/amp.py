"""Mixed precision and the optimizer step, as one object: ``settle`` decides what the flags leave open for the device
kind (the plan's), ``resolve`` a run's precision on the device, ``wrap`` steps the optimizer under it (an
``OptimizerStep``: an update with inf/NaN gradients is skipped entirely). Reasons and details: docs/PRECISION.md."""
import dataclasses
import inspect

import torch

from trainer import device as devmod
from trainer import optim
from trainer.optim import groups, sgd
from trainer.errors import UsageError
from trainer.options import DYNAMIC
from trainer.precision import APEX_OPT_LEVEL


class Precision:
    """A run's precision: ``impl`` none | native | apex, dtype (None: float32), loss scale (None: dynamic), note."""

    def __init__(self, requested, impl, dtype, loss_scale, opt_level=None, note=None, combine_ddp=False, probe=None):
        self.requested, self.impl, self.dtype, self.combine_ddp = requested, impl, dtype, combine_ddp
        self.loss_scale, self.opt_level, self.note = loss_scale, opt_level, note
        self.probe = probe  # what timing the model found where auto is measured (amp_probe.py), or None

    @property
    def enabled(self):
        return self.impl != "none"

    @property
    def scaled(self):
        """float16 needs loss scaling; bfloat16 and float32 do not."""
        return self.impl == "apex" or self.dtype == torch.float16

    @property
    def autocast_dtype(self):
        """The dtype native autocast runs at, None where it does not run (float32, apex)."""
        return self.dtype if self.impl == "native" else None

    @property
    def dtype_name(self):
        return "float32" if self.dtype is None else str(self.dtype).replace("torch.", "")

    def describe(self):
        """summary.json's "amp" of an evaluation (a training run's: OptimizerStep.describe, which adds to it)."""
        return {"enabled": self.enabled, "impl": self.impl, "requested_dtype": self.requested,
                "dtype": self.dtype_name, "note": self.note, "probe": self.probe}


def settle(cfg, kind):
    """(the precision section with ``--amp-impl auto`` and apex's default loss scale decided for ``kind``, notes on
    flags without effect), before any process starts; ``preset``: values a recipe or ModelZoo entry gave."""
    p, notes = cfg.precision, []
    typed = [d for d in ("opt_level", "loss_scale") if getattr(p, d) is not None and d not in p.preset]
    if not p.amp:
        unused = [f for f, d in (("--opt-level", "opt_level"), ("--loss-scale", "loss_scale")) if d in typed]
        if unused:
            notes.append(" and ".join(unused) + (" has" if len(unused) == 1 else " have") + " no effect without --amp")
        if cfg.launch.world_size == 1 and devmod.Device.of(kind).guides_train_with_amp and not cfg.run.evaluate:
            notes.append("no --amp: training in float32, as pytorch/examples' flags say; the Ascend guides train on "
                         "{} with --amp (their single-card scripts turn it on by default)".format(kind.upper()))
        return dataclasses.replace(p, amp_impl="native"), tuple(notes)
    impl = p.amp_impl
    if impl == "auto":
        impl = "native" if p.amp_dtype == "bfloat16" else devmod.Device.of(kind).default_amp_impl()
    loss_scale = p.loss_scale
    if impl == "apex":  # fail early on an impossible combination
        if devmod.apex_amp() is None:
            raise UsageError("--amp-impl apex: apex with amp is not installed (NVIDIA apex, or Ascend apex "
                             "for NPU; the PyPI package named 'apex' is unrelated); use --amp-impl native")
        if not devmod.Device.of(kind).supports_apex:
            raise UsageError("--amp-impl apex runs on NPU or CUDA only; use --amp-impl native on CPU")
        if p.amp_dtype == "bfloat16":
            raise UsageError("--amp-impl apex runs float16 only; use --amp-impl native for --amp-dtype bfloat16")
        if "loss_scale" not in typed:
            loss_scale = devmod.Device.of(kind).default_apex_loss_scale
        if p.amp_impl == "auto":
            held = _held(loss_scale)
            notes.append("--amp: apex.amp {}, loss scale {}{} (the Ascend guide's settings); --amp-impl native for "
                         "torch's autocast".format(p.opt_level or APEX_OPT_LEVEL, "dynamic" if held is None else
                                                   "{:g} held fixed".format(held),
                                                   ", combine_grad" if devmod.apex_supports("combine_grad") else ""))
        if p.combine_ddp and not devmod.apex_supports("combine_ddp"):
            raise UsageError("--combine-ddp: this apex has no combine_ddp (Ascend apex provides it); drop the flag")
        if p.combine_ddp and cfg.launch.world_size == 1:
            notes.append("--combine-ddp has no effect in a single-process run")
    elif p.combine_ddp:
        raise UsageError("--combine-ddp is an option of Ascend apex.amp, and this run uses native autocast{}; "
                         "drop the flag".format("" if devmod.apex_amp() is not None else " (apex is not installed)"))
    elif "opt_level" in typed:
        notes.append("--opt-level {} applies to apex only: this run uses native autocast{}".format(
            p.opt_level, " (apex is not installed)" if devmod.apex_amp() is None else ""))
    return dataclasses.replace(p, amp_impl=impl, loss_scale=loss_scale), tuple(notes)


def _held(loss_scale):
    """The section's ``loss_scale`` as ``Precision`` holds it: a number held fixed, or None (dynamic)."""
    return None if loss_scale is None or loss_scale == DYNAMIC else float(loss_scale)


def resolve(section, device, world_size=1, decide=None):
    """The run's ``Precision`` on ``device`` from the settled precision section. ``decide(dtype, note)`` -> (dtype,
    note, record): amp_probe's ``for_run`` where the device measures ``auto``; without it the device's rule."""
    p = section
    if not p.amp:
        return Precision(p.amp_dtype, "none", None, None)
    scale = _held(p.loss_scale)
    if p.amp_impl == "apex":
        return Precision(p.amp_dtype, "apex", torch.float16, scale, p.opt_level or APEX_OPT_LEVEL,
                         combine_ddp=p.combine_ddp and world_size != 1)
    dtype, note = device.resolve_amp_dtype(p.amp_dtype)
    probe = None
    if decide is not None and p.amp_dtype == "auto" and device.measures_amp_dtype:
        dtype, note, probe = decide(dtype, note)
    if dtype != torch.float16 and scale is not None and "loss_scale" not in p.preset:  # a flag typed is explained
        extra = "{} needs no loss scaling: --loss-scale {:g} is not used".format(
            "float32" if dtype is None else str(dtype).replace("torch.", "") + " autocast", scale)
        note = extra if note is None else note + "; " + extra
    return Precision(p.amp_dtype, "none" if dtype is None else "native", dtype,
                     scale if dtype == torch.float16 else None, note=note, probe=probe)


def inspection_dtype(device, requested="auto"):
    """(dtype, note) for the tools inspecting low precision: the trainer's choice, or bfloat16 instead of float32."""
    dtype, note = device.resolve_amp_dtype(requested)
    return (dtype, note) if dtype is not None else (
        torch.bfloat16, "the trainer's --amp would train in float32 on this CPU; inspecting bfloat16")


def wrap(choice, precision, device, model):
    """(model, OptimizerStep) for ``choice`` under ``precision`` (apex's initialised model replaces the one given)."""
    if precision.impl == "apex":
        step = ApexStep(choice, precision, device)
        return step.initialize(model), step
    return model, (ScaledStep if precision.scaled else PlainStep)(choice, precision, device)


class OptimizerStep:
    """An optimizer and its loss scaling; ``step(loss)`` returns a device tensor, 1 where the update was skipped for
    inf/NaN gradients (None: no such check). Overflow counts stay on the device until read."""

    def __init__(self, choice, precision, device):
        self.optimizer, self.name, self.groups = choice.optimizer, choice.name, choice.groups  # groups: their names
        self.optimizer_kind = choice.kind  # the --optimizer name
        self.device, self.precision = device, precision
        self.notes = [n for n in (precision.note, choice.note) if n]
        self._grads_to_none = choice.grads_to_none
        self._overflows, self._host_overflows = None, 0

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=self._grads_to_none)

    def autocast(self):
        return self.device.autocast(self.precision.autocast_dtype)

    def _count(self, found):
        if found is not None:
            self._overflows = found if self._overflows is None else self._overflows + found
        return found

    def overflow_steps(self):
        """Steps skipped for inf/nan gradients so far (a host sync: call at print steps or epoch end)."""
        return self._host_overflows + (0 if self._overflows is None else int(self._overflows.item()))

    def loss_scale(self):
        return None

    def live_scalars(self):
        """{"loss_scale", "overflow_steps"} (device scalars or numbers) for the engine to read with its meters."""
        return {}

    # -- checkpoint entries. The Ascend guide's main.py saves "optimizer" and, for apex runs, "amp" (amp.state_dict(),
    # resumed with amp.load_state_dict(checkpoint['amp'])): the same keys here, so either side reads the other's
    # files. This project adds "precision" (how the run computed) and, for torch's GradScaler, "scaler".
    def checkpoint_entries(self):
        return {"optimizer": self.optimizer.state_dict(),
                "precision": {"impl": self.precision.impl, "dtype": self.precision.dtype_name,
                              "overflow_steps": self.overflow_steps()}}

    def restore(self, ckpt, log):
        """Optimizer and loss-scaler state from a checkpoint (ours, an older one whose "amp" held all, the Ascend
        guide's, pytorch/examples'); another --optimizer (none saved: SGD) or parameter split is a UsageError."""
        config = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
        theirs = config.get("optimizer") or optim.DEFAULT_OPTIMIZER
        if ckpt.get("optimizer") and theirs != self.optimizer_kind:
            raise UsageError("the checkpoint was trained with --optimizer {0} and this run asks for --optimizer {1}: "
                             "resume with --optimizer {0}, or start a new run in another --output-dir".format(
                                 theirs, self.optimizer_kind))
        if ckpt.get("optimizer"):
            groups.load_state(self.optimizer, ckpt["optimizer"], self.groups, log, config.get("norm_weight_decay"))
            if self.optimizer.defaults.get("fused"):  # its momentum buffers exist from the start
                sgd.zero_momentum_buffers(self.optimizer)  # a checkpoint saved before any step has none
        amp_entry = ckpt.get("amp")
        if isinstance(amp_entry, dict) and "impl" in amp_entry:  # this project's format 1: all in "amp"
            meta, scaler, apex_state = amp_entry, amp_entry.get("scaler"), amp_entry.get("amp")
        else:
            meta, scaler, apex_state = ckpt.get("precision"), ckpt.get("scaler"), (amp_entry or None)
        if meta is None and scaler is None and apex_state is None:
            return
        mine = (self.precision.impl, self.precision.dtype_name)
        if meta is not None:
            theirs = (meta.get("impl"), meta.get("dtype", self.precision.dtype_name))
        else:  # the guide's checkpoint: an "amp" entry is apex's
            theirs = ("apex", "float16") if apex_state is not None else (None, None)
        if theirs != mine:
            log("note: the checkpoint's mixed precision was '{} {}', this run uses '{} {}': its loss-scaler state "
                "is not restored".format(theirs[0], theirs[1], mine[0], mine[1]))
            return
        self._load_scaler(scaler, apex_state)
        self._host_overflows, self._overflows = int((meta or {}).get("overflow_steps", 0)), None

    def _load_scaler(self, scaler, apex_state):
        pass

    def describe(self):
        p = self.precision
        return dict(p.describe(), opt_level=p.opt_level,
                    loss_scale=None if not p.scaled else ("dynamic" if p.loss_scale is None else p.loss_scale),
                    final_loss_scale=self.loss_scale(), overflow_steps=self.overflow_steps(), optimizer=self.name,
                    note="; ".join(self.notes) or None)  # the precision's note and the optimizer's


class PlainStep(OptimizerStep):
    """float32 or bfloat16: backward, step."""

    def __call__(self, loss):
        loss.backward()
        self.optimizer.step()  # returns None: no overflow check


class ScaledStep(OptimizerStep):
    """float16 with a GradScaler; a static ``--loss-scale N``: a dynamic one set back to N (only it skips overflows)."""

    def __init__(self, choice, precision, device):
        super().__init__(choice, precision, device)
        self.scaler, self.static = device.grad_scaler(precision.loss_scale), precision.loss_scale

    def __call__(self, loss):
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        found = _found_inf(self.scaler, self.optimizer)
        self.scaler.update(self.static)  # None: the dynamic scale moves
        return self._count(found)

    def loss_scale(self):
        return float(self.scaler.get_scale())

    def live_scalars(self):
        scale = getattr(self.scaler, "_scale", None)  # the scaler's device tensor (torch and torch_npu)
        out = {"loss_scale": scale} if torch.is_tensor(scale) else {}
        out["overflow_steps"] = self._host_overflows + (0 if self._overflows is None else self._overflows)
        return out

    def checkpoint_entries(self):
        return dict(super().checkpoint_entries(), scaler=self.scaler.state_dict())

    def _load_scaler(self, scaler, apex_state):
        if scaler:
            sd = dict(scaler)
            if "dynamic" in sd:
                sd["dynamic"] = True  # the overflow check stays on (see the class docstring)
            self.scaler.load_state_dict(sd)
            if self.static is not None:
                self.scaler.update(self.static)


class ApexStep(OptimizerStep):
    """apex.amp (NVIDIA's or Ascend's). A static ``--loss-scale N`` is apex's dynamic scaler held at N (min = max
    loss scale = N): apex's static mode never skips an overflow step, its dynamic mode does."""

    def __init__(self, choice, precision, device):
        super().__init__(choice, precision, device)
        self.amp = devmod.apex_amp()
        self._grads_to_none = False  # apex's combined gradients and fused optimizers keep their buffers

    def initialize(self, model):
        params = inspect.signature(self.amp.initialize).parameters
        kwargs = {"opt_level": self.precision.opt_level, "loss_scale": "dynamic"}
        scale = self.precision.loss_scale
        if scale is not None:
            if "min_loss_scale" in params and "max_loss_scale" in params:
                kwargs.update(min_loss_scale=scale, max_loss_scale=scale)
                if "dynamic_init_scale" in params:
                    kwargs["dynamic_init_scale"] = scale
            else:
                kwargs["loss_scale"] = scale
        if "combine_grad" in params:
            kwargs["combine_grad"] = True
        if self.precision.combine_ddp:
            kwargs["combine_ddp"] = True
        model, self.optimizer = self.amp.initialize(model, self.optimizer, **kwargs)
        return model

    def __call__(self, loss):
        with self.amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
        self.optimizer.step()
        scalers = getattr(getattr(self.amp, "_amp_state", None), "loss_scalers", None)
        overflow = 1 if scalers and getattr(scalers[0], "_has_overflow", False) else 0
        self._host_overflows += overflow
        return overflow

    def loss_scale(self):
        scalers = getattr(getattr(self.amp, "_amp_state", None), "loss_scalers", None)
        return float(scalers[0].loss_scale()) if scalers else None

    def live_scalars(self):
        return {"loss_scale": self.loss_scale(), "overflow_steps": self._host_overflows}  # apex keeps them on the host

    def checkpoint_entries(self):
        return dict(super().checkpoint_entries(), amp=self.amp.state_dict())

    def _load_scaler(self, scaler, apex_state):
        if apex_state:
            self.amp.load_state_dict(apex_state)


def _found_inf(scaler, optimizer):
    """Device tensor: 1 if this step found inf/nan (skipped), else 0; None if unknown. torch_npu's scaler holds 2 on an
    overflow (npu/amp/grad_scaler.py ``_unscale_grads_``: 2.1.0.post17 :267-271, 2.14.0 :266-270): clamped to 1."""
    try:
        per_device = scaler._found_inf_per_device(optimizer)
    except Exception:
        return None
    return sum(v.float() for v in per_device.values()).clamp(max=1.0) if per_device else None
