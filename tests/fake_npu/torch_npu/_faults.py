"""FAKE torch_npu, test-only: faults a test asks for through the environment.

``FAKE_NPU_INF_GRAD_STEPS=2,5``: at the 2nd and 5th overflow check of this process (the GradScaler's unscale, apex's
``scale_loss``; one per training step) the first gradient's first element is inf before the check, as after a
float16 overflow in the backward pass. The step is then skipped, as a real overflow step is.
"""
import math
import os

_checks = [0]


def poison(grads):
    """Count one overflow check; put inf into ``grads[0]`` where this check is one the environment lists."""
    _checks[0] += 1
    steps = {int(s) for s in os.environ.get("FAKE_NPU_INF_GRAD_STEPS", "").split(",") if s.strip()}
    if _checks[0] in steps and grads:
        grads[0].view(-1)[0] = math.inf
