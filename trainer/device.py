"""Device layer: the only code that knows about npu / cuda / cpu.

Every device decision of the trainer is made here: which device ``auto`` means, setting
the device once before any tensor touches it (an Ascend rule), moving batches, the
target dtype (int32 on NPU, int64 elsewhere), pin_memory (off on NPU), synchronisation,
the autocast dtype and gradient scaler, the fused optimizers it has, the process-group
backend, seeding and RNG state. APIs newer than torch 1.11 (the Ascend stack) are guarded
here with a fallback, so the rest of the trainer runs on torch 1.11 as on torch 2.x.
"""
import contextlib
import inspect
import os
import pickle
import platform
import re
import sys
import threading
import warnings

import torch

from trainer.device_names import (  # noqa: F401 (the device layer's names, re-exported)
    DATA_BACKENDS, DEVICE_DECODE, HOST_DECODE, KIND_ALIASES, KINDS, canonical_kind)
from trainer.errors import UsageError


_npu_module = None
_npu_import_error = None
_device_set = None  # (kind, index) once set_device ran in this process


# ---------------------------------------------------------------- torch_npu / apex


def npu_module():
    """``torch_npu`` if it imports, else None (the import error is kept for messages)."""
    global _npu_module, _npu_import_error
    if _npu_module is None and _npu_import_error is None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device)
            _npu_module = torch_npu
        except Exception as exc:  # ImportError, or a CANN library missing
            _npu_import_error = exc
    return _npu_module


def apex_amp():
    """``apex.amp`` (NVIDIA's or Ascend's) if it imports, else None.

    The PyPI package called "apex" is an unrelated web toolkit: it imports as ``apex``
    but has no ``amp``, and is treated as absent.
    """
    try:
        from apex import amp  # noqa: F401
    except Exception:
        return None
    return amp if hasattr(amp, "initialize") else None


def _reset_for_tests():
    global _npu_module, _npu_import_error, _device_set
    _npu_module = None
    _npu_import_error = None
    _device_set = None


# ---------------------------------------------------------------- discovery


def _npu_count():
    npu = npu_module()
    if npu is None:
        return 0
    try:
        return int(npu.npu.device_count()) if npu.npu.is_available() else 0
    except Exception:
        return 0


def count(kind):
    """How many devices of ``kind`` this process can see (cpu: 1)."""
    if kind == "npu":
        return _npu_count()
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1


def resolve_kind(requested):
    """``auto`` -> npu if torch_npu sees one, else cuda, else cpu; others are checked."""
    requested = canonical_kind(requested)
    if requested == "auto":
        for kind in ("npu", "cuda"):
            if count(kind) > 0:
                return kind
        return "cpu"
    if requested == "npu" and count("npu") == 0:
        if npu_module() is None:
            raise UsageError(
                "--device npu: torch_npu is not installed or does not import ({}); install the "
                "Ascend stack (see 1.11_requirements.txt) or pick --device cuda/cpu"
                .format(str(_npu_import_error).splitlines()[0] if _npu_import_error else "not found"))
        raise UsageError("--device npu: torch_npu sees no NPU (check `npu-smi info` and "
                         "ASCEND_RT_VISIBLE_DEVICES), or pick --device cuda/cpu")
    if requested == "cuda" and count("cuda") == 0:
        raise UsageError("--device cuda: torch {} sees no CUDA device (CPU-only build, or no driver); "
                         "pick --device cpu".format(torch.__version__))
    return requested


def rendezvous_schemes(kind):
    """The init_method schemes a process group of ``kind`` may use. The Ascend guide: on NPU the
    process group is initialised from environment variables only (init_method env://)."""
    return ("env://",) if kind == "npu" else ("env://", "tcp://", "file://")


def supported_devices_per_node(kind):
    """Device counts per node the collectives support (the Ascend guide: 1, 2, 4 or 8 NPUs), or None."""
    return (1, 2, 4, 8) if kind == "npu" else None


