"""FAKE torch_npu for tests only: an Ascend host with N NPUs simulated on the CPU.

Not the real Ascend Extension for PyTorch. Names, signatures and behaviour follow the torch_npu
release built for the torch it is imported under: 2.14.0 on torch >= 2.3, 2.1.0.post17 on torch
2.1 and 2.2 (torch_npu/_release.py; docs/NPU_API.md). Tensors on npu:N hold their data in host memory
and every op runs on the CPU (the device double, torch_npu/_double.py); the device functions keep and
record state. N comes from $FAKE_NPU_DEVICE_COUNT (default 8).

Like the real package, importing it renames torch's PrivateUse1 backend to "npu" (so that
``torch.device("npu:3")`` parses), registers ``torch.npu`` (the same object as
``torch_npu.npu``) and the "hccl" process-group backend (here backed by Gloo on the CPU).
These changes last for the life of the process.

Every simulated call is appended to ``torch_npu.calls`` as a tuple ``(name, *args)``.
"""

import torch

from torch_npu import _release

FAKE = True  # lets tests (and only tests) tell the fake from the real package
__version__ = _release.RELEASE + "+fake"  # "2.14.0+fake" or "2.1.0.post17+fake"

calls = []  # ("set_device", "npu:3"), ("synchronize", None), ...


def _record(name, *args):
    from torch_npu._recorder import record

    record(calls, "torch_npu", name, *args)


def reset_calls():
    """Empty ``calls`` (test helper; not part of the real API)."""
    del calls[:]


def _register_backend():
    # Real: 2.14.0 torch_npu/_init/registry/backend.py:46-63 register_privateuse1_backend(); 2.1.0.post17
    # does the same three calls at the top level of torch_npu/__init__.py:178-183.
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    import torch_npu.npu as _npu_module

    if getattr(torch, "npu", None) is not _npu_module:
        torch._register_device_module("npu", _npu_module)
    if not hasattr(torch.Tensor, "is_npu"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=False)
    from torch_npu import _double

    _double.setup()  # tensors on npu:N (_double.py)


def _accelerator_answers_for_npu():
    # Real: torch_npu registers its device guard and streams in C++, so torch.accelerator (torch >= 2.6) answers
    # for "npu" as for CUDA; torch.compile's graph capture asks it for the current stream. The fake has no C++
    # part: the same answers from torch.npu, for the npu accelerator only.
    acc = getattr(torch, "accelerator", None)
    if acc is None or not hasattr(acc, "current_stream") or getattr(acc, "_fake_npu", False):
        return
    real_stream, real_index = acc.current_stream, acc.current_device_index

    def on_npu():
        current = torch._C._accelerator_getAccelerator()
        return current is not None and current.type == "npu"

    def current_device_index():
        return torch.npu.current_device() if on_npu() else real_index()

    def current_stream(device=None):
        return torch.npu.current_stream(device) if on_npu() else real_stream(device)

    acc.current_device_index, acc.current_stream, acc._fake_npu = current_device_index, current_stream, True
    if hasattr(acc, "current_device_idx"):
        acc.current_device_idx = current_device_index


_register_backend()
_accelerator_answers_for_npu()

import torch_npu.npu  # noqa: E402,F401
import torch_npu.npu.amp  # noqa: E402,F401
import torch_npu.optim  # noqa: E402,F401
import torch_npu.profiler  # noqa: E402,F401
import torch_npu.contrib  # noqa: E402,F401
import torch_npu.distributed  # noqa: E402,F401
import torch_npu.dynamo  # noqa: E402,F401  (``import torchair``, as the real package)

torch_npu.distributed._register_hccl()


def _legacy_profiler():
    """``FAKE_NPU_LEGACY_PROFILER=1``: the 1.11 stack's profiling, for tests of the fallback. torch_npu 1.11 has no
    ``torch_npu.profiler``; its torch fork's ``torch.autograd.profiler.profile`` takes ``use_npu=True`` (the porting
    guide's call). Here the flag is recorded and the CPU profiler records the ops."""
    import sys as _sys
    real = torch.autograd.profiler.profile

    class profile(real):
        def __init__(self, *args, use_npu=False, **kwargs):
            _record("autograd.profiler.profile", {"use_npu": use_npu})
            super().__init__(*args, **kwargs)

    torch.autograd.profiler.profile = profile
    _sys.modules.pop("torch_npu.profiler", None)
    globals().pop("profiler", None)


if __import__("os").environ.get("FAKE_NPU_LEGACY_PROFILER") == "1":
    _legacy_profiler()


def _autoload():
    # Real (2.7.1 torch_npu/__init__.py, entry_points.txt "[torch.backends] torch_npu = torch_npu:_autoload"): what
    # torch >= 2.5 calls as it is imported, once the package's import has done the work. Here recorded, so that a test
    # sees that an installed torch_npu was loaded with torch (the double has no entry point of its own: a test
    # installs one).
    _record("autoload")
