"""The device layer's names, without torch: what ``--device`` and ``--data-backend`` accept.

Argument checks (main.py's parser, the ModelZoo drivers) import this module, so that ``--help`` and a
bad value answer at once; trainer/device/__init__.py re-exports every name and holds all the rest.
"""

KINDS = ("npu", "cuda", "cpu")

KIND_ALIASES = {"gpu": "cuda"}  # the Ascend guide's parser: --device "npu or gpu"
HOST_KIND = "cpu"  # the kind without an accelerator: pytorch/examples' --no-accel

# --data-backend: where JPEGs are decoded and augmented: in the CPU data-loader workers, or on the device
HOST_DECODE, DEVICE_DECODE = "cpu", "gpu"
DATA_BACKENDS = ("auto", HOST_DECODE, DEVICE_DECODE)


# what a recipe's precision and memory-format choices mean per kind (trainer/recipes.py, --recipe fast):
# --amp where the device computes in half precision at speed; --channels-last where it is a choice (a CPU trains
# NHWC by default here, an NPU keeps its own internal format)
AMP_KINDS = ("npu", "cuda")
CHANNELS_LAST_KINDS = ("cuda",)


def canonical_kind(name):
    """``gpu`` -> ``cuda``; other names unchanged."""
    return KIND_ALIASES.get(name, name)


def without_accelerator(device):
    """--no-accel beside ``--device``: the host kind, or None where ``device`` names an accelerator (the two
    contradict each other)."""
    return HOST_KIND if device in ("auto", HOST_KIND) else None
