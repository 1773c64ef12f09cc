"""Guards for torch and torchvision APIs newer than torch 1.11 (the Ascend stack), each with its fallback, and
the versions a run records."""
import contextlib
import glob
import importlib
import inspect
import io
import logging
import os
import pickle
import platform
import re
import sys
import types
import warnings

import torch

from trainer.device.runtime import apex_amp


def _has_amp_grad_scaler():
    return hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")  # torch >= 2.3


def has_torch_compile():
    return hasattr(torch, "compile")  # torch >= 2.0


# torch's loggers that warn on stderr while compiling ("No CUDA runtime is found, using CUDA_HOME=...", "Profiler record
# function ... will be ignored" from DDP's forward, graph breaks): a run's stderr is one line, for an error (RUNNING.md)
_COMPILE_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension")


def torch_compile(model, **kwargs):
    """torch.compile (torch >= 2.0: callers check ``has_torch_compile``); its loggers at errors unless TORCH_LOGS."""
    if not os.environ.get("TORCH_LOGS"):
        for name in _COMPILE_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        if "torch.utils.cpp_extension" not in sys.modules:  # torch 2.1 prints its CUDA_HOME line when imported
            with contextlib.redirect_stderr(io.StringIO()):
                importlib.import_module("torch.utils.cpp_extension")
    return torch.compile(model, **kwargs)


def ema_multi_avg_fn(decay):
    """torch's EMA update ``fn(ema, model, n_averaged)`` of tensor lists: ``swa_utils.get_ema_multi_avg_fn`` (torch >=
    2.1: one foreach lerp), else the same update tensor by tensor (ema += (1 - decay) x (model - ema))."""
    from torch.optim import swa_utils
    make = getattr(swa_utils, "get_ema_multi_avg_fn", None)
    if make is not None:
        return make(decay)

    @torch.no_grad()
    def ema_update(ema_params, model_params, _):
        for ema, current in zip(ema_params, model_params):
            if ema.is_floating_point():
                ema.lerp_(current, 1.0 - decay)
            else:
                ema.copy_(ema * decay + current * (1.0 - decay))
    return ema_update


def averaged_model(model, multi_avg_fn):
    """torch's ``AveragedModel`` of ``model`` (buffers averaged too, ``n_averaged`` on the host) with ``multi_avg_fn``
    where this torch takes one (>= 2.1), else the same function as its per-tensor ``avg_fn``."""
    from torch.optim.swa_utils import AveragedModel
    params = inspect.signature(AveragedModel).parameters
    kwargs = {"use_buffers": True} if "use_buffers" in params else {}
    if "multi_avg_fn" in params:
        return AveragedModel(model, multi_avg_fn=multi_avg_fn, **kwargs)

    def avg_fn(ema, current, n_averaged):
        ema = ema.clone()
        multi_avg_fn([ema], [current], n_averaged)
        return ema
    return AveragedModel(model, avg_fn=avg_fn, **kwargs)


_OUT_OF_MEMORY = ("out of memory",  # CUDA ("CUDA out of memory"), torch_npu ("NPU out of memory")
                  "can't allocate memory")  # the CPU allocator ("DefaultCPUAllocator: can't allocate memory")


def out_of_memory(exc):
    """Whether ``exc`` is an allocation that failed on the device or the host: MemoryError, torch.cuda.OutOfMemoryError
    (torch >= 1.13), a RuntimeError with the allocator's words (older torch, torch_npu, the CPU)."""
    cuda_oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    return isinstance(exc, (MemoryError, cuda_oom)) or (
        isinstance(exc, RuntimeError) and any(t in str(exc) for t in _OUT_OF_MEMORY))


def without_storage():
    """A context building modules on the meta device (shapes, no memory; torch >= 2.0); older torch: on the CPU."""
    meta = torch.device("meta")
    return meta if hasattr(meta, "__enter__") else contextlib.nullcontext()


def torch_load(path, map_location="cpu", weights_only=True):
    """torch.load with ``weights_only`` where this torch has it (>= 1.13); torch 2.0-2.2's "TypedStorage is
    deprecated" warning on every file (its own use, nothing of the caller's) is silenced: a run's stderr is one line."""
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
    """The weights-only loader refused a file's Python objects (unpickling may run code); ``what``: the first class."""
    what = property(lambda self: self.args[0])


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 pointed at /dev/null inside (C libraries' own warnings)."""
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
        try:
            if major_minor(torch.__version__) < (2, 1):  # 2.0 takes uint8 too, without the vectorised kernel
                raise NotImplementedError
            x = torch.zeros((1, 3, 4, 4), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
            ok = torch.nn.functional.interpolate(x, size=(2, 2), mode="bilinear", antialias=True,
                                                 align_corners=False).dtype == torch.uint8
        except (TypeError, RuntimeError, NotImplementedError):
            ok = False
        _UINT8_RESIZE.append(ok)
    return _UINT8_RESIZE[0]


def autograd_profiler(**device_flag):
    """A profiler module whose ``profile`` is ``torch.autograd.profiler.profile(**device_flag)`` (torch_npu 1.11's
    ``use_npu=True``) with torch.profiler's ``start``/``stop``; its ``key_averages`` and ``export_chrome_trace`` are
    on the class, where trainer/record/profiling.py looks for the op table."""
    class profile(torch.autograd.profiler.profile):  # looked up now: torch_npu 1.11's torch fork takes use_npu
        def __init__(self, activities=None, record_shapes=False, **_):
            super().__init__(record_shapes=record_shapes, **device_flag)

        def start(self):
            self.__enter__()

        def stop(self):
            self.__exit__(None, None, None)
    return types.SimpleNamespace(profile=profile)


def major_minor(version):
    """``"2.1.0.post17+cpu"`` -> (2, 1)."""
    return tuple(int(p) for p in re.findall(r"\d+", str(version))[:2])


def _torchvision_version():
    try:
        import torchvision
        return tuple(int(p) for p in torchvision.__version__.split("+")[0].split(".")[:2])
    except Exception:
        return (0, 0)


def _dist_info_version(dist, paths=None):
    """A package's version from the METADATA of its ``dist``-*.dist-info on sys.path (Python 3.7 has no
    importlib.metadata), None where there is none."""
    for folder in sys.path if paths is None else paths:
        for info in sorted(glob.glob(os.path.join(folder or ".", "{}-*.dist-info".format(dist)))):
            try:
                with open(os.path.join(info, "METADATA"), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                continue
    return None


def _installed_version(dist, module):
    """A package's version from its metadata (importing torchvision takes seconds), else its module's, else None."""
    try:
        from importlib import metadata  # novermin (3.8; Python 3.7 reads the dist-info itself)
        return metadata.version(dist)
    except ImportError:
        found = _dist_info_version(dist)
        if found is not None:
            return found
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
    out["apex"] = getattr(sys.modules["apex"], "__version__", "present") if apex_amp() is not None else None
    return out
