"""Device-to-host copies of a training step on the torch_npu double, by phase (bench/host_syncs.py): none inside a
step except the read of the meters at a print step (pytorch/examples' loop reads every step), and each other one
the known one: torch_npu's dynamic loss scaler's checks under --amp, DDP's one rebuild of its gradient buckets at
the second step, the synchronisations that time the first two steps and open the FPS window. --model-ema's
average moves every step without one."""
import os
import subprocess

import pytest

from bench import host_syncs
from conftest import DOUBLE, PY, RANKS, ROOT, STACK

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(600)]

STEPS, PRINT_FREQ = 7, 3  # print steps 0, 3, 6; --fps-warmup-steps 5 (the default): its window opens after step 4
FIRST_STEPS, WARM = 2, 5
# torch_npu's GradScaler, dynamic: the overflow flag read after unscaling (_unscale_grads_), again before the
# optimizer step (_maybe_opt_step), and the growth tracker in update (_npu_update_scale)
SCALER = {"item": 3}
# DDP's one rebuild of its gradient buckets in the second step's forward (Reducer::sync_bucket_indices)
DDP_REBUILD = {"copy_to_host": 2}


@pytest.fixture(scope="module", autouse=True)
def double():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([host_syncs.FAKE, ROOT]))
    proc = subprocess.run([PY, "-c", "import torch_npu; print(torch_npu._double.unavailable or '')"], env=env,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.strip():
        pytest.skip(proc.stdout.strip())


def check(result, amp):
    boundaries = result["boundaries"]
    assert boundaries == [0, 3, 6]
    ddp = result["config"]["ranks"] > 1
    for rank in result["ranks"]:
        assert rank["rc"] == 0
        assert [r["step"] for r in rank["steps"]] == list(range(STEPS))
        for record in rank["steps"]:
            i, ops = record["step"], record["ops"]
            assert ops.get("data", {}) == {} and ops.get("backward", {}) == {}, (i, ops)
            assert ops.get("forward", {}) == (DDP_REBUILD if ddp and i == 1 else {}), (i, ops)
            assert ops.get("optimizer", {}) == (SCALER if amp else {}), (i, ops)
            after = dict(ops.get("after", {}))
            syncs = after.pop("synchronize", 0)
            assert syncs == (1 if i < FIRST_STEPS or i == WARM - 1 else 0), (i, ops)
            # the meters, the scaler's values and the guard's counters: one read at a print step, none elsewhere
            assert after == ({"tolist": 1} if i in boundaries else {}), (i, ops)


@pytest.mark.parametrize("amp,extra", [(False, ()), (True, ()), (False, host_syncs.EMA)], ids=["fp32", "amp", "ema"])
def test_one_process_copies_only_at_print_steps(shapes, tmp_path, amp, extra):
    result = host_syncs.measure(shapes, str(tmp_path), 1, amp, STEPS, PRINT_FREQ, extra)
    check(result, amp)
    table = host_syncs.markdown([result]).splitlines()
    assert table[0] == "| run | steps | data | forward | backward | optimizer | after |"
    assert "| 1 process, {}{} | 2, 5 | 0 | 0 | 0 | {} | 0 |".format(
        "--amp (float16, dynamic loss scale)" if amp else "float32", "".join(" " + a for a in extra),
        "3 (item 3)" if amp else "0") in table


@RANKS
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_two_ranks_copy_only_at_print_steps(shapes, tmp_path, amp):
    result = host_syncs.measure(shapes, str(tmp_path), 2, amp, STEPS, PRINT_FREQ)
    assert len(result["ranks"]) == 2
    check(result, amp)
