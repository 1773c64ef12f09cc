"""FAKE torch_npu, test-only: faults a test asks for through the environment.

``FAKE_NPU_INF_GRAD_STEPS=2,5``: at the 2nd and 5th overflow check of this process (the GradScaler's unscale, apex's
``scale_loss``; one per training step) the first gradient's first element is inf before the check, as after a
float16 overflow in the backward pass. The step is then skipped, as a real overflow step is.

``FAKE_NPU_DEFECT=addmm`` (or ``addmm:1.5``): a wrong kernel. Every result of that aten op (its name without the
overload) on the device is multiplied by the factor (default 2), as a numerical defect of one device kernel would
make it; a precision comparison against the CPU should find the first module that calls it (``addmm``: a ResNet's
``fc``, the one Linear of its forward pass).
"""
import math
import os

import torch

_checks = [0]


def poison(grads):
    """Count one overflow check; put inf into ``grads[0]`` where this check is one the environment lists."""
    _checks[0] += 1
    steps = {int(s) for s in os.environ.get("FAKE_NPU_INF_GRAD_STEPS", "").split(",") if s.strip()}
    if _checks[0] in steps and grads:
        grads[0].view(-1)[0] = math.inf


def defect():
    """(op name, factor) of FAKE_NPU_DEFECT, or None."""
    text = os.environ.get("FAKE_NPU_DEFECT", "").strip()
    if not text:
        return None
    name, _, factor = text.partition(":")
    return name.strip(), float(factor) if factor.strip() else 2.0


def corrupt(func, result, wrong=defect()):
    """``result`` of aten op ``func`` scaled where it is FAKE_NPU_DEFECT's op (read once, at import)."""
    if wrong is None or func.overloadpacket.__name__ != wrong[0] or not isinstance(result, torch.Tensor):
        return result
    return result * wrong[1]
