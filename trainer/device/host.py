"""The host: its CPU cores, its CPU's bfloat16, and glibc's malloc tuned for training steps on a CPU."""
import hashlib
import os
import platform

import torch


def usable_cpus():
    """CPU cores this process may run on (its affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpuinfo(keys, path):
    """The value of /proc/cpuinfo's first line whose key is in ``keys``; '' if none or unreadable."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in keys:
                    return value
    except OSError:
        pass
    return ""


def _cpuinfo_flags(path="/proc/cpuinfo"):
    """The CPU feature flags of /proc/cpuinfo (x86 "flags", aarch64 "Features"); empty if unreadable."""
    return set(_cpuinfo(("flags", "features"), path).split())


def cpu_identity(path="/proc/cpuinfo"):
    """This CPU's kind as one string (its model name and a digest of its feature flags; the platform's name where
    /proc/cpuinfo is unreadable): the key under which measured verdicts about it are kept."""
    name = _cpuinfo(("model name", "cpu model"), path).strip()
    flags = " ".join(sorted(_cpuinfo_flags(path)))
    return "{} ({} cores, flags {})".format(name or platform.processor() or platform.machine(), usable_cpus(),
                                           hashlib.sha1(flags.encode()).hexdigest()[:12])


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


def keep_host_memory(kind, environ=None, tensors_on_host=True):
    """Where ``kind``'s tensors live in host memory, keep the heap at its peak (no mmap, no trim): glibc serves blocks
    over 32 MiB (and what its trim threshold lets go) from the OS, so each step page-faulted its activations in again,
    a third of a ShuffleNetV2 x0.5 step on 2 AVX2 cores (docs/BENCHMARKS.md, "Host memory"). Left alone where the
    user chose an allocator (``LD_PRELOAD``) or glibc settings (any ``MALLOC_*``: ``MALLOC_PERTURB_=0`` keeps glibc's
    default; a threshold such as ``MALLOC_TRIM_THRESHOLD_`` also ends its dynamic mmap threshold) and off glibc.
    Returns a short description (summary.json's ``host_memory``); the first call decides for the process."""
    if _HOST_MEMORY:
        return _HOST_MEMORY[0]
    what = user_allocator_choice(environ) if tensors_on_host else "system allocator (tensors on {})".format(kind)
    if what is None:
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
    """Whether this CPU computes bfloat16 natively (x86 avx512_bf16 / AMX, Arm bf16): torch's own probes (torch >=
    2.1) where present, /proc/cpuinfo's flags otherwise."""
    probes = [getattr(getattr(torch, "cpu", None), n, None) for n in ("_is_avx512_bf16_supported",
                                                                       "_is_amx_tile_supported")]
    if platform.machine().lower() in ("x86_64", "amd64") and all(p is not None for p in probes):
        try:
            return any(bool(p()) for p in probes)
        except Exception:
            pass
    return bool(_cpuinfo_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


