"""Model registry: torchvision's classification models plus this project's variants.

``get_model(name, num_classes=1000, blurpool=False, **kwargs)`` builds a model by name, randomly initialised
(weights files are the trainer's business: trainer/record/checkpoint.py); nothing is ever downloaded here.
``blurpool``: FFCV's BlurPool in a torchvision ResNet's strided convolutions (models/blurpool.py;
``blurpool_archs()`` names the networks it applies to).
``published_weights_url(name)`` says where torchvision publishes ImageNet weights for a name.
``list_models()`` gives every name, for ``--help`` and for suggestions. This project's own models are registered
with ``register_model`` (models/registry.py, the one module a model module imports).
"""
import difflib
import re

from models.registry import REGISTRY as _REGISTRY, register_model  # noqa: F401 (models.register_model)


def _torchvision_models():
    # Imported when first needed: importing torchvision costs seconds (torch 2.x: its ops import
    # torch._dynamo), which this project's own models, --help and input checks do without.
    import torchvision.models
    return torchvision.models


def _torchvision_names():
    models = _torchvision_models()
    if hasattr(models, "list_models"):  # torchvision >= 0.14
        return sorted(models.list_models(module=models))
    # torchvision 0.12 (the Ascend 1.11 stack): the pytorch/examples way.
    return sorted(
        name for name in models.__dict__
        if name.islower() and not name.startswith("_") and callable(models.__dict__[name])
    )


def _ensure_local_models():
    # Imported lazily so that importing the registry stays cheap. A new model module is named here.
    from models import shufflenet_npu, tiny  # noqa: F401  (register their builders in models/registry.py)


def list_models():
    _ensure_local_models()
    return sorted(set(_torchvision_names()) | set(_REGISTRY))


def known(name):
    """Whether ``name`` can be built; this project's own models are answered without torchvision."""
    _ensure_local_models()
    return name in _REGISTRY or name in _torchvision_names()


def suggest(name, n=3):
    """Close names for a typo, best first."""
    return difflib.get_close_matches(name, list_models(), n=n, cutoff=0.5)


class UnknownModelError(ValueError):
    pass


def unknown_message(name):
    hint = suggest(name)
    return "unknown architecture '{}'{}; `main.py --list-models` lists them all".format(
        name, " (did you mean {}?)".format(", ".join(hint)) if hint else "")


# torchvision names this project builds faster: the same network, numerically identical, with
# torchvision's module names (so weights load either way). See docs/BENCHMARKS.md.
VARIANTS = {"shufflenet_v2_x{}".format(w): "shufflenet_v2_x{}_npu".format(w) for w in ("0_5", "1_0", "1_5", "2_0")}
MODEL_IMPLS = ("auto", "torchvision")


def resolve(name, impl="auto"):
    """The model to build for ``--arch name --model-impl impl``: ``auto`` takes this project's variant
    where one exists, ``torchvision`` torchvision's own network."""
    if impl == "torchvision":
        return name
    return VARIANTS.get(name, name)


def same_weights(a, b):
    """Whether models ``a`` and ``b`` have the same state dict layout (a network and its variant)."""
    base = {v: k for k, v in VARIANTS.items()}
    return base.get(a, a) == base.get(b, b)


# torchvision's ResNet builders by their names (resnet18, resnext50_32x4d, wide_resnet50_2...): what --blurpool
# applies to, told without importing torchvision, so that a command line and a recipe are checked before torch loads
_RESNET_BUILDER = re.compile(r"resnet\d+|resnext\d+_\d+x\d+d|wide_resnet\d+_\d+")


def blurpool_applies(name):
    """Whether --blurpool applies to the network ``name`` (as ``resolve`` gives it): a torchvision ResNet's."""
    return bool(_RESNET_BUILDER.fullmatch(name))


def blurpool_archs():
    """The names --blurpool applies to: torchvision's ResNet builders (resnet*, resnext*, wide_resnet*)."""
    return sorted(n for n in _torchvision_names() if blurpool_applies(n))


def get_model(name, num_classes=1000, blurpool=False, **kwargs):
    _ensure_local_models()
    if name in _REGISTRY:
        model = _REGISTRY[name](num_classes=num_classes, **kwargs)
    elif name in _torchvision_names():
        model = _torchvision_models().__dict__[name](num_classes=num_classes, **kwargs)
    else:
        raise UnknownModelError(unknown_message(name))
    if blurpool:
        from models.blurpool import BLURPOOL_ARCHS, applies_to, apply_blurpool
        if not applies_to(model):
            raise ValueError("--blurpool applies to {}, not to {}".format(BLURPOOL_ARCHS, name))
        apply_blurpool(model)
    return model


def published_weights_url(name):
    """The address of torchvision's published ImageNet weights for ``name`` (this project's variants share
    their torchvision network's), or None where torchvision publishes none."""
    base = {v: k for k, v in VARIANTS.items()}.get(name, name)
    models = _torchvision_models()
    if hasattr(models, "get_model_weights"):  # torchvision >= 0.14
        try:
            weights = models.get_model_weights(base)
        except (ValueError, KeyError):
            return None
        default = getattr(weights, "DEFAULT", None)
        return default.url if default is not None else None
    import sys  # torchvision 0.12 (the Ascend 1.11 stack): each builder's module has its model_urls
    builder = models.__dict__.get(base)
    urls = getattr(sys.modules.get(getattr(builder, "__module__", ""), None), "model_urls", {})
    return urls.get(base)
