"""FAKE Ascend apex (apex-patch) for tests only.

Not the real package. Public names and signatures follow the Ascend apex-patch (gitee
ascend/apex, patch/npu.patch and src/apex/optimizers/) on top of NVIDIA apex amp; see
docs/NPU_API.md. Like the real one it imports torch_npu (here: the fake next to it).

Every simulated call is appended to ``apex.calls`` as a tuple ``(name, *args)``.
"""

import torch_npu  # noqa: F401  (the real apex-patch imports torch_npu too)

FAKE = True
calls = []


def _record(name, *args):
    from torch_npu._recorder import record

    record(calls, "apex", name, *args)


def reset_calls():
    """Empty ``calls`` (test helper; not part of the real API)."""
    del calls[:]


from apex import amp  # noqa: E402,F401
from apex import optimizers  # noqa: E402,F401
