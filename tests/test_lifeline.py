"""A process ends with the one that started it (trainer/lifeline.py): a data loader's workers with their rank,
also a rank killed while its workers were still starting (torch's own watchdog then waits forever), and a
process whose parent was gone before it could arm the signal."""
import os
import subprocess
import sys

import pytest

from conftest import PY, ROOT, gone

pytestmark = [pytest.mark.timeout(120),
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


def _workers_left(first, wait, within):
    code = _KILLED_WITH_WORKERS.format(root=ROOT, first=first, wait=wait)
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    pids = []
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        p.wait(timeout=60)
        assert pids, "the loader started no worker"
        return [q for q in pids if not gone(q, within=within)]
    finally:
        for q in pids:
            try:
                os.kill(q, 9)
            except OSError:
                pass


def test_a_loaders_workers_end_at_once_with_their_killed_process():
    # the worker is idle in its queue's 5 s wait: torch's watchdog would notice the loss seconds later
    assert _workers_left("next(batches)", "time.sleep(1)", within=2.5) == []


@pytest.mark.parametrize("attempt", range(3))
def test_a_process_killed_while_its_workers_start_leaves_none_behind(attempt):
    # killed right after the workers were forked: before this project's worker_init, most of them (4 of 6
    # here) had not set torch's watchdog up yet and waited for work forever
    assert _workers_left("", "", within=10) == []


def test_a_process_whose_parent_is_gone_before_it_arms_the_signal_ends(tmp_path):
    survived = tmp_path / "survived"
    child = ("import os, sys, time, signal; sys.path.insert(0, {root!r}); from trainer import lifeline\n"
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
