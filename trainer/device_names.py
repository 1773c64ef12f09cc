"""The device layer's names, without torch: what ``--device`` and ``--data-backend`` accept.

Argument checks (main.py's parser, the ModelZoo drivers) import this module, so that ``--help`` and a
bad value answer at once; trainer/device/__init__.py re-exports every name and holds all the rest.
"""

KINDS = ("npu", "cuda", "cpu")

KIND_ALIASES = {"gpu": "cuda"}  # the Ascend guide's parser: --device "npu or gpu"

# --data-backend: where JPEGs are decoded and augmented: in the CPU data-loader workers, or on the device
HOST_DECODE, DEVICE_DECODE = "cpu", "gpu"
DATA_BACKENDS = ("auto", HOST_DECODE, DEVICE_DECODE)


def canonical_kind(name):
    """``gpu`` -> ``cuda``; other names unchanged."""
    return KIND_ALIASES.get(name, name)
