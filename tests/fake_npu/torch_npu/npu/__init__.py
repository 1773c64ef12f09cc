"""FAKE torch_npu.npu (== torch.npu after ``import torch_npu``). Test-only.

Same names and signatures as torch_npu/npu/{__init__,utils,random,memory,autocast_utils}.py of
the release followed (torch_npu/_release.py) for the functions the trainer may use; the two releases
differ here in ``is_bf16_supported`` and ``get_amp_supported_dtype`` only. Device state is kept per
process.
"""

import os
import types

import torch

import torch_npu
from torch_npu import _release

__all__ = [
    "is_available", "device_count", "set_device", "current_device", "synchronize", "device",
    "is_initialized", "init", "get_device_name", "get_device_properties",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated", "empty_cache",
    "is_bf16_supported", "get_amp_supported_dtype", "current_stream", "default_stream",
    "set_compile_mode", "is_jit_compile_false", "config",
]

_current = None  # device index chosen by set_device (None: never set -> device 0)
_initialized = False
_generators = {}


def _rec(name, *args):
    torch_npu._record(name, *args)


def _physical_count():
    raw = os.environ.get("FAKE_NPU_DEVICE_COUNT", "8")
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def _visible():
    """Device ids this process may use: ASCEND_RT_VISIBLE_DEVICES filters, as on a real host."""
    ids = list(range(_physical_count()))
    env = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if env is None:
        return ids
    out = []
    for tok in env.split(","):
        tok = tok.strip()
        if not tok.isdigit() or int(tok) not in ids:
            break  # the runtime stops at the first invalid entry
        out.append(int(tok))
    return out


def _get_device_index(device, optional=False, allow_cpu=False):
    # Mirrors torch_npu/npu/utils.py _get_device_index: int | "npu:N" | torch.device | None.
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if allow_cpu:
            if device.type not in ("npu", "cpu"):
                raise ValueError("Expected a npu or cpu device, but got: {}".format(device))
            if device.type == "cpu":
                return -1
        elif device.type != "npu":
            raise ValueError("Expected a npu device, but got: {}".format(device))
        if device.index is not None:
            return device.index
    if device is None or isinstance(device, torch.device):
        if optional:
            return current_device()
        raise ValueError("Expected a torch.device with a specified index or an integer, "
                         "but got: {}".format(device))
    raise ValueError("Expected a npu device, but got: {!r}".format(device))


def _check_index(idx):
    n = device_count()
    if idx >= n:
        raise RuntimeError("fake torch_npu: invalid device ordinal {} (device_count() == {})".format(idx, n))


# ---- device management -------------------------------------------------------------------

def is_available():
    return device_count() > 0


def device_count():
    return len(_visible())


def is_initialized():
    return _initialized


def init():
    global _initialized
    if not is_available():
        raise RuntimeError("fake torch_npu: no NPU device (FAKE_NPU_DEVICE_COUNT=0)")
    _initialized = True


def set_device(device):
    """Record the argument as given; accepts int, "npu:N" or torch.device("npu", N)."""
    global _current, _initialized
    _rec("set_device", device)
    idx = _get_device_index(device, optional=True)
    if idx >= 0:
        _check_index(idx)
        _current = idx
        _initialized = True
        torch_npu._double.set_current(idx)


def current_device():
    return 0 if _current is None else _current


def synchronize(device=None):
    _rec("synchronize", device)


class device(object):
    """Context manager that switches the current device (torch_npu.npu.device)."""

    def __init__(self, device):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        global _current
        if self.idx < 0:
            return
        self.prev_idx = current_device()
        _check_index(self.idx)
        _current = self.idx
        torch_npu._double.set_current(self.idx)

    def __exit__(self, *args):
        global _current
        if self.prev_idx >= 0:
            _current = self.prev_idx
            torch_npu._double.set_current(self.prev_idx)
        return False


def get_device_name(device_name=None):
    """``FAKE_NPU_DEVICE_NAME`` (default an Atlas A2, "Ascend910B1"), as the real call names the chip."""
    return os.environ.get("FAKE_NPU_DEVICE_NAME", "Ascend910B1")


# npu/npu_config.py (the same code in 2.1.0.post17, 2.7.1.post2 and 2.14.0): options set through
# torch_npu._C._npu_setOption, kept here per process. jitCompile's default follows the chip, as the runtime's.
_options = {}


def set_compile_mode(jit_compile=False):
    _rec("set_compile_mode", jit_compile)
    _options["jitCompile"] = "enable" if jit_compile else "disable"


def is_jit_compile_false():
    default = "disable" if get_device_name().startswith(("Ascend910B", "Ascend910_93")) else "enable"
    return _options.get("jitCompile", default) == "disable"


class _npuConfig:
    """``torch.npu.config``: a setter only (the real class has no ``__getattr__`` for this option)."""

    @classmethod
    def __setattr__(cls, name, value):
        if name == "allow_internal_format":
            _rec("allow_internal_format", value)
            _options["ALLOW_INTERNAL_FORMAT"] = "enable" if value else "disable"


config = _npuConfig()


def get_device_properties(device_name=None):
    return types.SimpleNamespace(name=get_device_name(device_name), total_memory=64 * 1024 ** 3,
                                 cube_core_num=24, vector_core_num=48)


class _FakeStream(object):
    def __init__(self, device=None):
        self.device = device

    def synchronize(self):
        _rec("Stream.synchronize", self.device)

    def wait_stream(self, stream):
        pass