def default_amp_impl(kind):
    """What ``--amp`` means when ``--amp-impl`` is not given: on NPU the Ascend guide's apex.amp where
    Ascend apex is installed (torch_npu's native autocast otherwise); native autocast elsewhere."""
    return "apex" if kind == "npu" and apex_amp() is not None else "native"


def default_apex_loss_scale(kind):
    """apex's loss scale when ``--loss-scale`` is not given: the Ascend guide's parser default (static
    1024) on NPU; dynamic (None) elsewhere, as NVIDIA apex does."""
    return 1024.0 if kind == "npu" else None


def apex_supports(option):
    """Whether the installed apex.amp.initialize takes ``option`` (e.g. combine_ddp: Ascend apex only)."""
    amp = apex_amp()
    return amp is not None and option in inspect.signature(amp.initialize).parameters


def prefers_channels_last(kind):
    """Whether NHWC is the default memory format on ``kind``: CPUs, where oneDNN's convolutions run NHWC
    (bench/channels_last.py, docs/BENCHMARKS.md). NPU keeps its own formats; CUDA stays NCHW unless asked."""
    return kind == "cpu"


def usable_cpus():
    """CPU cores this process may run on (its affinity where the OS tells it)."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(kind, procs_per_node, cpus=None):
    """Data-loader workers per process when ``-j`` is not given, from each process's share of the node's cores.
    On an accelerator the workers feed the device: the share less one core for the process itself, 2 to 16
    (on an H100 with 16 cores, 16 workers kept ResNet50 at 0.88-0.99 of its synthetic rate). On a CPU they
    take cores from the model's own computation: pytorch/examples' 4, at most the share."""
    share = (cpus or usable_cpus()) // max(1, procs_per_node)
    if kind == "cpu":
        return max(1, min(4, share))
    return max(2, min(16, share - 1))


def has_device_ids(kind):
    """Whether devices of ``kind`` are numbered (a CPU is one device; --device-list only counts slots)."""
    return kind != "cpu"


def supports_sync_bn(kind):
    return kind in ("cuda", "npu")


def supports_apex(kind):
    return kind in ("cuda", "npu")


def load_location():
    """Where checkpoints are loaded first (then moved): the host."""
    return "cpu"


def visible_devices_env(kind):
    """The environment variable that limits the visible devices of ``kind``."""
    return {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}.get(kind)


def visible_devices_problem(kind):
    """A message if the visible-devices variable is one the runtime will mishandle, else None.

    The Ascend runtime maps ASCEND_RT_VISIBLE_DEVICES only when it lists devices in ascending order.
    """
    import os
    env = visible_devices_env(kind)
    if kind != "npu" or not os.environ.get(env):
        return None
    listed = [s.strip() for s in os.environ[env].split(",") if s.strip()]
    if any(not s.isdigit() for s in listed) or [int(s) for s in listed] != sorted(int(s) for s in listed):
        return ("{}={} must list devices in ascending order (the Ascend runtime fails to map them "
                "otherwise)".format(env, os.environ[env]))
    return None


def default_backend(kind):
    return {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[kind]


_OUT_OF_MEMORY = ("out of memory",  # CUDA ("CUDA out of memory"), torch_npu ("NPU out of memory")
                  "can't allocate memory")  # the CPU allocator ("DefaultCPUAllocator: can't allocate memory")


def out_of_memory(exc):
    """Whether ``exc`` is an allocation that failed on the device or the host: torch.cuda.OutOfMemoryError
    (torch >= 1.13), a RuntimeError with the allocator's words (older torch, torch_npu, the CPU), MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    cuda_oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if cuda_oom is not None and isinstance(exc, cuda_oom):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OUT_OF_MEMORY)


def guides_train_with_amp(kind):
    """Whether the porting guides always train on ``kind`` with --amp (a run without it gets a note)."""
    return kind == "npu"


def backend_owner(backend):
    """The device kind whose own collective library ``backend`` is (hccl: npu, nccl: cuda), else None."""
    return {"hccl": "npu", "nccl": "cuda"}.get(backend)


# ---------------------------------------------------------------- capabilities


def _has_amp_grad_scaler():
    return hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")  # torch >= 2.3


