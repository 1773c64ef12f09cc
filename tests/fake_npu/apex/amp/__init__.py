"""FAKE apex.amp (Ascend apex-patch flavour), test-only.

Signatures follow the Ascend patch of NVIDIA apex (patch/npu.patch in gitee ascend/apex):

* ``initialize(models, optimizers=None, enabled=True, opt_level="O1", ..., loss_scale=None, ...,
  combine_grad=None, combine_ddp=None, ddp_replica_count=4, user_cast_preferred=None,
  check_combined_tensors=None)`` returns ``(models, optimizers)`` (or ``models`` when no optimizer
  is given), lists in, lists out.
* ``scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
  delay_overflow_check=False)``: a context manager yielding ``loss.float() * scale``; on exit the
  gradients are unscaled. With ``loss_scale="dynamic"`` an inf/NaN gradient halves the scale
  (``scale_backoff_factor``) and makes the next ``optimizer.step()`` a no-op; ``scale_window``
  clean steps grow it. A numeric ``loss_scale`` is static: no check, no skip.
* ``state_dict(destination=None)`` -> ``{"loss_scaler0": {"loss_scale": s, "unskipped": n}, ...}``;
  ``load_state_dict(state_dict)``.

What the fake does not do: cast models or optimizers (O1/O2 leave dtypes as they are) and fuse
gradients (combine_grad only changes ``zero_grad`` of the models passed in, see below).
"""

import contextlib
from collections import OrderedDict

import torch

import apex

__all__ = ["initialize", "scale_loss", "state_dict", "load_state_dict", "master_params"]

_OPT_LEVELS = {"O0": 1.0, "O1": "dynamic", "O2": "dynamic", "O3": 1.0}  # default loss_scale per level


class _AmpState(object):
    def __init__(self):
        self.enabled = False
        self.opt_level = None
        self.options = {}
        self.loss_scalers = []


_amp_state = _AmpState()


class LossScaler(object):
    def __init__(self, loss_scale, init_scale=2. ** 16, scale_growth_factor=2., scale_backoff_factor=0.5,
                 scale_window=2000, min_loss_scale=None, max_loss_scale=2. ** 24):
        if loss_scale == "dynamic":
            self.dynamic = True
            self._loss_scale = min(max_loss_scale, init_scale)
        else:
            self.dynamic = False
            self._loss_scale = float(loss_scale)
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_growth_factor = scale_growth_factor
        self._scale_backoff_factor = scale_backoff_factor
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False

    def loss_scale(self):
        return self._loss_scale

    def update_scale(self, has_overflow):
        """Returns True when the coming optimizer step must be skipped."""
        self._has_overflow = bool(has_overflow)  # apex's LossScaler keeps the last step's verdict here
        if has_overflow and self.dynamic:
            new = self._loss_scale * self._scale_backoff_factor
            self._loss_scale = max(self._min_loss_scale, new) if self._min_loss_scale else new
            self._unskipped = 0
            return True
        self._unskipped += 1
        if self.dynamic and self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * self._scale_growth_factor)
            self._unskipped = 0
        return False


def _as_list(x):
    if isinstance(x, (list, tuple)):
        return list(x), True
    return [x], False


