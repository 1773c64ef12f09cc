"""Optimizers by name: ``--optimizer NAME`` -> ``create_optimizer``.

Adding an optimizer is one entry in ``OPTIMIZERS``: its name and the builder (``module:function``, with
``build_sgd``'s signature, returning an ``OptimizerChoice``) in a module of this package; ``--optimizer``
takes its choices from this table. This module does not import torch (``--help`` and a bad value answer at
once); a builder's module is imported when it is created. What is device-specific (a vendor's fused kernel,
whether torch's fused kernel is the default) is asked of the ``Device``; the choice between implementations,
and the start-up proof that one is safe with a loss scaler, is made here.

Beside the optimizers: ``groups`` (parameter groups by weight decay, --norm-weight-decay), ``schedule`` (the LR
schedule), ``ema`` (--model-ema: the weights' exponential moving average).
"""
import collections
import importlib

from trainer.errors import UsageError

# name -> "module:builder"; builder(params_or_model, lr, momentum, decay, device, with_scaler=False,
# apex_amp_in_use=False, fused=None) -> OptimizerChoice; decay: a WeightDecay
OPTIMIZERS = {
    "sgd": "trainer.optim.sgd:build_sgd",
    "lars": "trainer.optim.lars:build_lars",
}
DEFAULT_OPTIMIZER = "sgd"

# the weight decay of the weights, and of the norm parameters and biases (--norm-weight-decay; None: the
# optimizer's default), which trainer/optim/groups.py puts in groups
WeightDecay = collections.namedtuple("WeightDecay", "weights norm_and_bias")


def builder(name):
    """The builder function of optimizer ``name`` (UsageError for a name not in ``OPTIMIZERS``)."""
    if name not in OPTIMIZERS:
        raise UsageError("--optimizer '{}' is not known: choose one of {}".format(name, ", ".join(OPTIMIZERS)))
    module, function = OPTIMIZERS[name].split(":")
    return getattr(importlib.import_module(module), function)


def create_optimizer(name, params_or_model, lr, momentum, weight_decay, device, **options):
    """An ``OptimizerChoice`` (optimizer, name for logs, zero_grad mode, note; ``kind``: ``name``) for
    ``--optimizer name``.

    ``params_or_model``: a model (LARS tells its BatchNorm parameters and biases by module) or parameters.
    ``options``, passed on to the builder: ``with_scaler`` (a GradScaler will skip overflow steps: only
    implementations that provably leave weights and momentum untouched then are chosen), ``apex_amp_in_use``
    (apex.amp wraps the optimizer), ``fused`` (forces torch's fused SGD kernel on (True) or off (False); None:
    the device's choice), ``norm_weight_decay`` (the norm parameters' and biases' weight decay, a group of their
    own: trainer/optim/groups.py; None: the optimizer's default).
    """
    decay = WeightDecay(weight_decay, options.pop("norm_weight_decay", None))
    choice = builder(name)(params_or_model, lr, momentum, decay, device, **options)
    choice.kind = name
    return choice


def build(section, model, device, precision, fused=None):
    """The optimizer of the config's optim section (a config.OptimConfig) for ``model`` on ``device``, chosen to
    be safe with ``precision`` (an amp.Precision: its loss scaler, apex); precision/amp.py's ``wrap`` steps it."""
    return create_optimizer(section.optimizer, model, section.lr, section.momentum, section.weight_decay, device,
                            with_scaler=precision.scaled, apex_amp_in_use=precision.impl == "apex", fused=fused,
                            norm_weight_decay=section.norm_weight_decay)
