"""The NPU runtime settings ModelZoo's maintained entries make, each with its default, its flag and its value
recorded (``NpuDevice.configure``; docs/RUNNING.md "NPU"):

  --jit-compile      ``torch_npu.npu.set_compile_mode(jit_compile=...)``. auto: binary (precompiled) kernels,
                     ``jit_compile=False``, on Atlas A2/A3 (Ascend910B*, Ascend910_93*: torch_npu's own default
                     there, and the maintained ShuffleNetV2 entry's call); elsewhere (the 910A training series,
                     whose binary kernel packages are not the default) torch_npu's own choice, only read back
                     (``is_jit_compile_false``).
  --internal-format  ``torch.npu.config.allow_internal_format``. auto: False on A2/A3 (the maintained ShuffleNetV2
                     entry; torch_npu 2.8 makes it the A2 default), True elsewhere (torch_npu's default before 2.8
                     and ResNet50_ID4149's setting). torch_npu has no getter: the value is set either way.
  --pin-memory       the loaders' pinned host memory for the device. auto: on where torch is 2.x (torch_npu's
                     pinned-memory allocator; ``pin_memory_device="npu"`` on torch < 2.8, whose DataLoader pins
                     for CUDA otherwise; torch >= 2.8 pins for the current accelerator and deprecates the
                     argument); off on torch 1.x (the 1.11 porting guide: ``pin_memory=False``; its DataLoader
                     has no ``pin_memory_device``).

Every name used is in torch_npu 2.1.0.post17, 2.7.1.post2 and 2.14.0 (``torch_npu/npu/npu_config.py``,
``torch_npu/npu/__init__.py``: ``config = npu_config._npuConfig()``); a torch_npu without one (1.11 builds) gets
None for that setting and a flag asking for it is refused.
"""
import torch

from trainer.device.shims import major_minor

A2_A3 = ("Ascend910B", "Ascend910_93")  # get_device_name() of Atlas A2 (910B1..4) and A3 (910_93xx)


def _torch_major_minor():
    return major_minor(torch.__version__)


def a2_a3(device_name):
    return str(device_name).startswith(A2_A3)


def _on(value):
    return {"on": True, "off": False}.get(value)


def pin_memory_device_arg():
    """Whether torch's DataLoader needs ``pin_memory_device`` to pin for a PrivateUse1 device (torch < 2.8)."""
    return _torch_major_minor() < (2, 8)


def check(section, npu):
    """A flag that asks for what this torch / torch_npu cannot do: its one line, else None."""
    if section.pin_memory == "on" and _torch_major_minor() < (2, 0):
        return ("--pin-memory on: torch {}'s DataLoader cannot pin memory for an NPU (no pin_memory_device); "
                "drop it (the 1.11 guide trains with pin_memory=False)".format(torch.__version__))
    npu_cfg = getattr(npu, "npu", None) if npu is not None else None
    if section.jit_compile != "auto" and not hasattr(npu_cfg, "set_compile_mode"):
        return "--jit-compile {}: this torch_npu has no set_compile_mode; drop it".format(section.jit_compile)
    if section.internal_format != "auto" and getattr(npu_cfg, "config", None) is None:
        return "--internal-format {}: this torch_npu has no npu.config; drop it".format(section.internal_format)
    return None


def apply(npu, device_name, section):
    """Apply the settings after ``set_device``; returns their values and where each came from."""
    chip = a2_a3(device_name)
    out = {"chip": device_name}
    jit = _on(section.jit_compile)
    if jit is None and chip:
        jit = False
    if jit is not None and hasattr(npu.npu, "set_compile_mode"):
        npu.npu.set_compile_mode(jit_compile=jit)
        out["jit_compile"] = jit
        out["jit_compile_from"] = "--jit-compile" if section.jit_compile != "auto" else "auto (Atlas A2/A3)"
    else:
        read = getattr(npu.npu, "is_jit_compile_false", None)
        out["jit_compile"] = (not read()) if read is not None else None
        out["jit_compile_from"] = "torch_npu's default" if read is not None else "not supported"
    fmt = _on(section.internal_format)
    fmt_from = "--internal-format" if fmt is not None else "auto ({})".format("Atlas A2/A3" if chip else "not A2/A3")
    if fmt is None:
        fmt = not chip
    config = getattr(npu.npu, "config", None)
    if config is not None:
        config.allow_internal_format = fmt
        out["internal_format"], out["internal_format_from"] = fmt, fmt_from
    else:
        out["internal_format"], out["internal_format_from"] = None, "not supported"
    pin = _on(section.pin_memory)
    out["pin_memory_from"] = "--pin-memory" if pin is not None else "auto"
    out["pin_memory"] = pin if pin is not None else _torch_major_minor() >= (2, 0)
    return out
