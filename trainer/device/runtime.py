"""The vendor runtimes, imported on first use: torch_npu (Ascend) and apex.amp (NVIDIA's or Ascend's)."""
import importlib.util
import inspect
import os

_npu = {"module": None, "error": None}


def npu_module():
    """``torch_npu`` if it imports, else None (the import error is kept for messages: ``npu_import_error``)."""
    if _npu["module"] is None and _npu["error"] is None:
        try:
            import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device)
            _npu["module"] = torch_npu
        except Exception as exc:  # ImportError, or a CANN library missing
            _npu["error"] = exc
    return _npu["module"]


def npu_import_error():
    """Why torch_npu did not import (after ``npu_module`` returned None), or None."""
    return _npu["error"]


# Where an Ascend host shows itself without torch_npu's help: the variables CANN's set_env.sh exports, and the
# default install root of the driver and CANN (``/etc/Ascend/ascend_cann_install.info`` names another root)
CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
ASCEND_ROOT = "/usr/local/Ascend"


def npu_installed():
    """Whether a ``torch_npu`` package is on the path (found, not imported)."""
    try:
        return importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):  # a broken package can fail its own lookup
        return True


def cann_present(environ=None, root=None):
    """What shows that Ascend's stack is on this host (a CANN variable, or the install root), or None."""
    environ = os.environ if environ is None else environ
    for name in CANN_VARIABLES:
        if environ.get(name):
            return "{}={}".format(name, environ[name])
    root = ASCEND_ROOT if root is None else root
    return root if os.path.isdir(root) else None


def import_gist(error):
    """The first line of an import error, without the traceback."""
    text = str(error).strip().splitlines()
    return "{}: {}".format(type(error).__name__, text[0]) if text else type(error).__name__


def torchair():
    """torch_npu's graph backend ``torchair`` (torch_npu >= 2.1: importable after torch_npu) if it loads, else None."""
    if npu_module() is None:
        return None
    try:
        import torchair as module
        return module if hasattr(module, "get_npu_backend") and hasattr(module, "CompilerConfig") else None
    except Exception:  # absent (torch_npu 1.11), or its native part failed to load
        return None


def apex_amp():
    """``apex.amp`` (NVIDIA's or Ascend's) if it imports, else None (PyPI's "apex", a web toolkit, has no amp)."""
    try:
        from apex import amp  # noqa: F401
    except Exception:
        return None
    return amp if hasattr(amp, "initialize") else None


def apex_supports(option):
    """Whether the installed apex.amp.initialize takes ``option`` (e.g. combine_ddp: Ascend apex only)."""
    amp = apex_amp()
    return amp is not None and option in inspect.signature(amp.initialize).parameters
