"""Call recording shared by the fake ``torch_npu`` and the fake ``apex`` (test-only).

Every simulated API call appends a tuple ``(name, *args)`` to the owning package's module-level
list ``calls``. When the environment variable ``FAKE_NPU_CALL_LOG`` names a file, each call is
also appended to it as one JSON line ``{"pid": ..., "pkg": ..., "call": [name, *args]}`` so that a
test can see what child processes (mp.spawn, torchrun) did.
"""

import json
import os

import torch


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return repr(value)


def record(calls, pkg, name, *args):
    """Append ``(name, *args)`` to ``calls`` (and to ``$FAKE_NPU_CALL_LOG`` when set)."""
    calls.append((name,) + args)
    path = os.environ.get("FAKE_NPU_CALL_LOG")
    if path:
        line = json.dumps({"pid": os.getpid(), "pkg": pkg, "call": [name] + [_jsonable(a) for a in args]})
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
