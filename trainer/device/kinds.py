"""The device layer's functions of a kind name (``--device``, a process group's backend): what is known before a
device exists, read from the kind's class. Each kind is a class of its own (npu.py, cuda.py, cpu.py)."""
import os

from trainer.device import host
from trainer.device.base import Device
from trainer.device.cpu import CpuDevice
from trainer.device.cuda import CudaDevice
from trainer.device.npu import NpuDevice
from trainer.device_names import KINDS, canonical_kind
from trainer.errors import UsageError

CLASSES = {cls.kind: cls for cls in (NpuDevice, CudaDevice, CpuDevice)}
assert tuple(sorted(CLASSES)) == tuple(sorted(KINDS)), "trainer/device_names.py's KINDS and the classes differ"


def class_for(kind):
    """The ``Device`` class of ``kind`` (npu, cuda, cpu, or an alias such as gpu). A kind not yet resolved
    (``auto``, as a ModelZoo driver plans before any process looks for devices) gets ``Device`` itself, whose
    attributes are the general answers: numbered devices, no kind's own limits."""
    return Device._kinds.get(canonical_kind(kind), Device)


def count(kind):
    """How many devices of ``kind`` this process can see (cpu: 1)."""
    return class_for(kind).count()


def resolve_kind(requested):
    """``auto`` -> the first kind, in ``auto_rank`` order (npu, cuda, cpu), that sees a device; others are checked."""
    requested = canonical_kind(requested)
    if requested == "auto":
        for cls in sorted(CLASSES.values(), key=lambda c: c.auto_rank):
            if cls.count() > 0:
                return cls.kind
            broken = cls.broken_stack()  # a kind that ranks first but is broken: an error, not a run elsewhere
            if broken:
                found = next(c.kind for c in sorted(CLASSES.values(), key=lambda c: c.auto_rank) if c.count() > 0)
                raise UsageError(broken.replace("--device cpu to train on the CPU",
                                                "--device {0} to train on {0}".format(found))
                                 if found != CpuDevice.kind else broken)
    cls = class_for(requested)
    if cls.count() == 0:
        raise UsageError(cls.missing())
    return requested


def binds_host_cores(kind):
    """Whether ``--cpu-binding auto`` binds the ranks of ``kind`` to slices of the host's cores."""
    return class_for(kind).binds_host_cores


def runtime_binds_cores(kind, environ):
    """Who binds the cores of ``kind``'s ranks by itself (``Device.runtime_binds_cores``), or None."""
    return class_for(kind).runtime_binds_cores(environ)


def rendezvous_schemes(kind):
    """The init_method schemes a process group of ``kind`` may use."""
    return class_for(kind).rendezvous_schemes


def supported_devices_per_node(kind):
    """Device counts per node the collectives support (the Ascend guide: 1, 2, 4 or 8 NPUs), or None."""
    return class_for(kind).supported_devices_per_node


def default_amp_impl(kind):
    """What ``--amp`` means on ``kind`` when ``--amp-impl`` is not given."""
    return class_for(kind).default_amp_impl()


def default_apex_loss_scale(kind):
    """apex's loss scale when ``--loss-scale`` is not given (None: dynamic)."""
    return class_for(kind).default_apex_loss_scale


def prefers_channels_last(kind):
    """Whether NHWC is the default memory format on ``kind``."""
    return class_for(kind).prefers_channels_last


def default_workers(kind, procs_per_node, cpus=None):
    """Data-loader workers per process when ``-j`` is not given (``Device.default_workers``)."""
    return class_for(kind).default_workers(procs_per_node, cpus)


def has_device_ids(kind):
    """Whether devices of ``kind`` are numbered (a CPU is one device; --device-list only counts slots)."""
    return class_for(kind).numbered


def supports_sync_bn(kind):
    return class_for(kind).supports_sync_bn


def compile_missing(kind):
    """Why --compile cannot run on ``kind`` with this torch, or None."""
    return class_for(kind).compile_missing()


def supports_apex(kind):
    return class_for(kind).supports_apex


def visible_devices_env(kind):
    """The environment variable that limits the visible devices of ``kind`` (None: none)."""
    return class_for(kind).visible_devices_env


def visible_devices_problem(kind):
    """A message if the visible-devices variable is one the runtime will mishandle, else None."""
    return class_for(kind).visible_devices_problem()


def visible_hint(kind):
    env = visible_devices_env(kind)
    if env and os.environ.get(env):
        return " ({}={})".format(env, os.environ[env])
    return ""


def default_backend(kind):
    return class_for(kind).dist_backend


def guides_train_with_amp(kind):
    """Whether the porting guides always train on ``kind`` with --amp (a run without it gets a note)."""
    return class_for(kind).guides_train_with_amp


def backend_owner(backend):
    """The device kind whose own collective library ``backend`` is (hccl: npu, nccl: cuda), else None."""
    return next((k for k, cls in CLASSES.items() if cls.collective_library == backend), None) if backend else None


def keep_host_memory(kind, environ=None):
    """``host.keep_host_memory`` for a run on ``kind`` (tuned only where its tensors live in host memory)."""
    return host.keep_host_memory(kind, environ, class_for(kind).tensors_on_host)


def load_location():
    """Where checkpoints are loaded first (then moved): the host."""
    return CpuDevice.kind
