"""Optimizers by name (``--optimizer NAME`` -> ``create_optimizer``), their parameter groups, LR schedule and EMA.

Adding an optimizer is one entry in ``OPTIMIZERS``: its builder (``build_sgd``'s signature). This module does not
import torch (``--help`` and a bad value answer at once). The ``Device`` says what it has; the choice between
implementations, and the proof that one is safe with a loss scaler, is made here.
"""
import collections
import importlib

from trainer.errors import UsageError

# name -> "module:builder" (build_sgd's signature; decay: a WeightDecay)
OPTIMIZERS = {"sgd": "trainer.optim.sgd:build_sgd", "lars": "trainer.optim.lars:build_lars"}
DEFAULT_OPTIMIZER = "sgd"

# the weights' weight decay, and the norm parameters' and biases' (--norm-weight-decay; None: the optimizer's default)
WeightDecay = collections.namedtuple("WeightDecay", "weights norm_and_bias")


def create_optimizer(name, params_or_model, lr, momentum, weight_decay, device, **options):
    """The ``OptimizerChoice`` for ``--optimizer name``; ``with_scaler``: only implementations proven safe with it."""
    if name not in OPTIMIZERS:
        raise UsageError("--optimizer '{}' is not known: choose one of {}".format(name, ", ".join(OPTIMIZERS)))
    module, function = OPTIMIZERS[name].split(":")
    decay = WeightDecay(weight_decay, options.pop("norm_weight_decay", None))
    choice = getattr(importlib.import_module(module), function)(params_or_model, lr, momentum, decay, device, **options)
    choice.kind = name
    return choice


def build(section, model, device, precision, fused=None):
    """The optimizer of the config's optim section for ``model`` on ``device``, safe with ``precision``'s scaler."""
    return create_optimizer(section.optimizer, model, section.lr, section.momentum, section.weight_decay, device,
                            with_scaler=precision.scaled, apex_amp_in_use=precision.impl == "apex", fused=fused,
                            norm_weight_decay=section.norm_weight_decay)
