"""Optimizers by name: ``--optimizer NAME`` -> ``create_optimizer``.

Adding an optimizer is one entry in ``OPTIMIZERS``: its name and the builder (``module:function``, with
``build_sgd``'s signature, returning an ``OptimizerChoice``) in a module of this package; ``--optimizer``
takes its choices from this table. This module does not import torch (``--help`` and a bad value answer at
once); a builder's module is imported when it is created. What is device-specific (a vendor's fused kernel,
whether torch's fused kernel is the default) is asked of the ``Device``; the choice between implementations,
and the start-up proof that one is safe with a loss scaler, is made here.
"""
import importlib

from trainer.errors import UsageError

# name -> "module:builder"; builder(params_or_model, lr, momentum, weight_decay, device, with_scaler=False,
# apex_amp_in_use=False, fused=None) -> OptimizerChoice
OPTIMIZERS = {
    "sgd": "trainer.optim.sgd:build_sgd",
    "lars": "trainer.optim.lars:build_lars",
}
DEFAULT_OPTIMIZER = "sgd"


def builder(name):
    """The builder function of optimizer ``name`` (UsageError for a name not in ``OPTIMIZERS``)."""
    if name not in OPTIMIZERS:
        raise UsageError("--optimizer '{}' is not known: choose one of {}".format(name, ", ".join(OPTIMIZERS)))
    module, function = OPTIMIZERS[name].split(":")
    return getattr(importlib.import_module(module), function)


def create_optimizer(name, params_or_model, lr, momentum, weight_decay, device, with_scaler=False,
                     apex_amp_in_use=False, fused=None):
    """An ``OptimizerChoice`` (optimizer, name for logs, zero_grad mode, note) for ``--optimizer name``.

    ``params_or_model``: a model (LARS tells its BatchNorm parameters and biases by module) or parameters.
    ``with_scaler``: a GradScaler will skip overflow steps (only implementations that provably leave weights
    and momentum untouched then are chosen). ``apex_amp_in_use``: apex.amp wraps the optimizer. ``fused``:
    forces torch's fused SGD kernel on (True) or off (False); None: the device's choice.
    """
    return builder(name)(params_or_model, lr, momentum, weight_decay, device, with_scaler=with_scaler,
                         apex_amp_in_use=apex_amp_in_use, fused=fused)
