"""The NPU runtime settings ModelZoo's maintained entries make (``NpuDevice.configure``), each with its default, its
flag and its value recorded; defaults and reasons: docs/RUNNING.md "NPU". --jit-compile: ``set_compile_mode`` (auto
elsewhere than A2/A3: torch_npu's choice, read back with ``is_jit_compile_false``); --internal-format:
``torch.npu.config.allow_internal_format`` (no getter: set either way); --pin-memory: ``pin_memory_device="npu"``
on torch < 2.8, whose DataLoader pins for CUDA otherwise (2.8 pins for the current accelerator, deprecating it).

Every name used is in torch_npu 2.1.0.post17, 2.7.1.post2 and 2.14.0 (``torch_npu/npu/npu_config.py``,
``torch_npu/npu/__init__.py``); a torch_npu without one (1.11 builds) gets None for that setting and a flag asking
for it is refused."""
import torch

from trainer.device.shims import major_minor

A2_A3 = ("Ascend910B", "Ascend910_93")  # get_device_name() of Atlas A2 (910B1..4) and A3 (910_93xx)


def _on(value):
    return {"on": True, "off": False}.get(value)


def check(section, npu):
    """A flag that asks for what this torch / torch_npu cannot do: its one line, else None."""
    if section.pin_memory == "on" and major_minor(torch.__version__) < (2, 0):
        return ("--pin-memory on: torch {}'s DataLoader cannot pin memory for an NPU (no pin_memory_device); "
                "drop it (the 1.11 guide trains with pin_memory=False)".format(torch.__version__))
    npu_cfg = getattr(npu, "npu", None)
    if section.jit_compile != "auto" and not hasattr(npu_cfg, "set_compile_mode"):
        return "--jit-compile {}: this torch_npu has no set_compile_mode; drop it".format(section.jit_compile)
    if section.internal_format != "auto" and getattr(npu_cfg, "config", None) is None:
        return "--internal-format {}: this torch_npu has no npu.config; drop it".format(section.internal_format)
    return None


def apply(npu, device_name, section):
    """Apply the settings after ``set_device``; returns their values and where each came from."""
    chip = str(device_name).startswith(A2_A3)
    out = {"chip": device_name}
    jit = False if section.jit_compile == "auto" and chip else _on(section.jit_compile)
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
    fmt = (not chip) if fmt is None else fmt
    config = getattr(npu.npu, "config", None)
    if config is not None:
        config.allow_internal_format = fmt
        out["internal_format"], out["internal_format_from"] = fmt, fmt_from
    else:
        out["internal_format"], out["internal_format_from"] = None, "not supported"
    pin = _on(section.pin_memory)
    out["pin_memory_from"] = "--pin-memory" if pin is not None else "auto"
    out["pin_memory"] = pin if pin is not None else major_minor(torch.__version__) >= (2, 0)
    return out