def current_stream(device=None):
    return _FakeStream(torch.device("npu", current_device()) if device is None else device)


def default_stream(device=None):
    return _FakeStream(device)


# ---- random --------------------------------------------------------------------------------

def _gen(idx):
    if idx not in _generators:
        _generators[idx] = torch.Generator()
    return _generators[idx]


def _idx_of(device):
    return _get_device_index(device, optional=True)


def _is_in_bad_fork():
    """False: the fake's device state survives a fork. torch.manual_seed and torch.seed seed the device through this
    and ``manual_seed_all`` (torch.random._seed_custom_device; without them torch warns "Set seed for `npu` device
    does not take effect"); the real package's npu/__init__.py has it as
    ``getattr(torch_npu._C, "_npu_isInBadFork", lambda: False)``."""
    return False


def manual_seed(seed):
    seed = int(seed)
    _rec("manual_seed", seed)
    _gen(current_device()).manual_seed(seed)


def manual_seed_all(seed):
    seed = int(seed)
    _rec("manual_seed_all", seed)
    for i in range(device_count()):
        _gen(i).manual_seed(seed)


def seed():
    _gen(current_device()).seed()


def seed_all():
    s = _gen(current_device()).seed()
    for i in range(device_count()):
        _gen(i).manual_seed(s)


def initial_seed():
    return _gen(current_device()).initial_seed()


def get_rng_state(device="npu"):
    return _gen(_idx_of(device)).get_state()


def set_rng_state(new_state, device="npu"):
    _gen(_idx_of(device)).set_state(new_state.clone())


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states):
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---- memory (nothing is allocated on a fake device) ----------------------------------------

def memory_stats(device=None):
    return {}


def memory_allocated(device=None):
    return 0


def max_memory_allocated(device=None):
    return 0


def memory_reserved(device=None):
    return 0


def max_memory_reserved(device=None):
    return 0


def reset_peak_memory_stats(device=None):
    _rec("reset_peak_memory_stats", device)


def reset_max_memory_allocated(device=None):
    _rec("reset_max_memory_allocated", device)


def empty_cache():
    _rec("empty_cache")


# ---- autocast helpers (torch_npu/npu/autocast_utils.py) -------------------------------------

if _release.V2_1:
    def is_bf16_supported():  # 2.1.0.post17 npu/utils.py:492
        return True
else:
    def is_bf16_supported(including_emulation=False):  # 2.14.0 npu/utils.py:407
        return True


def get_amp_supported_dtype():
    """float16 and bfloat16 (2.1.0.post17 npu/autocast_utils.py:8-11); 2.14.0 adds float32 (same lines)."""
    dtypes = [torch.float16, torch.bfloat16]
    return dtypes if _release.V2_1 else dtypes + [torch.float32]


# The device's autocast state, which torch 2.1's torch.autocast("npu") reads and sets through the device module
# (torch >= 2.3 keeps it for every device itself): the device double's (torch_npu/_double.py).
def is_autocast_enabled():
    return bool(torch_npu._double.native().autocast_enabled()) if _release.V2_1 else torch.is_autocast_enabled("npu")


def set_autocast_enabled(enable):
    if _release.V2_1:
        torch_npu._double.native().set_autocast_enabled(bool(enable))
    else:
        torch.set_autocast_enabled("npu", enable)


def get_autocast_dtype():
    return torch_npu._double.native().autocast_dtype().dtype if _release.V2_1 else torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype):
    if _release.V2_1:
        torch_npu._double.native().set_autocast_dtype(torch.empty(0, dtype=dtype))
    else:
        torch.set_autocast_dtype("npu", dtype)


# ---- kernels computed as PyTorch computes them, and the deterministic level (2.14.0 npu/__init__.py:668-726) --------
# 2.1.0.post17 (and 2.7.1) have neither. The double's kernels are the CPU's: the switches are kept and recorded.

if not _release.V2_1:
    _options = {"TORCH_NPU_USE_COMPATIBLE_IMPL": os.environ.get("TORCH_NPU_USE_COMPATIBLE_IMPL", "0")}
    _deterministic_level = [0]

    def use_compatible_impl(is_enable):
        _rec("use_compatible_impl", bool(is_enable))
        _options["TORCH_NPU_USE_COMPATIBLE_IMPL"] = "1" if is_enable else "0"

    def are_compatible_impl_enabled():
        return _options["TORCH_NPU_USE_COMPATIBLE_IMPL"] == "1"

    def set_deterministic_level(level):
        """As the real: a level that contradicts torch.use_deterministic_algorithms switches that (a warning), and
        every call warns not to call torch.use_deterministic_algorithms afterwards."""
        import warnings
        _rec("set_deterministic_level", level)
        enabled = torch.are_deterministic_algorithms_enabled()
        if (level == 0) == enabled:
            warnings.warn("The current configuration value of 'torch_npu.npu.set_deterministic_level' conflicts "
                          "with 'torch.use_deterministic_algorithms'. 'torch.use_deterministic_algorithms' has been "
                          "configured to '{}'.".format(level >= 1))
            torch.use_deterministic_algorithms(level >= 1)
        _deterministic_level[0] = int(level)
        warnings.warn("After using 'torch_npu.npu.set_deterministic_level', please do not use "
                      "'torch.use_deterministic_algorithms' anymore, as it may cause unknown errors.")

    def _get_deterministic_level():
        return _deterministic_level[0]


from torch_npu.npu import utils  # noqa: E402,F401
from torch_npu.npu import amp  # noqa: E402,F401
