"""``Device``: what every device kind shares, and the attributes and methods each kind defines for itself
(trainer/device/npu.py, cuda.py, cpu.py). ``Device(kind, index)`` and ``Device.create`` return the kind's class;
``Device.of(kind)`` is the class of a kind name (``--device``), whose attributes answer before a device exists.
The kinds' modules register their classes as they are imported (trainer/device/__init__.py imports them); this
module imports none of them.
"""
import contextlib
import inspect
import os

import torch

from trainer.device import host, shims
from trainer.device_names import canonical_kind
from trainer.errors import UsageError

_current = {"set": None}  # (kind, index) once a device was made current in this process


class Handoff:
    """Results of ``Device.data_work`` on their way to the training stream. This one: data work ran on the
    training stream itself, and there is nothing to hand off (a CUDA device's is cuda.StreamHandoff)."""

    def __call__(self, tensor):
        return tensor

    def seal(self):
        pass

    def receive(self):
        pass


class Device:
    """One process's device. Build it with ``Device.create`` before any tensor work.

    A kind is a subclass with ``kind`` set; it defines every attribute below that says "each kind". Where a
    kind adds nothing the base's value is the general one (noted as such)."""

    kind = None  # each kind
    _kinds = {}  # kind -> class, filled as the kinds' modules are imported

    # -- each kind: facts known before a device exists (read through ``Device.of(kind)`` by a kind's name)
    auto_rank = None  # order in which --device auto tries the kinds (the first with a device wins)
    numbered = True  # devices of the kind are numbered (a CPU is one device; --device-list only counts slots)
    tensors_on_host = False  # its tensors live in host memory (host.keep_host_memory tunes malloc for them)
    visible_devices_env = None  # the environment variable that limits the visible devices
    rendezvous_schemes = ("env://", "tcp://", "file://")  # init_method schemes its process group may use
    supported_devices_per_node = None  # device counts per node its collectives support, None: any
    dist_backend = None  # each kind: the process-group backend
    collective_library = None  # the backend that is the kind's own library (hccl, nccl), or None
    supports_sync_bn = True
    supports_apex = True
    prefers_channels_last = False  # NHWC the default memory format
    measures_amp_dtype = False  # --amp-dtype auto is confirmed by timing the run's model (precision/amp_probe.py)
    guides_train_with_amp = False  # the porting guides always train with --amp on it
    default_apex_loss_scale = None  # apex's loss scale without --loss-scale (None: dynamic, NVIDIA apex's)
    pin_memory = False  # the loaders pin host memory (--pin-memory: ``configure``)
    pin_memory_device = None  # the DataLoader's pin_memory_device where it needs one to pin for the device
    binds_host_cores = True  # --cpu-binding auto binds its ranks to slices of the host's cores (job/affinity.py)
    computes_on_host_cores = False  # its ops run on the host's cores: a node's ranks share them (job/affinity.py)
    non_blocking = True
    target_dtype = torch.int64  # CrossEntropyLoss's target dtype on the device
    index_dtype = torch.int64  # index tensors of index_select-based models
    prefers_torch_fused_sgd = False  # SGD uses torch's fused kernel by default (trainer/optim/sgd.py)
    crops_per_image = False  # the device data backend crops image by image rather than one batched roi_align
    decode_ahead = False  # the device data backend prepares the next batch in a thread of its own
    # Whether ``--data-backend auto`` decodes batches on this device. Not yet anywhere: on an H100 with 16 CPU
    # cores, from JPEGs, the device backend (batched crops) fed ShuffleNetV2 faster than the CPU backend (6,039
    # against 5,308 img/s) but ResNet50 slower (2,865 against 3,507: its decode and crops share the GPU and the
    # training process's host thread with the step; docs/BENCHMARKS.md). DVPP through torchvision_npu has not
    # been measured. ``--data-backend gpu`` asks for it.
    prefers_device_decode = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind is not None:
            Device._kinds[cls.kind] = cls

    def __new__(cls, kind=None, index=None):
        if cls is Device:
            if kind not in Device._kinds:
                raise ValueError("no device kind '{}' (kinds: {})".format(kind, ", ".join(sorted(Device._kinds))))
            cls = Device._kinds[kind]
        return object.__new__(cls)

    def __init__(self, kind=None, index=None):
        if kind is not None and kind != self.kind:
            raise ValueError("{} is the class of kind '{}', not '{}'".format(type(self).__name__, self.kind, kind))
        self.index = index if self.numbered else None
        self.torch_device = torch.device(self.kind if self.index is None else "{}:{}".format(self.kind, self.index))
        self._jpeg = None  # the JPEG decoder, once looked up (False: none)

    def __repr__(self):
        return "Device({})".format(self.name)

    @property
    def name(self):
        return str(self.torch_device)

    # -- the kinds, by name
    @staticmethod
    def of(kind):
        """The ``Device`` class of ``kind`` (npu, cuda, cpu, or an alias such as gpu). A kind not yet resolved
        (``auto``, as a ModelZoo driver plans before any process looks for devices) gets ``Device`` itself, whose
        attributes are the general answers: numbered devices, no kind's own limits."""
        return Device._kinds.get(canonical_kind(kind), Device)

    @staticmethod
    def resolve_kind(requested):
        """``auto`` -> the first kind, in ``auto_rank`` order (npu, cuda, cpu), that sees a device; others are
        checked (``--device KIND`` with no device of the kind: its ``missing`` line)."""
        requested = canonical_kind(requested)
        if requested == "auto":
            ranked = sorted(Device._kinds.values(), key=lambda c: c.auto_rank)
            for cls in ranked:
                if cls.count() > 0:
                    return cls.kind
                broken = cls.broken_stack()  # a kind that ranks first but is broken: an error, not a run elsewhere
                if broken:
                    found = next(c for c in ranked if c.count() > 0)
                    # The line advises the host (the kind that is not numbered: always there); where another
                    # kind has devices, it advises that one.
                    raise UsageError(broken.replace("--device cpu to train on the CPU",
                                                    "--device {0} to train on {0}".format(found.kind))
                                     if found.numbered else broken)
        cls = Device.of(requested)
        if cls.count() == 0:
            raise UsageError(cls.missing())
        return requested

    @staticmethod
    def backend_owner(backend):
        """The device kind whose own collective library ``backend`` is (hccl: npu, nccl: cuda), else None."""
        if not backend:
            return None
        return next((k for k, cls in Device._kinds.items() if cls.collective_library == backend), None)

    @classmethod
    def visible_hint(cls):
        """`` (VAR=value)`` where the kind's visible-devices variable is set, for messages; else ''."""
        env = cls.visible_devices_env
        if env and os.environ.get(env):
            return " ({}={})".format(env, os.environ[env])
        return ""

    @classmethod
    def keep_host_memory(cls, environ=None):
        """``host.keep_host_memory`` for a run on the kind (tuned only where its tensors live in host memory)."""
        return host.keep_host_memory(cls.kind, environ, cls.tensors_on_host)

    # -- each kind: before a device exists
    @classmethod
    def count(cls):
        """How many devices of the kind this process can see."""
        raise NotImplementedError

    @classmethod
    def missing(cls):
        """The one line for ``--device KIND`` when ``count()`` is 0 (a kind that is always there: never asked)."""
        raise NotImplementedError

    @classmethod
    def broken_stack(cls):
        """The one line when the kind's software is on this host but cannot be used (``--device auto`` must not
        train elsewhere then), else None (the general case: a kind is there or not)."""
        return None

    @classmethod
    def runtime_binds_cores(cls, environ):
        """Who binds the ranks' cores instead of trainer/job/affinity.py (the kind's runtime, as the user asked it
        in ``environ``), or None (the general case)."""
        return None

    @classmethod
    def default_amp_impl(cls):
        """What ``--amp`` means when ``--amp-impl`` is not given: native autocast (the general case)."""
        return "native"

    @classmethod
    def default_workers(cls, procs_per_node, cpus=None):
        """Data-loader workers per process when ``-j`` is not given, from each process's share of the node's
        cores. On an accelerator (the general case) the workers feed the device: the share less one core for the
        process itself, 2 to 16 (on an H100 with 16 cores, 16 workers kept ResNet50 at 0.88-0.99 of its
        synthetic rate)."""
        share = (cpus or host.usable_cpus()) // max(1, procs_per_node)
        return max(2, min(16, share - 1))

    @classmethod
    def visible_devices_problem(cls):
        """A message if the visible-devices variable is one the runtime will mishandle, else None."""
        return None

    @classmethod
    def settings_problem(cls, section):
        """A device setting of ``section`` (a LaunchConfig) the kind cannot honour: its one line, else None. The
        general case: torch_npu's own settings are refused."""
        for flag, value in (("--jit-compile", section.jit_compile), ("--internal-format", section.internal_format)):
            if value != "auto":
                return "{} {} is a torch_npu setting: drop it on {}".format(flag, value, cls.kind.upper())
        return None

    def configure(self, section):
        """Apply the device settings of ``section`` (a LaunchConfig) once the device is current; returns their
        values for the log and summary.json (the general case: pinned memory only)."""
        if section.pin_memory != "auto":
            self.pin_memory = section.pin_memory == "on"
        return {"pin_memory": self.pin_memory}

    # -- creation
    @classmethod
    def create(cls, requested="auto", index=None):
        """Resolve the kind, check the index and make the device current (once per process)."""
        kind_cls = Device.of(Device.resolve_kind(requested))
        index = 0 if index is None else int(index)
        if kind_cls.numbered:
            n = kind_cls.count()
            if index >= n:
                raise UsageError("{} device {} does not exist: {} visible (indices 0-{}){}".format(
                    kind_cls.kind, index, n, n - 1, kind_cls.visible_hint()))
        dev = kind_cls(kind_cls.kind, index)
        if not dev.numbered:  # the host is always there beside the one accelerator of a process
            return dev
        if _current["set"] is not None and _current["set"] != (dev.kind, dev.index):
            raise RuntimeError("device already set to {} in this process; one device per process"
                               .format(_current["set"]))
        if _current["set"] is None:
            dev._make_current()
            _current["set"] = (dev.kind, dev.index)
        return dev

    def _make_current(self):
        """Each numbered kind: set this device as the process's (and the calling thread's) current one."""
        raise NotImplementedError

    def description(self):
        """The device and, where the runtime tells it, its model (e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)')."""
        try:
            model = self._model_name()
        except Exception:
            model = None
        return "{} ({})".format(self.name, model) if model else self.name

    def _model_name(self):
        return None

    # -- data movement
    def move(self, tensor):
        return tensor.to(self.torch_device, non_blocking=self.non_blocking)

    def upload(self, tensor):
        """A small host tensor (indices, sizes) on this device."""
        return tensor.to(self.torch_device)

    def synchronize(self):
        """Wait for the device's queued work (each accelerator kind)."""

    # -- mixed precision
    def resolve_amp_dtype(self, requested="auto"):
        """(dtype or None, note or None) for ``--amp --amp-dtype requested``.

        auto: the kind's choice (``_auto_amp_dtype``). An explicit dtype is honoured where the device can run it
        at all: bfloat16 as ``_bfloat16_note`` says (a note where it is slow, UsageError where it cannot run),
        float16 unless ``float16_missing``.
        """
        if requested == "auto":
            return self._auto_amp_dtype()
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[requested]
        if dtype == torch.bfloat16:
            return dtype, self._bfloat16_note()
        missing = self.float16_missing()
        if missing:
            raise UsageError("--amp-dtype float16 {}: use --amp-dtype bfloat16".format(missing))
        return dtype, None

    def _auto_amp_dtype(self):
        raise NotImplementedError  # each kind

    def _bfloat16_note(self):
        return None

    def float16_missing(self):
        """Why float16 autocast with a loss scaler cannot run on this device with this torch, or None."""
        return None

    def autocast(self, dtype):
        """Autocast context for ``dtype`` (None: no autocast): torch.autocast for the kind (torch >= 1.10)."""
        if dtype is None:
            return contextlib.nullcontext()
        if hasattr(torch, "autocast"):  # torch >= 1.10
            return torch.autocast(device_type=self.kind, dtype=dtype)
        return self._autocast_before_1_10(dtype)

    def _autocast_before_1_10(self, dtype):
        raise UsageError("--amp on {} needs torch >= 1.10 (autocast); this is torch {}".format(
            self.kind.upper(), torch.__version__))

    def _reduced_float32_switches(self):
        """[(object, attribute)] of the switches that let float32 math take reduced-precision shortcuts here."""
        return []

    def _hf32_switches(self):
        """The switches ModelZoo's ALLOW_HF32 turns on (the kind's reduced-precision float32 paths)."""
        return self._reduced_float32_switches()

    def set_float32_math(self, mode):
        """ModelZoo's ALLOW_HF32 (``reduced``: float32 convolutions may take the device's reduced-precision path,
        HF32 on NPU, TF32 on CUDA) or ALLOW_FP32 (``full``: every such switch off). Returns the note for the log."""
        switches = self._hf32_switches() if mode == "reduced" else self._reduced_float32_switches()
        for obj, name in switches:
            setattr(obj, name, mode == "reduced")
        flag = "ALLOW_HF32" if mode == "reduced" else "ALLOW_FP32"
        if not switches:
            return "{}: {} has no reduced-precision float32 path to switch; float32 as always".format(
                flag, self.kind.upper())
        return "{}: {} switch(es) of {} set to {} ({})".format(
            flag, len(switches), self.kind.upper(), mode == "reduced",
            "float32 convolutions may use its reduced-precision path" if mode == "reduced" else "full float32 math")

    @contextlib.contextmanager
    def strict_float32(self):
        """float32 math without the reduced-precision shortcuts a device may take for float32 by default
        (TF32 convolutions and matmuls on CUDA, HF32 on newer NPUs) inside the block; restored after."""
        saved = [(obj, name, getattr(obj, name)) for obj, name in self._reduced_float32_switches()]
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
        if shims._has_amp_grad_scaler():  # torch >= 2.3
            return torch.amp.GradScaler(self.kind, init_scale=init)
        missing = self.float16_missing()
        if missing:
            raise UsageError("float16 autocast {}".format(missing))
        return torch.cuda.amp.GradScaler(init_scale=init)

    # -- graph mode (--compile; trainer/graph.py)
    @classmethod
    def compile_missing(cls):
        """Why --compile cannot run here with this torch (checked before any process starts), or None."""
        if not shims.has_torch_compile():
            return "--compile needs torch >= 2.0 (torch.compile); this is torch {}: drop --compile".format(
                torch.__version__)
        return None

    def compile(self, model, mode):
        """(``model`` in graph mode, the backend's name, a note or None): torch.compile with its inductor backend in
        ``mode`` (--compile-mode). Compiling happens on the first call; what fails there is trainer/graph.py's."""
        return shims.torch_compile(model, mode=mode), "inductor", None

    def compile_warning(self, dtype):
        """Why graph mode is expected to be slower than eager here with autocast ``dtype`` (None: float32), or
        None."""
        return None

    # -- optimizer (the choice among them: trainer/optim)
    def native_fused_sgd(self, apex_amp_in_use=False):
        """(class, name) of this device's own fused SGD (a vendor's kernel), or None."""
        return None

    # -- JPEG decoding where the model runs (--data-backend gpu)
    def bind_thread(self):
        """Make this device the current one of a thread other than the one that created it (the current device
        is per thread; a new thread starts on device 0). For threads that issue data work (``data_work``)."""

    @contextlib.contextmanager
    def data_work(self):
        """``with device.data_work() as handoff:`` the data backend's device work; ``handoff(t)`` registers each
        result and ``handoff.receive()``, called by the thread that trains with the results, makes them its own.
        Here the work runs on the current stream and ``receive`` does nothing (CUDA: a stream of its own)."""
        yield Handoff()

    @contextlib.contextmanager
    def data_stream(self):
        """``data_work`` whose results this thread trains with: received as soon as the block ends."""
        with self.data_work() as handoff:
            yield handoff
        handoff.receive()

    def jpeg_decoder_missing(self):
        return "torchvision {} has no JPEG decode for {}".format(shims._torchvision_version(), self.kind)

    def jpeg_decoder(self):
        """``decode(list of uint8 1-D CPU tensors) -> list of uint8 CHW RGB tensors on this device``, or None
        (each kind's ``_make_jpeg_decoder``). A failing image raises RuntimeError."""
        if self._jpeg is not None:
            return self._jpeg or None
        self._jpeg = False
        try:
            from torchvision import io as tio
            from torchvision.io import ImageReadMode
        except Exception:
            return None
        self._jpeg = self._make_jpeg_decoder(tio, ImageReadMode.RGB) or False
        return self._jpeg or None

    def _make_jpeg_decoder(self, tio, rgb):
        raise NotImplementedError  # each kind

    # -- distributed
    @property
    def ddp_device_ids(self):
        return [self.index] if self.numbered else None

    def ddp(self, model, broadcast_buffers=True):
        """DistributedDataParallel on this device (buffer sync flag named per torch version)."""
        DDP = torch.nn.parallel.DistributedDataParallel
        params = inspect.signature(DDP.__init__).parameters
        if "forward_sync_buffers" in params:  # newer torch deprecates broadcast_buffers
            return DDP(model, device_ids=self.ddp_device_ids, forward_sync_buffers=broadcast_buffers)
        return DDP(model, device_ids=self.ddp_device_ids, broadcast_buffers=broadcast_buffers)

    # -- randomness
    def manual_seed(self, seed):
        torch.manual_seed(seed)  # the CPU's generator (and CUDA's, which torch seeds with it)

    def deterministic(self):
        """--deterministic: torch's deterministic algorithms where an op has one (an op without one warns instead
        of failing), plus the kind's own switches (``_deterministic_extra``). Returns a note saying what was set."""
        torch.use_deterministic_algorithms(True, warn_only=True)
        return ", ".join(["torch.use_deterministic_algorithms(warn_only)"] + self._deterministic_extra())

    def _deterministic_extra(self):
        """Each kind's own deterministic switches, set; their names."""
        return []

    def rng_state(self):
        """The device's own generator state, or None where the CPU's is the only one."""
        return None

    def set_rng_state(self, state):
        pass

    # -- profiling
    def profiler_activities(self):
        """(profile function, activities) for torch.profiler (or the kind's own profiler)."""
        prof = torch.profiler
        return prof, [prof.ProfilerActivity.CPU] + self._profiler_extra(prof)

    def _profiler_extra(self, prof):
        return []


def reset_current():
    _current["set"] = None
