"""Ascend NPUs through torch_npu: hccl from env:// only, int32 targets and indices, no pinned memory, torch_npu's
autocast, GradScaler, fused SGD and profiler, DVPP decode through torchvision_npu, the guides' apex defaults."""
import inspect
import os
import warnings

import torch

from trainer.device.base import Device
from trainer.device import npu_settings, runtime, shims
from trainer.device.runtime import npu_import_error, npu_module
from trainer.errors import UsageError


class NpuDevice(Device):
    kind = "npu"
    auto_rank = 0  # --device auto takes an NPU first
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    rendezvous_schemes = ("env://",)  # the Ascend guide: the process group from environment variables only
    supported_devices_per_node = (1, 2, 4, 8)  # the Ascend guide's collectives
    dist_backend = collective_library = "hccl"
    guides_train_with_amp = True
    default_apex_loss_scale = 1024.0  # the Ascend guide's parser default (static)
    pin_memory = False  # until ``configure``: on with torch 2.x, off on 1.11 as its guide (npu_settings.py)
    target_dtype = index_dtype = torch.int32  # int64 targets and indices fall back to slow AI-CPU kernels on Ascend
    # no decode-ahead thread: DVPP beside a training thread has not been tried

    @classmethod
    def count(cls):
        try:
            npu = npu_module().npu
            return int(npu.device_count()) if npu.is_available() else 0
        except Exception:  # no torch_npu (None has no .npu), or its runtime failed
            return 0

    @classmethod
    def broken_stack(cls):
        """torch_npu installed but failing to import (CANN's environment not sourced: the guides' "libhccl.so"
        FAQ), or CANN on the host without torch_npu: an Ascend host that would otherwise train on the CPU."""
        if npu_module() is not None:
            return None
        if runtime.npu_installed():
            return ("torch_npu is installed but does not import ({}): source CANN's environment first "
                    "(`source env_npu.sh`, docs/TROUBLESHOOTING.md), or pass --device cpu to train on the CPU on "
                    "purpose".format(runtime.import_gist(npu_import_error())))
        where = runtime.cann_present()
        if where:
            return ("this host has Ascend's stack ({}) but no torch_npu: install the torch-npu release of this "
                    "torch (docs/RUNNING.md, NPU), or pass --device cpu to train on the CPU on purpose".format(where))

    @classmethod
    def missing(cls):
        broken = cls.broken_stack()
        if broken and runtime.npu_installed():
            return "--device npu: " + broken
        if npu_module() is None:
            error = npu_import_error()
            return ("--device npu: torch_npu is not installed or does not import ({}); install the "
                    "Ascend stack (see 1.11_requirements.txt) or pick --device cuda/cpu"
                    .format(str(error).splitlines()[0] if error else "not found"))
        return ("--device npu: torch_npu sees no NPU (check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES), or pick "
                "--device cuda/cpu")

    @classmethod
    def _before_2_1(cls):
        """torch_npu imports and is a 1.11 build (older than 2.1)."""
        npu = npu_module()
        return npu is not None and shims.major_minor(getattr(npu, "__version__", "0")) < (2, 1)

    @classmethod
    def default_amp_impl(cls):
        """Native autocast + GradScaler, which Ascend's AMP guide recommends; Ascend apex.amp where installed on
        torch_npu 1.11, whose porting guide trains with it (docs/PRECISION.md, "NPU: native or apex")."""
        return "apex" if cls._before_2_1() and runtime.apex_amp() is not None else "native"

    @classmethod
    def visible_devices_problem(cls):
        """The Ascend runtime maps ASCEND_RT_VISIBLE_DEVICES only when it lists devices in ascending order."""
        value = os.environ.get(cls.visible_devices_env, "")
        listed = [s.strip() for s in value.split(",") if s.strip()]
        if any(not s.isdigit() for s in listed) or [int(s) for s in listed] != sorted(int(s) for s in listed):
            return ("{}={} must list devices in ascending order (the Ascend runtime fails to map them "
                    "otherwise)".format(cls.visible_devices_env, value))

    def _make_current(self):
        npu_module().npu.set_device(self.name)

    bind_thread = _make_current

    @classmethod
    def settings_problem(cls, section):
        return npu_settings.check(section, npu_module())

    @classmethod
    def runtime_binds_cores(cls, environ):
        """torch_npu binds its ranks by itself where ``CPU_AFFINITY_CONF`` asks (mode 1 or 2; every PyPI torch_npu,
        2.1.0.post17 to 2.14.0, reads it in libtorch_npu.so; 1.11 builds do not)."""
        conf = environ.get("CPU_AFFINITY_CONF", "").strip()
        if npu_module() is None or not conf or conf.split(",")[0].strip() in ("0", "mode:0") or cls._before_2_1():
            return None
        return "torch_npu (CPU_AFFINITY_CONF={})".format(conf)

    def configure(self, section):
        """The runtime settings of today's ModelZoo entries (npu_settings.py), after set_device."""
        out = npu_settings.apply(npu_module(), self._model_name(), section)
        self.pin_memory = out["pin_memory"]
        if self.pin_memory and shims.major_minor(torch.__version__) < (2, 8):  # torch's DataLoader: npu_settings.py
            self.pin_memory_device = self.kind
        return out

    def _model_name(self):
        return npu_module().npu.get_device_name(self.index)

    def synchronize(self):
        npu_module().npu.synchronize()

    def _auto_amp_dtype(self):
        return torch.float16, None  # the guides' choice, with a loss scaler

    def _bfloat16_note(self):
        bf16 = getattr(npu_module().npu, "is_bf16_supported", None)
        if bf16 is None or not bf16():
            raise UsageError("--amp-dtype bfloat16: this NPU (or torch_npu) has no bfloat16; use --amp-dtype float16")

    def autocast(self, dtype):
        if dtype is None:
            return Device.autocast(self, None)
        return npu_module().npu.amp.autocast(dtype=dtype)

    def _reduced_float32_switches(self, hf32=False):
        npu = npu_module().npu
        names = ("conv",) if hf32 else ("conv", "matmul")  # ModelZoo's ALLOW_HF32 sets torch.npu.conv's only
        return [(getattr(npu, n), "allow_hf32") for n in names if hasattr(getattr(npu, n, None), "allow_hf32")]

    def grad_scaler(self, loss_scale=None):
        """torch_npu's GradScaler, built dynamic (see ``Device.grad_scaler``)."""
        amp = npu_module().npu.amp
        dynamic = {"dynamic": True} if "dynamic" in inspect.signature(amp.GradScaler).parameters else {}
        return amp.GradScaler(init_scale=65536.0 if loss_scale is None else float(loss_scale), **dynamic)

    def native_fused_sgd(self, apex_amp_in_use=False):
        """torch_npu's NpuFusedSGD (with apex.amp: Ascend apex's, where it has one): one flat gradient buffer, kept."""
        opt_cls = getattr(getattr(npu_module(), "optim", None), "NpuFusedSGD", None)
        name = "torch_npu.optim.NpuFusedSGD"
        if apex_amp_in_use:
            try:
                from apex.optimizers import NpuFusedSGD as apex_fused
                opt_cls, name = apex_fused, "apex.optimizers.NpuFusedSGD"
            except Exception:
                pass
        return (opt_cls, name) if opt_cls is not None else None

    def compile(self, model, mode):
        """torch.compile with torchair, torch_npu's graph engine, and static shapes (the loaders drop the last partial
        batch), as Ascend's TorchAir guide compiles training; without torchair (before 2.1): eager, with a note."""
        tng = runtime.torchair()
        if tng is None:
            return model, None, ("--compile: this torch_npu has no torchair (its graph backend, in torch_npu >= 2.1): "
                                 "training eagerly")
        backend = tng.get_npu_backend(compiler_config=tng.CompilerConfig())
        note = None if mode == "default" else (
            "--compile-mode {} is torch's inductor's; on NPU torchair compiles the training step with its "
            "graph engine (its own reduce-overhead mode is for inference)".format(mode))
        return shims.torch_compile(model, backend=backend, dynamic=False), "torchair", note

    def jpeg_decoder_missing(self):
        return "the device backend on NPU needs torchvision_npu (Ascend's DVPP decode for torchvision)"

    def _make_jpeg_decoder(self, tio, rgb):
        """The same call as CUDA's after ``import torchvision_npu``, which routes NPU devices to DVPP."""
        try:
            import torchvision_npu  # noqa: F401  (patches torchvision.io.decode_jpeg for NPU tensors)
        except Exception:
            return None
        init = getattr(getattr(torch.ops, "torchvision", None), "_dvpp_init", None)
        if init is not None:
            init()
        dev = self.torch_device
        return lambda raws: [tio.decode_jpeg(r, mode=rgb, device=dev) for r in raws]

    def manual_seed(self, seed):
        torch.manual_seed(seed)
        npu_module().npu.manual_seed_all(seed)

    def deterministic(self):
        """torch's switch and HCCL_DETERMINISTIC, and where torch_npu has them (TorchNPU 26.x: torch_npu 2.14) its
        kernels computed as PyTorch computes them (gelu, matmul, max_pool: use_compatible_impl) and its deterministic
        level 1 (0 off, 2 also independent of a value's position); a torch_npu without them says so."""
        os.environ["HCCL_DETERMINISTIC"] = "True"  # HCCL's reductions in a fixed order (read by later groups)
        done, npu = [Device.deterministic(self), "HCCL_DETERMINISTIC"], npu_module().npu
        if hasattr(npu, "use_compatible_impl"):
            npu.use_compatible_impl(True)
            done.append("TORCH_NPU_USE_COMPATIBLE_IMPL")
        if hasattr(npu, "set_deterministic_level"):
            with warnings.catch_warnings():  # its advice not to call torch.use_deterministic_algorithms after it
                warnings.simplefilter("ignore")
                npu.set_deterministic_level(1)
            done.append("deterministic level 1")
        if len(done) == 2:
            done.append("torch_npu {} has neither use_compatible_impl nor set_deterministic_level (torch_npu 2.14): "
                        "its kernels keep their own implementations".format(getattr(npu_module(), "__version__", "?")))
        return ", ".join(done)

    def rng_state(self):
        return npu_module().npu.get_rng_state()

    def set_rng_state(self, state):
        if state is not None:
            npu_module().npu.set_rng_state(state.cpu())

    def profiler_activities(self):
        """torch_npu's profiler; without one (early 1.11 builds) the guide's autograd profiler with ``use_npu=True``."""
        prof = getattr(npu_module(), "profiler", None)
        if prof is None:
            return shims.autograd_profiler(use_npu=True), ["cpu", self.kind]
        return prof, [prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU]
