"""The device layer's names, without torch (so that argument checks answer at once): what ``--device`` and
``--data-backend`` accept. trainer/device/__init__.py re-exports KINDS and holds all the rest."""

KINDS = ("npu", "cuda", "cpu")

KIND_ALIASES = {"gpu": "cuda"}  # the Ascend guide's parser: --device "npu or gpu"
HOST_KIND = "cpu"  # the kind without an accelerator: pytorch/examples' --no-accel

# --data-backend: where JPEGs are decoded and augmented: in the CPU data-loader workers, or on the device
HOST_DECODE, DEVICE_DECODE = "cpu", "gpu"
DATA_BACKENDS = ("auto", HOST_DECODE, DEVICE_DECODE)

# per kind, for trainer/recipes.py's --recipe fast: --amp where half precision is fast; --channels-last where it is a
# choice (a CPU trains NHWC by default here, an NPU keeps its own internal format)
AMP_KINDS = ("npu", "cuda")
CHANNELS_LAST_KINDS = ("cuda",)


# torch >= 2.5 imports every installed device extension with torch (its "torch.backends" entry points: torch_npu's
# _autoload), and torch_npu's import takes the NPU; "0" turns that off for the process and the ones it starts
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def host_run_env(kind, environ):
    """Before torch is imported: a run asked for the host (``--device cpu``, ``--no-accel``) loads no device extension
    with torch (an installed torch_npu would take a card, and a CPU golden run on an Ascend host must not), unless the
    user set AUTOLOAD. Returns whether it set it."""
    if kind != HOST_KIND or AUTOLOAD in environ:
        return False
    environ[AUTOLOAD] = "0"
    return True


def canonical_kind(name):
    """``gpu`` -> ``cuda``; other names unchanged."""
    return KIND_ALIASES.get(name, name)


def without_accelerator(device):
    """--no-accel beside ``--device``: the host kind, or None where ``device`` names an accelerator (contradicting)."""
    return HOST_KIND if device in ("auto", HOST_KIND) else None


def asked_kind(device, no_accel):
    """The kind ``--device`` and ``--no-accel`` ask for ("auto" where the machine decides; None: they contradict)."""
    return without_accelerator(canonical_kind(device)) if no_accel else canonical_kind(device)
