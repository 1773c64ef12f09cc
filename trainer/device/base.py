"""``Device``: what every device kind shares, and what each kind (npu.py, cuda.py, cpu.py, registered as they are
imported) defines. ``Device(kind, index)`` and ``Device.create`` return the kind's class; ``Device.of(kind)`` is it."""
import contextlib
import inspect
import os

import torch

from trainer.device import host, shims
from trainer.device_names import canonical_kind
from trainer.errors import UsageError

_current = {"set": None}  # (kind, index) once a device was made current in this process


class Handoff:
    """Results of ``Device.data_work`` run on the training stream itself: nothing to hand off (CUDA: StreamHandoff)."""

    def __call__(self, tensor):
        return tensor

    def receive(self):
        pass


class Device:
    """One process's device, built with ``Device.create`` before any tensor work. A kind is a subclass with ``kind``
    set; it defines what says "each kind" below, the classmethods ``count()`` (devices this process sees) and
    ``missing()`` (the line for ``--device KIND`` when it sees none), ``_auto_amp_dtype``, ``_bfloat16_note``,
    ``_make_jpeg_decoder`` and (numbered kinds) ``_make_current``; elsewhere the base's value is the general one."""

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
    supports_sync_bn = supports_apex = True
    prefers_channels_last = False  # NHWC the default memory format
    measures_amp_dtype = False  # --amp-dtype auto is confirmed by timing the run's model (precision/amp_probe.py)
    guides_train_with_amp = False  # the porting guides always train with --amp on it
    default_apex_loss_scale = None  # apex's loss scale without --loss-scale (None: dynamic, NVIDIA apex's)
    pin_memory = False  # the loaders pin host memory (--pin-memory: ``configure``)
    pin_memory_device = None  # the DataLoader's pin_memory_device where it needs one to pin for the device
    binds_host_cores = True  # --cpu-binding auto binds its ranks to slices of the host's cores (job/affinity.py)
    computes_on_host_cores = False  # its ops run on the host's cores: a node's ranks share them (job/affinity.py)
    non_blocking = True
    target_dtype = index_dtype = torch.int64  # CrossEntropyLoss's targets, index_select-based models' indices
    prefers_torch_fused_sgd = False  # SGD uses torch's fused kernel by default (trainer/optim/sgd.py)
    crops_per_image = False  # the device data backend crops image by image rather than one batched roi_align
    decode_ahead = False  # the device data backend prepares the next batch in a thread of its own
    # Whether ``--data-backend auto`` decodes on the device. Nowhere yet: on an H100 with 16 cores the device backend
    # fed ShuffleNetV2 faster than the CPU one (6,039 against 5,308 img/s) but ResNet50 slower (2,865 against 3,507:
    # decode and crops share the GPU and host thread with the step; docs/BENCHMARKS.md); DVPP is unmeasured.
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

    @staticmethod
    def of(kind):
        """The class of ``kind`` (or an alias such as gpu); a kind not yet resolved (``auto``, as a ModelZoo driver
        plans) gets ``Device`` itself, whose attributes are the general answers."""
        return Device._kinds.get(canonical_kind(kind), Device)

    @staticmethod
    def resolve_kind(requested):
        """``auto``: the first kind by ``auto_rank`` that sees a device; a kind seeing none: its ``missing`` line."""
        requested = canonical_kind(requested)
        if requested == "auto":
            ranked = sorted(Device._kinds.values(), key=lambda c: c.auto_rank)
            for cls in ranked:
                if cls.count() > 0:
                    return cls.kind
                broken = cls.broken_stack()  # a kind that ranks first but is broken: an error, not a run elsewhere
                if broken:
                    found = next(c for c in ranked if c.count() > 0)
                    # the line advises the host (always there); where another kind has devices, that one
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
        return next((k for k, cls in Device._kinds.items() if backend and cls.collective_library == backend), None)

    @classmethod
    def visible_hint(cls):
        """`` (VAR=value)`` where the kind's visible-devices variable is set, for messages; else ''."""
        env = cls.visible_devices_env
        return " ({}={})".format(env, os.environ[env]) if env and os.environ.get(env) else ""

    @classmethod
    def keep_host_memory(cls, environ=None):
        """``host.keep_host_memory`` for a run on the kind (tuned only where its tensors live in host memory)."""
        return host.keep_host_memory(cls.kind, environ, cls.tensors_on_host)

    # -- before a device exists
    @classmethod
    def broken_stack(cls):
        """The one line where the kind's software is here but unusable (--device auto must not train elsewhere)."""

    @classmethod
    def runtime_binds_cores(cls, environ):
        """Who binds the ranks' cores instead of job/affinity.py (the kind's runtime, as ``environ`` asks), or None."""

    @classmethod
    def default_amp_impl(cls):
        """What ``--amp`` means without ``--amp-impl``."""
        return "native"

    @classmethod
    def default_workers(cls, procs_per_node, cpus=None):
        """Loader workers per process without ``-j``: on an accelerator its share of the node's cores less one for
        the process, 2 to 16 (on an H100 with 16 cores, 16 kept ResNet50 at 0.88-0.99 of its synthetic rate)."""
        share = (cpus or host.usable_cpus()) // max(1, procs_per_node)
        return max(2, min(16, share - 1))

    @classmethod
    def visible_devices_problem(cls):
        """A message if the visible-devices variable is one the runtime will mishandle, else None."""

    @classmethod
    def settings_problem(cls, section):
        """A setting of ``section`` (a LaunchConfig) the kind cannot honour (here: torch_npu's): its line, or None."""
        for flag, value in (("--jit-compile", section.jit_compile), ("--internal-format", section.internal_format)):
            if value != "auto":
                return "{} {} is a torch_npu setting: drop it on {}".format(flag, value, cls.kind.upper())

    def configure(self, section):
        """Apply ``section``'s device settings once the device is current; their values, for the log and summary."""
        if section.pin_memory != "auto":
            self.pin_memory = section.pin_memory == "on"
        return {"pin_memory": self.pin_memory}

    @classmethod
    def create(cls, requested="auto", index=None):
        """Resolve the kind, check the index and make the device current (once per process)."""
        kind_cls = Device.of(Device.resolve_kind(requested))
        index = 0 if index is None else int(index)
        dev = kind_cls(kind_cls.kind, index)
        if not dev.numbered:  # the host is always there beside the one accelerator of a process
            return dev
        n = kind_cls.count()
        if index >= n:
            raise UsageError("{} device {} does not exist: {} visible (indices 0-{}){}".format(
                kind_cls.kind, index, n, n - 1, kind_cls.visible_hint()))
        if _current["set"] is None:
            dev._make_current()  # the process's (and the calling thread's) current device
            _current["set"] = (dev.kind, dev.index)
        elif _current["set"] != (dev.kind, dev.index):
            raise RuntimeError("device already set to {} in this process; one device per process"
                               .format(_current["set"]))
        return dev

    def description(self):
        """The device and, where the runtime tells it, its model (e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)')."""
        try:
            model = self._model_name()
        except Exception:
            model = None
        return "{} ({})".format(self.name, model) if model else self.name

    def _model_name(self):
        """Each accelerator kind: the device's model."""

    def move(self, tensor):
        return tensor.to(self.torch_device, non_blocking=self.non_blocking)

    def upload(self, tensor):
        """A small host tensor (indices, sizes) on this device."""
        return tensor.to(self.torch_device)

    def synchronize(self):
        """Wait for the device's queued work (each accelerator kind)."""

    # -- mixed precision
    def resolve_amp_dtype(self, requested="auto"):
        """(dtype or None, note or None) for ``--amp --amp-dtype requested``: auto is the kind's choice; bfloat16 as
        ``_bfloat16_note`` says (a note where slow, UsageError where it cannot run); float16 unless float16_missing."""
        if requested == "auto":
            return self._auto_amp_dtype()
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[requested]
        if dtype == torch.bfloat16:
            return dtype, self._bfloat16_note()
        missing = self.float16_missing()
        if missing:
            raise UsageError("--amp-dtype float16 {}: use --amp-dtype bfloat16".format(missing))
        return dtype, None

    def float16_missing(self):
        """Why float16 autocast with a loss scaler cannot run on this device with this torch, or None."""

    def autocast(self, dtype):
        """Autocast context for ``dtype`` (None: none)."""
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.kind, dtype=dtype)

    def _reduced_float32_switches(self, hf32=False):
        """[(object, attribute)] letting float32 math take reduced-precision shortcuts (``hf32``: ALLOW_HF32's only)."""
        return []

    def set_float32_math(self, mode):
        """ModelZoo's ALLOW_HF32 (``reduced``: float32 convolutions may take HF32 on NPU, TF32 on CUDA) or ALLOW_FP32
        (``full``: every such switch off); the note for the log."""
        reduced = mode == "reduced"
        switches = self._reduced_float32_switches(hf32=reduced)
        for obj, name in switches:
            setattr(obj, name, reduced)
        flag = "ALLOW_HF32" if reduced else "ALLOW_FP32"
        if not switches:
            return "{}: {} has no reduced-precision float32 path to switch; float32 as always".format(
                flag, self.kind.upper())
        return "{}: {} switch(es) of {} set to {} ({})".format(flag, len(switches), self.kind.upper(), reduced, (
            "float32 convolutions may use its reduced-precision path" if reduced else "full float32 math"))

    @contextlib.contextmanager
    def strict_float32(self):
        """float32 math without the default reduced-precision shortcuts inside (TF32 on CUDA, HF32 on newer NPUs)."""
        saved = [(obj, name, getattr(obj, name)) for obj, name in self._reduced_float32_switches()]
        try:
            for obj, name, _ in saved:
                setattr(obj, name, False)
            yield
        finally:
            for obj, name, value in saved:
                setattr(obj, name, value)

    def grad_scaler(self, loss_scale=None):
        """A GradScaler for float16 autocast, skipping steps whose gradients hold inf/NaN. ``loss_scale`` None: dynamic
        from 2**16; a number: the start, which the caller sets back after every step. Always built dynamic: only that
        mode checks for inf/NaN (torch_npu's ``dynamic=False`` steps the optimizer even on an overflow)."""
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

    def compile(self, model, mode):
        """(``model`` in graph mode, the backend's name, a note or None): torch.compile's inductor in ``mode``
        (--compile-mode). Compiling happens on the first call; what fails there is trainer/graph.py's."""
        return shims.torch_compile(model, mode=mode), "inductor", None

    def compile_warning(self, dtype):
        """Why graph mode is expected to be slower than eager here with autocast ``dtype`` (None: float32), or None."""

    def native_fused_sgd(self, apex_amp_in_use=False):
        """(class, name) of this device's own fused SGD (a vendor's kernel), or None (the choice: trainer/optim)."""

    # -- JPEG decoding where the model runs (--data-backend gpu)
    def bind_thread(self):
        """Make this device current in another thread that issues ``data_work`` (a new thread starts on device 0)."""

    @contextlib.contextmanager
    def data_work(self):
        """``with device.data_work() as handoff:`` the data backend's device work; ``handoff(t)`` registers each
        result, ``handoff.receive()`` in the training thread makes them its own (here: the current stream)."""
        yield Handoff()

    def jpeg_decoder_missing(self):
        return "torchvision {} has no JPEG decode for {}".format(shims._torchvision_version(), self.kind)

    def jpeg_decoder(self):
        """``decode(uint8 1-D CPU tensors) -> uint8 CHW RGB tensors here`` (a bad image: RuntimeError), or None."""
        if self._jpeg is None:
            self._jpeg = False
            try:
                from torchvision import io as tio
            except Exception:
                return None
            self._jpeg = self._make_jpeg_decoder(tio, tio.ImageReadMode.RGB) or False
        return self._jpeg or None

    @property
    def ddp_device_ids(self):
        return [self.index] if self.numbered else None

    def ddp(self, model, broadcast_buffers=True):
        """DistributedDataParallel on this device (buffer sync flag named per torch version)."""
        DDP = torch.nn.parallel.DistributedDataParallel
        newer = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters  # deprecates broadcast_buffers
        flag = "forward_sync_buffers" if newer else "broadcast_buffers"
        return DDP(model, device_ids=self.ddp_device_ids, **{flag: broadcast_buffers})

    def manual_seed(self, seed):
        torch.manual_seed(seed)  # the CPU's generator (and CUDA's, which torch seeds with it)

    def deterministic(self):
        """--deterministic: torch's deterministic algorithms (warn_only) and the kind's own switches; a note of them."""
        torch.use_deterministic_algorithms(True, warn_only=True)
        return "torch.use_deterministic_algorithms(warn_only)"

    def rng_state(self):
        """The device's own generator state, or None where the CPU's is the only one."""

    def set_rng_state(self, state):
        pass

    def profiler_activities(self):
        """(profiler module, activities) for torch.profiler (or the kind's own profiler)."""
        return torch.profiler, [torch.profiler.ProfilerActivity.CPU]