def _cpuinfo_flags(path="/proc/cpuinfo"):
    """The CPU feature flags of /proc/cpuinfo (x86 "flags", aarch64 "Features"); empty if unreadable."""
    try:
        with open(path) as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_HOST_MEMORY = []  # what keep_host_memory decided, once per process


def user_allocator_choice(environ=None):
    """What the environment says the user chose for host memory: their allocator (``LD_PRELOAD``) or glibc
    settings (any ``MALLOC_*`` variable), as a short description; None where they chose nothing."""
    env = os.environ if environ is None else environ
    if env.get("LD_PRELOAD", "").strip():
        return "user's allocator (LD_PRELOAD)"
    names = sorted(k for k in env if k.startswith("MALLOC_"))
    return "user's glibc settings ({})".format(",".join(names)) if names else None


def keep_host_memory(kind, environ=None):
    """On a CPU run, make glibc's malloc keep freed memory for the next step instead of returning it.

    A training step frees and allocates the same large activations every step. glibc serves blocks over
    32 MiB (and, by default, anything its trim threshold lets go) straight from the OS, so each step
    page-faults its activations in again: on a 2-core AVX2 machine that was a third of a ShuffleNetV2 x0.5
    step (docs/BENCHMARKS.md, "Host memory"). ``mallopt(M_MMAP_MAX, 0)`` and an unlimited
    ``M_TRIM_THRESHOLD`` keep the heap at its peak instead: the process's memory does not shrink after
    its largest step. Left alone where the user chose an allocator (``LD_PRELOAD``) or glibc settings
    (any ``MALLOC_*`` variable: ``MALLOC_PERTURB_=0`` changes nothing in glibc and so keeps its default;
    setting a threshold such as ``MALLOC_TRIM_THRESHOLD_`` also turns off glibc's dynamic mmap threshold), on devices
    whose tensors are not in host memory, and where the C library is not glibc. Returns a short
    description (summary.json's ``host_memory``); the first call decides for the process."""
    if _HOST_MEMORY:
        return _HOST_MEMORY[0]
    chosen = user_allocator_choice(environ)
    if kind != "cpu":
        what = "system allocator (tensors on {})".format(kind)
    elif chosen:
        what = chosen
    else:
        what = "system allocator (not glibc)"
        try:
            import ctypes
            libc = ctypes.CDLL(None)
            if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt"):
                ok = libc.mallopt(_M_MMAP_MAX, 0) == 1
                ok = libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(2 ** 31 - 1)) == 1 and ok
                what = "kept between steps (glibc: no mmap, no trim)" if ok else "system allocator (mallopt refused)"
        except (OSError, AttributeError):
            pass
    _HOST_MEMORY.append(what)
    return what


def cpu_native_bf16():
    """Whether this CPU computes bfloat16 natively (x86 avx512_bf16 / AMX, Arm bf16).

    torch's own probes (``torch.cpu._is_avx512_bf16_supported``, torch >= 2.1) where present,
    /proc/cpuinfo's flags otherwise.
    """
    probes = [getattr(getattr(torch, "cpu", None), n, None) for n in ("_is_avx512_bf16_supported",
                                                                       "_is_amx_tile_supported")]
    if platform.machine().lower() in ("x86_64", "amd64") and all(p is not None for p in probes):
        try:
            return any(bool(p()) for p in probes)
        except Exception:
            pass
    flags = _cpuinfo_flags()
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cuda_native_bf16(index=None):
    """Whether the CUDA device computes bfloat16 natively (compute capability 8.0 or newer)."""
    try:
        major, _ = torch.cuda.get_device_capability(index)
    except Exception:
        return False
    return major >= 8


# ---------------------------------------------------------------- the device


