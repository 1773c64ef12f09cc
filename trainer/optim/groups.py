"""Parameter groups by weight decay: the weights, and the normalisation layers' parameters with every bias.
``--norm-weight-decay WD`` (torchvision's reference's name) is the weight decay of the second group, which holds the
biases too (torchvision's ``--bias-weight-decay``), as MLPerf's ResNet-50 exempts them. FFCV's recipes exempt only
parameters named "bn" (decaying a ResNet's shortcut BatchNorm) and decay the classifier's bias; here both are in it. Not
given: SGD keeps one group at ``--wd``; LARS its exclusion (no weight decay, MLPerf's). A model is split by module type
and parameter name, bare parameters by shape (1-D).
"""
import torch

from trainer.errors import UsageError

NORM_LAYERS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm,
               torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d,
               torch.nn.InstanceNorm3d, torch.nn.LocalResponseNorm)
WEIGHTS, NORM_AND_BIAS, ALL = "weights", "norm_and_bias", "all"
HYPER = ("weight_decay", "momentum")  # what the command line sets in every group (the LR: the schedule, per step)


def split(params_or_model):
    """(weights, norm_and_bias): the trainable parameters, each once."""
    weights, norms = [], []
    if isinstance(params_or_model, torch.nn.Module):
        seen = set()
        for module in params_or_model.modules():
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                (norms if isinstance(module, NORM_LAYERS) or name == "bias" else weights).append(p)
    else:
        for p in params_or_model:
            if p.requires_grad:
                (norms if p.dim() <= 1 else weights).append(p)
    return weights, norms


def weight_decay_groups(params_or_model, weight_decay, norm_weight_decay=None, norm_options=None):
    """(param groups, their names): one group, or weights and norm parameters with biases (none empty)."""
    if norm_weight_decay is None:  # every parameter in the model's order, as an optimizer given them takes them
        params = params_or_model.parameters() if isinstance(params_or_model, torch.nn.Module) else params_or_model
        return [{"params": list(params), "weight_decay": weight_decay}], (ALL,)
    weights, norms = split(params_or_model)
    named = [(WEIGHTS, {"params": weights, "weight_decay": weight_decay}),
             (NORM_AND_BIAS, dict(norm_options or {}, params=norms, weight_decay=norm_weight_decay))]
    named = [(name, group) for name, group in named if group["params"]]
    return [group for _, group in named], tuple(name for name, _ in named)


def describe(optimizer, names):
    """summary.json's ``param_groups``: each group's name, tensors, elements and weight decay."""
    return [{"name": names[i] if i < len(names) else "group{}".format(i), "tensors": len(group["params"]),
             "elements": sum(p.numel() for p in group["params"]), "weight_decay": float(group.get("weight_decay", 0.0))}
            for i, group in enumerate(optimizer.param_groups)]


def load_state(optimizer, state, names, log, theirs=None):
    """A checkpoint's optimizer ``state`` into ``optimizer`` (groups ``names``), weight decay and momentum kept as
    built (a note names each that differs); another split (``theirs``: its --norm-weight-decay) is a UsageError."""
    saved = state.get("param_groups") or []
    if len(saved) != len(optimizer.param_groups) or \
            [len(g["params"]) for g in saved] != [len(g["params"]) for g in optimizer.param_groups]:
        raise UsageError("the checkpoint's optimizer has {} parameter group(s) and this run's {} ({}): "
                         "--norm-weight-decay splits the norm parameters and biases from the weights; resume as the "
                         "checkpoint was trained ({}), or start a new run in another --output-dir".format(
                             len(saved), len(optimizer.param_groups), ", ".join(names),
                             "no --norm-weight-decay" if theirs is None else "--norm-weight-decay {:g}".format(theirs)))
    built = [{k: g[k] for k in HYPER if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    diffs = []
    for name, group, mine in zip(names, optimizer.param_groups, built):
        for k, v in mine.items():
            if group.get(k) != v:
                diffs.append("{} {} {} (checkpoint {})".format(name, k, v, group.get(k)))
            group[k] = v
    if diffs:
        log("note: the command line wins over the checkpoint's optimizer: " + ", ".join(diffs))
