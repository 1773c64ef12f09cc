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

On the device double (models whose parameters are on ``npu:N``, tests/fake_npu/torch_npu/_double.py) the opt
levels compute as apex's do: O1 runs the model's forward under the device's float16 autocast (apex's O1 casts
its whitelisted functions, convolutions and matrix products, to float16; the outputs come back in float32, as
its blacklisted loss functions compute); O2 casts the model to float16 but its affine batch norms
(``keep_batchnorm_fp32``), casts the forward's inputs to float16 and its outputs to float32, keeps float32
master weights in the optimizer (made from the model's weights at the first ``scale_loss``, so weights loaded
after ``initialize`` are the ones trained, as apex's lazy init does), steps them and copies them back; the
model's ``state_dict`` gives float32 (apex's O2StateDictHook). Models on the host are left as they are.

What the fake does not do: fuse gradients (combine_grad only changes ``zero_grad`` of the models passed in, see
below).

``FAKE_NPU_INF_GRAD_STEPS`` (tests/fake_npu/torch_npu/_faults.py) puts an inf into a gradient at the steps it
lists, before the overflow check.
"""

import contextlib
from collections import OrderedDict

import torch

import apex
from torch_npu import _faults

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
        opt._amp_stash.masters = None
    on_device = [m for m in model_list if any(p.device.type == "npu" for p in m.parameters())]
    if opt_level == "O1":
        for m in on_device:
            m.forward = _patch_forward(m.forward, _device_autocast, torch.float32)
    elif opt_level == "O2":
        for m in on_device:
            _convert_network(m, torch.float16)
            m.forward = _patch_forward(m.forward, None, torch.float32, torch.float16)
            m._register_state_dict_hook(_o2_state_dict_hook)
        if on_device:
            for opt in opt_list:
                opt._amp_stash.masters = []  # made at the first scale_loss
                _patch_master_weights(opt)

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


def _device_autocast():
    import torch_npu
    return torch_npu.npu.amp.autocast(dtype=torch.float16)


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _patch_forward(forward, context, output_dtype, input_dtype=None):
    """apex's patch_forward: inputs cast to ``input_dtype`` (if any), the forward run under ``context()`` (if
    any), outputs cast to ``output_dtype``."""
    def new_forward(*args, **kwargs):
        if input_dtype is not None:
            args, kwargs = _cast(args, input_dtype), _cast(kwargs, input_dtype)
        with (context() if context is not None else contextlib.nullcontext()):
            output = forward(*args, **kwargs)
        return _cast(output, output_dtype)
    return new_forward


def _convert_network(model, dtype):
    """apex's convert_network: every module's floating parameters and buffers to ``dtype``, affine batch norms
    excepted."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
                if param.grad is not None:
                    param.grad.data = param.grad.data.to(dtype)
        for buf in module.buffers(recurse=False):
            if buf.is_floating_point():
                buf.data = buf.data.to(dtype)


def _o2_state_dict_hook(module, state_dict, prefix, local_metadata):
    for key in state_dict:
        if state_dict[key].dtype == torch.float16:
            state_dict[key] = state_dict[key].to(torch.float32)


def _lazy_init_masters(opt):
    """apex's lazy_init_with_master_weights: the optimizer's float16 parameters replaced by float32 copies (its
    state reloaded, so that momentum follows them in float32); ``masters`` pairs (model parameter, master)."""
    stash = opt._amp_stash
    if stash.masters:
        return
    state = getattr(stash, "saved_state", None) or opt.state_dict()
    for group in opt.param_groups:
        for i, p in enumerate(group["params"]):
            if p.dtype == torch.float16:
                master = p.detach().clone().float().requires_grad_(True)
                stash.masters.append((p, master))
                group["params"][i] = master
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    opt.load_state_dict(state)
    for group, kept in zip(opt.param_groups, hyper):  # the state moves; the groups' settings stay as they are now
        group.update(kept)
    stash.saved_state = None


def _patch_master_weights(opt):
    own_step, own_zero_grad = opt.step, opt.zero_grad

    def step(*args, **kwargs):
        out = own_step(*args, **kwargs)
        with torch.no_grad():
            for model_param, master in opt._amp_stash.masters or ():
                model_param.copy_(master)
        return out

    def zero_grad(set_to_none=False):
        own_zero_grad(set_to_none=set_to_none)
        for model_param, _ in opt._amp_stash.masters or ():
            if model_param.grad is not None:
                if set_to_none:
                    model_param.grad = None
                else:
                    model_param.grad.detach_().zero_()

    own_state_dict, own_load_state_dict = opt.state_dict, opt.load_state_dict

    def state_dict():
        # Ascend apex saves the master weights with the optimizer's state, so that a resumed run continues from
        # them, not from the model's float16 weights
        out = own_state_dict()
        if opt._amp_stash.masters:
            out["master_params"] = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
        return out

    def load_state_dict(state):
        state = dict(state)
        masters = state.pop("master_params", None)
        if not opt._amp_stash.masters:  # before the first step: loaded again once the masters are made
            opt._amp_stash.saved_state = dict(state, **({} if masters is None else {"master_params": masters}))
            return own_load_state_dict(state)
        own_load_state_dict(state)
        if masters is not None:
            with torch.no_grad():
                for p, saved in zip([p for g in opt.param_groups for p in g["params"]], masters):
                    p.data.copy_(saved)  # as apex does: the version counter stays (the forward ran)

    opt.step, opt.zero_grad = step, zero_grad
    opt.state_dict, opt.load_state_dict = state_dict, load_state_dict


def _skip_next_step(opt, loss_id):
    own = opt.__dict__.get("step")
    scaler = _amp_state.loss_scalers[loss_id]

    def skip_step(*args, **kwargs):
        print("Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}".format(
            loss_id, scaler.loss_scale()))  # apex's handle.py prints it (maybe_print, verbosity 1)
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

    for o in opt_list:
        if getattr(o._amp_stash, "masters", None) is not None:
            _lazy_init_masters(o)
    yield loss.float() * scale

    if delay_unscale:
        return
    overflow = False
    with torch.no_grad():
        model_grads = [m.grad for o in opt_list for m, _ in (getattr(o._amp_stash, "masters", None) or ())
                       if m.grad is not None]
        grads = [p.grad for o in opt_list for g in o.param_groups for p in g["params"] if p.grad is not None]
        _faults.poison(model_grads + grads)
        if scaler.dynamic:
            overflow = any(not bool(torch.isfinite(g).all()) for g in model_grads + grads)
        if not overflow:
            for g in grads:
                g.mul_(1.0 / scale)
            for o in opt_list:  # the float16 gradients, unscaled into the float32 master gradients
                for model_param, master in getattr(o._amp_stash, "masters", None) or ():
                    if model_param.grad is not None:
                        master.grad = model_param.grad.float().mul_(1.0 / scale)
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