class Handoff:
    """Results of ``Device.data_work`` on its stream, on their way to the training stream (CUDA); a no-op
    elsewhere, where data work runs on the training stream itself."""

    def __init__(self, stream=None):
        self._stream, self._tensors, self._event = stream, [], None

    def __call__(self, tensor):
        if self._stream is not None:
            self._tensors.append(tensor)
        return tensor

    def seal(self):
        """The work queued on the data stream so far is what ``receive`` waits for."""
        self._event = torch.cuda.Event()
        self._event.record(self._stream)

    def receive(self):
        """The calling thread's current stream waits for the work and owns the results' memory from here."""
        if self._event is None:
            return
        cur = torch.cuda.current_stream(self._stream.device)
        cur.wait_event(self._event)
        for t in self._tensors:
            t.record_stream(cur)
        self._tensors, self._event = [], None


class Device:
    """One process's device. Build it with ``Device.create`` before any tensor work."""

    def __init__(self, kind, index):
        self.kind = kind
        self.index = index if kind != "cpu" else None
        self.torch_device = torch.device(kind if self.index is None else "{}:{}".format(kind, self.index))
        self._jpeg = None  # the JPEG decoder, once looked up (False: none)
        self._data_stream = None  # the data backend's CUDA stream (data_work)
        self._data_thread = threading.local()  # .active: inside data_work on this thread

    def __repr__(self):
        return "Device({})".format(self.name)

    @property
    def name(self):
        return str(self.torch_device)

    def description(self):
        """The device and, where the runtime tells it, its model (e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)')."""
        try:
            if self.kind == "cuda":
                return "{} ({})".format(self.name, torch.cuda.get_device_name(self.index))
            if self.kind == "npu":
                return "{} ({})".format(self.name, npu_module().npu.get_device_name(self.index))
        except Exception:
            pass
        return self.name

    @classmethod
    def create(cls, requested="auto", index=None):
        """Resolve the kind, check the index and set the device (once per process)."""
        global _device_set
        kind = resolve_kind(requested)
        index = 0 if index is None else int(index)
        if kind != "cpu":
            n = count(kind)
            if index >= n:
                raise UsageError("{} device {} does not exist: {} visible (indices 0-{}){}".format(
                    kind, index, n, n - 1, _visible_hint(kind)))
        dev = cls(kind, index)
        if kind == "cpu":  # the host is always there beside the one accelerator of a process
            return dev
        if _device_set is not None and _device_set != (dev.kind, dev.index):
            raise RuntimeError("device already set to {} in this process; one device per process"
                               .format(_device_set))
        if _device_set is None:
            if kind == "npu":
                npu_module().npu.set_device(dev.name)
            else:
                torch.cuda.set_device(dev.index)
            _device_set = (dev.kind, dev.index)
        return dev

    # -- data movement
    @property
    def pin_memory(self):
        # The Ascend 1.11 guide disables pinned memory on NPU; CPU has nothing to pin for.
        return self.kind == "cuda"

    @property
    def non_blocking(self):
        return self.kind in ("cuda", "npu")

    @property
    def target_dtype(self):
        # int64 targets fall back to slow AI-CPU kernels on Ascend; CrossEntropyLoss
        # on CPU/CUDA wants int64.
        return torch.int32 if self.kind == "npu" else torch.int64

    @property
    def index_dtype(self):
        """dtype for index tensors of index_select-based models (int32 on NPU)."""
        return torch.int32 if self.kind == "npu" else torch.int64

    def move(self, tensor):
        return tensor.to(self.torch_device, non_blocking=self.non_blocking)

    def upload(self, tensor):
        """A small host tensor (indices, sizes) on this device without waiting for the current stream: CUDA
        copies from pageable memory wait for the stream's queued work; from pinned memory they do not."""
        if self.kind == "cuda":
            return tensor.pin_memory().to(self.torch_device, non_blocking=True)
        return tensor.to(self.torch_device)

    def synchronize(self):
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.kind == "npu":
            npu_module().npu.synchronize()

    # -- mixed precision
    def resolve_amp_dtype(self, requested="auto"):
        """(dtype or None, note or None) for ``--amp --amp-dtype requested``.

        auto: float16 on NPU (the guides' choice, with a loss scaler); bfloat16 on a CUDA device with
        native bfloat16 (compute capability 8.0+), float16 on older ones; on a CPU bfloat16 only where the
        CPU has native bfloat16 instructions, else None (float32: bfloat16 autocast there is many times
        slower than float32). An explicit dtype is honoured where the device can run it at all.
        """
        if requested == "auto":
            if self.kind == "npu":
                return torch.float16, None
            if self.kind == "cuda":
                if cuda_native_bf16(self.index):
                    return torch.bfloat16, None
                return torch.float16, None
            if cpu_native_bf16():
                return torch.bfloat16, None
            return None, ("--amp: this CPU has no native bfloat16 (no avx512_bf16 or AMX), where bfloat16 "
                          "autocast is many times slower than float32: training in float32 (--amp-dtype "
                          "bfloat16 forces it)")
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[requested]
        if dtype == torch.bfloat16:
            if self.kind == "npu":
                bf16 = getattr(npu_module().npu, "is_bf16_supported", None)
                if bf16 is None or not bf16():
                    raise UsageError("--amp-dtype bfloat16: this NPU (or torch_npu) has no bfloat16; use "
                                     "--amp-dtype float16")
                return dtype, None
            if self.kind == "cuda" and not cuda_native_bf16(self.index):
                return dtype, "--amp-dtype bfloat16: this GPU has no native bfloat16 (emulated, slow)"
            if self.kind == "cpu" and not cpu_native_bf16():
                return dtype, ("--amp-dtype bfloat16: this CPU has no native bfloat16: expect float32 to be "
                               "several times faster")
            return dtype, None
        missing = self.float16_missing()
        if missing:
            raise UsageError("--amp-dtype float16 {}: use --amp-dtype bfloat16".format(missing))
        return dtype, None

    def float16_missing(self):
        """Why float16 autocast with a loss scaler cannot run on this device with this torch, or None."""
        if self.kind == "cpu" and not _has_amp_grad_scaler():
            return "on CPU needs torch >= 2.3 (CPU GradScaler); this is torch {}".format(torch.__version__)
        return None

    def autocast(self, dtype):
        """Autocast context for ``dtype`` (None: no autocast)."""
        if dtype is None:
            return contextlib.nullcontext()
        if self.kind == "npu":
            return npu_module().npu.amp.autocast(dtype=dtype)
        if hasattr(torch, "autocast"):  # torch >= 1.10
            return torch.autocast(device_type=self.kind, dtype=dtype)
        if self.kind == "cuda":
            return torch.cuda.amp.autocast()
        raise UsageError("--amp on CPU needs torch >= 1.10 (bfloat16 autocast); this is torch {}"
                         .format(torch.__version__))

    @contextlib.contextmanager
    def strict_float32(self):
        """float32 math without the reduced-precision shortcuts a device may take for float32 by default
        (TF32 convolutions and matmuls on CUDA, HF32 on newer NPUs) inside the block; restored after."""
        switches = []
        if self.kind == "cuda":
            switches = [(torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")]
        elif self.kind == "npu":
            npu = npu_module().npu
            switches = [(m, "allow_hf32") for m in (getattr(npu, "conv", None), getattr(npu, "matmul", None))
                        if m is not None and hasattr(m, "allow_hf32")]
        saved = [(obj, name, getattr(obj, name)) for obj, name in switches]
        try:
            for obj, name, _ in saved:
                setattr(obj, name, False)
            yield
        finally:
            for obj, name, value in saved:
                setattr(obj, name, value)

    def grad_scaler(self, loss_scale=None):
        """A GradScaler for float16 autocast that skips every step whose gradients hold inf/NaN.

        ``loss_scale`` None: dynamic (starts at 2**16, backs off on overflow, grows after 2000 clean
        steps). A number: the starting scale, which the caller sets back after every step. The scaler is
        always built dynamic because only the dynamic mode checks for inf/NaN: torch_npu's
        ``dynamic=False`` steps the optimizer even on an overflow.
        """
        init = 65536.0 if loss_scale is None else float(loss_scale)
        if self.kind == "npu":
            amp = npu_module().npu.amp
            kwargs = {"init_scale": init}
            if "dynamic" in inspect.signature(amp.GradScaler).parameters:
                kwargs["dynamic"] = True
            return amp.GradScaler(**kwargs)
        if _has_amp_grad_scaler():  # torch >= 2.3
            return torch.amp.GradScaler(self.kind, init_scale=init)
        missing = self.float16_missing()
        if missing:
            raise UsageError("float16 autocast {}".format(missing))
        return torch.cuda.amp.GradScaler(init_scale=init)

    # -- optimizer (the choice among them: trainer/optim)
    @property
    def prefers_torch_fused_sgd(self):
        """Whether SGD uses torch's fused kernel here by default (where the installed torch has it and it is
        proven to skip overflow steps: trainer/optim/sgd.py): on CUDA."""
        return self.kind == "cuda"

    def native_fused_sgd(self, apex_amp_in_use=False):
        """(class, name) of this device's own fused SGD, or None: on NPU torch_npu's NpuFusedSGD (apex's with
        apex.amp, where Ascend apex has it). Its gradients live in one flat buffer (zero_grad keeps them)."""
        if self.kind != "npu":
            return None
        opt_cls = getattr(getattr(npu_module(), "optim", None), "NpuFusedSGD", None)
        name = "torch_npu.optim.NpuFusedSGD"
        if apex_amp_in_use:
            try:
                from apex.optimizers import NpuFusedSGD as apex_fused
                opt_cls, name = apex_fused, "apex.optimizers.NpuFusedSGD"
            except Exception:
                pass
        return (opt_cls, name) if opt_cls is not None else None

    # -- JPEG decoding where the model runs (--data-backend gpu)
    @property
    def crops_per_image(self):
        """Whether the device backend crops image by image here (torch's uint8 resize on a CPU) rather than
        in one batched roi_align per batch, which pays on accelerators (launches) and not on a CPU."""
        return self.kind == "cpu"

    @property
    def prefers_device_decode(self):
        """Whether ``--data-backend auto`` decodes batches on this device. Not yet anywhere: on an H100 with 16
        CPU cores, from JPEGs, the device backend (batched crops) fed ShuffleNetV2 faster than the CPU backend
        (6,039 against 5,308 img/s) but ResNet50 slower (2,865 against 3,507: its decode and crops share the
        GPU and the training process's host thread with the step; docs/BENCHMARKS.md). DVPP through
        torchvision_npu has not been measured. ``--data-backend gpu`` asks for it."""
        return False

    @property
    def decode_ahead(self):
        """Whether the device backend prepares the next batch in a thread of its own beside the training step:
        on CUDA, where the host would otherwise wait for nvJPEG between steps. Not on a CPU, where that thread
        splits the same cores with the step (ShuffleNetV2 x0.5, 2 cores: 0.83x the images/s;
        docs/BENCHMARKS.md), nor on NPU, where DVPP beside a training thread has not been tried."""
        return self.kind == "cuda"

    def bind_thread(self):
        """Make this device the current one of a thread other than the one that created it (the current device
        is per thread; a new thread starts on device 0). For threads that issue data work (``data_work``)."""
        if self.kind == "cuda":
            torch.cuda.set_device(self.index)
        elif self.kind == "npu":
            npu_module().npu.set_device(self.name)

    @contextlib.contextmanager
    def data_work(self):
        """``with device.data_work() as handoff:`` the data backend's device work runs on a stream of its own
        (CUDA), so that it overlaps the training step; ``handoff(t)`` registers each result. After the block,
        ``handoff.receive()``, called by the thread that trains with the results (this one or another), makes
        the training stream wait for that work and keeps the results' memory until the training stream is done
        with them. The stream is drained first, so memory freed by the previous batch's work is idle when the
        decoder (which writes from a stream of its own) is handed it. Nested calls share the outer one.
        Elsewhere the work runs on the current stream and ``receive`` does nothing."""
        if self.kind != "cuda" or getattr(self._data_thread, "active", False):
            yield Handoff()
            return
        if self._data_stream is None:
            self._data_stream = torch.cuda.Stream(self.torch_device)
        side = self._data_stream
        handoff = Handoff(side)
        side.synchronize()
        self._data_thread.active = True
        try:
            with torch.cuda.stream(side):
                yield handoff
        finally:
            self._data_thread.active = False
        handoff.seal()

    @contextlib.contextmanager
    def data_stream(self):
        """``data_work`` whose results this thread trains with: received as soon as the block ends."""
        with self.data_work() as handoff:
            yield handoff
        handoff.receive()

    def jpeg_decoder_missing(self):
        if self.kind == "npu":
            return "the device backend on NPU needs torchvision_npu (Ascend's DVPP decode for torchvision)"
        return "torchvision {} has no JPEG decode for {}".format(_torchvision_version(), self.kind)

    def jpeg_decoder(self):
        """``decode(list of uint8 1-D CPU tensors) -> list of uint8 CHW RGB tensors on this device``, or None.

        CUDA: ``torchvision.io.decode_jpeg(..., device=...)`` (nvJPEG; one batched call where torchvision
        takes a list, 0.19+). NPU: the same call after ``import torchvision_npu``, which routes NPU devices
        to DVPP. CPU: torchvision's libjpeg decode (what tests exercise). A failing image raises RuntimeError.
        """
        if self._jpeg is not None:
            return self._jpeg or None
        self._jpeg = False
        try:
            from torchvision import io as tio
            from torchvision.io import ImageReadMode
        except Exception:
            return None
        rgb = ImageReadMode.RGB
        dev = self.torch_device
        if self.kind == "npu":
            try:
                import torchvision_npu  # noqa: F401  (patches torchvision.io.decode_jpeg for NPU tensors)
            except Exception:
                return None
            init = getattr(getattr(torch.ops, "torchvision", None), "_dvpp_init", None)
            if init is not None:
                init()
            self._jpeg = lambda raws: [tio.decode_jpeg(r, mode=rgb, device=dev) for r in raws]
        elif self.kind == "cuda":
            if "device" not in inspect.signature(tio.decode_jpeg).parameters:
                return None
            batched = _torchvision_version() >= (0, 19)  # a list is decoded in one batched nvJPEG call

            def decode(raws):
                # torchvision's CUDA decoder allocates its outputs on the current stream but writes them from a
                # private stream that does not wait for the current one, so it can be handed (and overwrite)
                # memory that kernels queued on the current stream still read: a training step's activations,
                # which then turn to NaN. So it runs only inside ``data_work``: a stream of its own, drained
                # before each batch, whose results the training stream waits for and marks as its own.
                with self.data_stream() as handoff:
                    out = tio.decode_jpeg(raws, mode=rgb, device=dev) if batched else \
                        [tio.decode_jpeg(r, mode=rgb, device=dev) for r in raws]
                    for t in out:
                        handoff(t)
                return out
            self._jpeg = decode
        else:
            def decode(raws):
                with _quiet_stderr():  # libjpeg prints "Corrupt JPEG data" itself; the trainer names the file
                    return [tio.decode_jpeg(r, mode=rgb) for r in raws]
            self._jpeg = decode
        return self._jpeg

    # -- distributed
    @property
    def dist_backend(self):
        return default_backend(self.kind)

    @property
    def ddp_device_ids(self):
        return None if self.kind == "cpu" else [self.index]

    def ddp(self, model, broadcast_buffers=True):
        """DistributedDataParallel on this device (buffer sync flag named per torch version)."""
        DDP = torch.nn.parallel.DistributedDataParallel
        params = inspect.signature(DDP.__init__).parameters
        if "forward_sync_buffers" in params:  # newer torch deprecates broadcast_buffers
            return DDP(model, device_ids=self.ddp_device_ids, forward_sync_buffers=broadcast_buffers)
        return DDP(model, device_ids=self.ddp_device_ids, broadcast_buffers=broadcast_buffers)

    # -- randomness
    def manual_seed(self, seed):
        torch.manual_seed(seed)  # CPU and CUDA
        if self.kind == "npu":
            npu_module().npu.manual_seed_all(seed)

    def rng_state(self):
        if self.kind == "cuda":
            return torch.cuda.get_rng_state(self.torch_device)
        if self.kind == "npu":
            return npu_module().npu.get_rng_state()
        return None

    def set_rng_state(self, state):
        if state is None:
            return
        if self.kind == "cuda":
            torch.cuda.set_rng_state(state.cpu(), self.torch_device)
        elif self.kind == "npu":
            npu_module().npu.set_rng_state(state.cpu())

    # -- profiling
    def profiler_activities(self):
        """(profile function, activities) for torch.profiler or torch_npu.profiler."""
        if self.kind == "npu":
            prof = npu_module().profiler
            return prof, [prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU]
        prof = torch.profiler
        acts = [prof.ProfilerActivity.CPU]
        if self.kind == "cuda":
            acts.append(prof.ProfilerActivity.CUDA)
        return prof, acts


def _visible_hint(kind):
    env = visible_devices_env(kind)
    import os
    if env and os.environ.get(env):
        return " ({}={})".format(env, os.environ[env])
    return ""


# ---------------------------------------------------------------- torch-version guards


def torch_load(path, map_location="cpu", weights_only=True):
    """torch.load with ``weights_only`` where this torch has it (>= 1.13). torch 2.0-2.2's weights-only
    unpickler warns "TypedStorage is deprecated" on every file (its own use, nothing of the caller's):
    that warning is silenced here so that a run's stderr keeps to its one-line contract."""
    kwargs = {"map_location": map_location}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kwargs["weights_only"] = weights_only
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        try:
            return torch.load(path, **kwargs)
        except pickle.UnpicklingError as exc:
            text = str(exc)
            if not text.startswith("Weights only load failed"):
                raise
            found = re.search(r"Unsupported (?:global: GLOBAL |class )([\w.]+)", text)
            raise UnsafeCheckpoint(found.group(1) if found else None)


class UnsafeCheckpoint(Exception):
    """torch's weights-only loader refused a file: it holds Python objects beyond tensors and plain data
    (``what``: the first such class, where torch names it), and unpickling them could run code."""

    def __init__(self, what):
        Exception.__init__(self, what)
        self.what = what


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 pointed at /dev/null inside (C libraries' own warnings)."""
    import os
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


_UINT8_RESIZE = []


def uint8_antialias_resize():
    """Whether ``F.interpolate`` resizes uint8 images with antialiasing here (torch >= 2.1, a vectorised CPU
    kernel about 3x faster than PIL's resize: docs/BENCHMARKS.md); older torch resizes with PIL."""
    if not _UINT8_RESIZE:
        major_minor = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
        try:
            if major_minor < (2, 1):  # 2.0 takes uint8 too, without the vectorised kernel
                raise NotImplementedError
            x = torch.zeros((1, 3, 4, 4), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
            ok = torch.nn.functional.interpolate(x, size=(2, 2), mode="bilinear", antialias=True,
                                                 align_corners=False).dtype == torch.uint8
        except (TypeError, RuntimeError, NotImplementedError):
            ok = False
        _UINT8_RESIZE.append(ok)
    return _UINT8_RESIZE[0]


def _torchvision_version():
    try:
        import torchvision
        return tuple(int(p) for p in torchvision.__version__.split("+")[0].split(".")[:2])
    except Exception:
        return (0, 0)


def _installed_version(dist, module):
    """A package's version from its metadata (without importing it: torchvision's import costs seconds),
    else from the module; None when it is not installed."""
    try:
        from importlib import metadata  # novermin (3.8; Python 3.7 takes the module's __version__ below)
        return metadata.version(dist)
    except Exception:
        pass
    try:
        return __import__(module).__version__
    except Exception:
        return None


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "torchvision": _installed_version("torchvision", "torchvision")}
    npu = sys.modules.get("torch_npu")
    out["torch_npu"] = getattr(npu, "__version__", "unknown") if npu is not None else None
    amp = apex_amp()
    if amp is not None:
        import apex
        out["apex"] = getattr(apex, "__version__", "present")
    else:
        out["apex"] = None
    return out
