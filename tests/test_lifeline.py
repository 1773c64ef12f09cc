"""A process ends with the one that started it (trainer/job/lifeline.py): a data loader's workers with their rank,
also a rank killed while its workers were still starting (torch's own watchdog then waits forever), and a
process whose parent was gone before it could arm the signal."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ONCE, PY, ROOT, STACK, gone

pytestmark = [STACK, pytest.mark.timeout(120),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")]

_KILLED_WITH_WORKERS = r"""
import os, signal, sys, time
sys.path.insert(0, {root!r})
import torch
from trainer.data.samplers import dataloader
loader = dataloader(torch.utils.data.TensorDataset(torch.arange(64.0).view(32, 2)), 2, None, 1, False, True)
batches = iter(loader)
{first}
print(" ".join(str(w.pid) for w in batches._workers), flush=True)
{wait}
os.kill(os.getpid(), signal.SIGKILL)
"""

# Adopts the orphans of the process it starts (PR_SET_CHILD_SUBREAPER) and prints how each worker ended: by a
# signal (-N) or with an exit code; a worker still running after 60 s is left out (and killed).
_REAPER = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
p = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
pids = [int(x) for x in p.stdout.readline().split()]
p.wait()
ended, deadline = {}, time.monotonic() + 60
while len(ended) < len(pids) and time.monotonic() < deadline:
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        time.sleep(0.02)
    elif pid in pids:
        ended[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
for pid in set(pids) - set(ended):
    os.kill(pid, 9)
print(json.dumps({"workers": len(pids), "ended": sorted(ended.values())}), flush=True)
"""


def _workers_end(first, wait):
    """Start a loader's workers in a process, kill that process with SIGKILL; how each of its workers ended."""
    code = _KILLED_WITH_WORKERS.format(root=ROOT, first=first, wait=wait)
    p = subprocess.run([PY, "-c", _REAPER, code], capture_output=True, text=True, timeout=100,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["workers"], "the loader started no worker"
    return got


def test_a_loaders_workers_end_at_once_with_their_killed_process():
    # the worker is idle in its queue's 5 s wait: torch's watchdog would notice the loss later and exit (code 0);
    # the lifeline's SIGKILL ends each at once
    got = _workers_end("next(batches)", "time.sleep(1)")
    assert got["ended"] == [-signal.SIGKILL] * got["workers"], got


@pytest.mark.parametrize("attempt", range(3))
def test_a_process_killed_while_its_workers_start_leaves_none_behind(attempt):
    # killed right after the workers were forked: before this project's worker_init, most of them (4 of 6
    # here) had not set torch's watchdog up yet and waited for work forever (left out of "ended")
    got = _workers_end("", "")
    assert len(got["ended"]) == got["workers"], got


@ONCE
def test_a_process_whose_parent_is_gone_before_it_arms_the_signal_ends(tmp_path):
    survived = tmp_path / "survived"
    child = ("import os, sys, time, signal; sys.path.insert(0, {root!r}); from trainer.job import lifeline\n"
             "parent = int(sys.argv[1]); print(os.getpid(), flush=True)\n"
             "while os.getppid() == parent: time.sleep(0.05)\n"  # the shell that started it has ended
             "lifeline.die_with_parent(signal.SIGTERM, parent)\n"
             "open({out!r}, 'w').close()\n").format(root=ROOT, out=str(survived))
    sh = subprocess.Popen(["sh", "-c", '"$0" -c "$1" $$ &', PY, child], stdout=subprocess.PIPE, text=True)
    pid = int(sh.stdout.readline())
    sh.stdout.close()
    sh.wait(timeout=60)
    try:
        assert gone(pid, within=30), "it went on after its parent"
        assert not survived.exists()
    finally:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
