"""The registry of this project's own models: ``register_model`` and the builders it collected. A model module
(models/shufflenet_npu.py, tiny.py) imports only this module; models/__init__.py imports those modules and
answers by name (``get_model``, ``list_models``)."""

REGISTRY = {}  # name -> builder(num_classes=..., **kwargs)


def register_model(fn):
    """Decorator: make ``fn(num_classes=..., **kwargs)`` buildable by its name."""
    REGISTRY[fn.__name__] = fn
    return fn