def _zero_grad_no_none(module):
    # apex-patch replaces torch.nn.Module.zero_grad when combine_grad or an NPU fused optimizer is in
    # use: set_to_none must be False (the fused gradient buffer must stay). The fake applies this to
    # the models passed to initialize() only, not to every Module in the process.
    def zero_grad(set_to_none=False):
        assert set_to_none is False, "For combined grad, `set_to_none` must be False."
        for p in module.parameters():
            if p.grad is not None:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
    return zero_grad


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None, loss_scale=None,
               cast_model_outputs=None, num_losses=1, verbosity=1, dynamic_init_scale=2. ** 16,
               scale_growth_factor=2., scale_backoff_factor=0.5, scale_window=2000, min_loss_scale=None,
               max_loss_scale=2. ** 24, combine_grad=None, combine_ddp=None, ddp_replica_count=4,
               user_cast_preferred=None, check_combined_tensors=None):
    options = {
        "enabled": enabled, "opt_level": opt_level, "loss_scale": loss_scale, "num_losses": num_losses,
        "keep_batchnorm_fp32": keep_batchnorm_fp32, "master_weights": master_weights,
        "combine_grad": combine_grad, "combine_ddp": combine_ddp, "ddp_replica_count": ddp_replica_count,
        "dynamic_init_scale": dynamic_init_scale, "scale_window": scale_window,
        "min_loss_scale": min_loss_scale, "max_loss_scale": max_loss_scale,
    }
    apex._record("initialize", options)

    if not enabled:
        _amp_state.enabled = False
        return models if optimizers is None else (models, optimizers)

    if opt_level not in _OPT_LEVELS:
        raise RuntimeError("Unexpected optimization level {}. Options are 'O0', 'O1', 'O2', 'O3'.  Note that in "
                           "`O0`, `O1`, etc., the prefix O is the letter O, not the number zero.".format(opt_level))
    # apex warn_or_err() raises unless hard_override is set; these are the patch's own checks.
    if combine_grad and opt_level not in ("O1", "O2"):
        raise RuntimeError("Currently, combine_grad=True or check_combined_tensors=True should only be set "
                           "by selecting opt_level='O1' or opt_level='O2'.")
    if combine_ddp is not None and not combine_grad:
        raise RuntimeError("Combine_grad should be True when combine_ddp using.. \n")

    model_list, models_was_list = _as_list(models)
    for m in model_list:
        if isinstance(m, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            raise RuntimeError("Incoming model is an instance of {}. Parallel wrappers should only be applied "
                               "to the model(s) AFTER the model(s) have been returned from amp.initialize."
                               .format(type(m).__name__))
    opt_list, optimizers_was_list = ([], False) if optimizers is None else _as_list(optimizers)

    if loss_scale is None:
        loss_scale = _OPT_LEVELS[opt_level]
    elif loss_scale != "dynamic":
        loss_scale = float(loss_scale)

    _amp_state.enabled = True
    _amp_state.opt_level = opt_level
    _amp_state.options = dict(options, loss_scale=loss_scale)
    _amp_state.loss_scalers = [
        LossScaler(loss_scale, init_scale=dynamic_init_scale, scale_growth_factor=scale_growth_factor,
                   scale_backoff_factor=scale_backoff_factor, scale_window=scale_window,
                   min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
        for _ in range(num_losses)]

    for opt in opt_list:
        opt._amp_stash = _AmpState()  # marks the optimizer as processed by amp

    fused = any(getattr(o, "is_npu_fused_optimizer", False) for o in opt_list)
    if combine_grad or fused:
        for m in model_list:
            m.zero_grad = _zero_grad_no_none(m)

    if combine_ddp and torch.distributed.is_available() and torch.distributed.is_initialized():
        for m in model_list:
            for p in m.parameters():
                torch.distributed.broadcast(p.data, 0)

    out_models = model_list if models_was_list else model_list[0]
    if optimizers is None:
        return out_models
    out_opts = opt_list if optimizers_was_list else opt_list[0]
    return out_models, out_opts


def _skip_next_step(opt, loss_id):
    own = opt.__dict__.get("step")
    scaler = _amp_state.loss_scalers[loss_id]

    def skip_step(*args, **kwargs):
        apex._record("skip_step", loss_id, scaler.loss_scale())
        if own is None:
            del opt.step
        else:
            opt.step = own
        return None

    opt.step = skip_step


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    if not _amp_state.enabled:
        yield loss
        return
    opt_list, _ = _as_list(optimizers)
    scaler = _amp_state.loss_scalers[loss_id]
    scale = scaler.loss_scale()
    apex._record("scale_loss", loss_id, scale)

    yield loss.float() * scale

    if delay_unscale:
        return
    overflow = False
    with torch.no_grad():
        grads = [p.grad for o in opt_list for g in o.param_groups for p in g["params"] if p.grad is not None]
        if scaler.dynamic:
            overflow = any(not bool(torch.isfinite(g).all()) for g in grads)
        if not overflow:
            for g in grads:
                g.mul_(1.0 / scale)
    if scaler.update_scale(overflow):
        for o in opt_list:
            _skip_next_step(o, loss_id)


def state_dict(destination=None):
    if destination is None:
        destination = OrderedDict()
    for idx, scaler in enumerate(_amp_state.loss_scalers):
        destination["loss_scaler%d" % idx] = {"loss_scale": scaler.loss_scale(), "unskipped": scaler._unskipped}
    apex._record("state_dict")
    return destination


def load_state_dict(state_dict):
    apex._record("load_state_dict", dict(state_dict))
    if len(state_dict) != len(_amp_state.loss_scalers):
        print("Warning: state_dict contains {} entries, while {} loss_scalers are used".format(
            len(state_dict), len(_amp_state.loss_scalers)))
    unexpected = [k for k in state_dict if "loss_scaler" not in k]
    idx = 0
    for key, value in state_dict.items():
        if "loss_scaler" not in key:
            continue
        if idx >= len(_amp_state.loss_scalers):
            break
        _amp_state.loss_scalers[idx]._loss_scale = value["loss_scale"]
        _amp_state.loss_scalers[idx]._unskipped = value["unskipped"]
        idx += 1
    if unexpected:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: {}. ".format(
            ", ".join('"{}"'.format(k) for k in unexpected)))


def master_params(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield p
