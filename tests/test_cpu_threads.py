"""Compute threads of a node's several CPU ranks (trainer/job/affinity.py): each rank its share of the cores by
default, under every launcher; OMP_NUM_THREADS set by the user wins, torchrun's own default of 1 does not."""
import os
import re
import subprocess

import pytest

from conftest import PY, RANKS, ROOT, SMALL, STACK, free_port, read_summary

pytestmark = [STACK, RANKS, pytest.mark.timeout(300)]

STEP = ["-a", "tiny_cnn", "--device", "cpu", "-b", "8", "--epochs", "1", "--max-steps-per-epoch", "2",
        "--no-validate", "--seed", "0", "--dist-timeout", "120"] + SMALL
CORES = len(os.sched_getaffinity(0))
SHARE = max(1, CORES // 2)  # two ranks on this node
LINE = re.compile(r"^(?:\[rank (\d+)\] )?=> cpu binding: none \(a CPU run binds nothing unless asked\); "
                  r"(\d+) compute thread\(s\): (.+)$", re.M)


def _env(**extra):
    """This environment without a thread count (as a user's shell has none), unbuffered, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RANK", "WORLD_SIZE",
                                                          "RANK_ID", "RANK_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _threads(out):
    """{rank: (threads, why)} of the ``=> cpu binding`` lines in a job's output."""
    return {int(m.group(1) or 0): (int(m.group(2)), m.group(3)) for m in LINE.finditer(out)}


def _run(cmd, env, out_dir):
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    s = read_summary(out_dir)
    assert s["status"] == "ok" and s["world_size"] == 2, s
    return proc, s


SHARED = "its share of {} core(s) among 2 ranks on this node".format(CORES)


def test_spawned_ranks_each_run_their_share_and_a_users_omp_num_threads_wins(shapes, tmp_path):
    def spawn(out, env):
        return _run([PY, os.path.join(ROOT, "main.py"), shapes, "--output-dir", str(out),
                     "--multiprocessing-distributed", "--device-list", "0,1", "--port", "0"] + STEP, env, out)

    proc, s = spawn(tmp_path / "default", _env())
    assert _threads(proc.stdout) == {0: (SHARE, SHARED), 1: (SHARE, SHARED)}, proc.stdout
    assert (s["cpu_binding"]["threads"], s["cpu_binding"]["threads_from"]) == (SHARE, SHARED)
    mine = SHARE + 1  # differs from the share on any core count
    proc, s = spawn(tmp_path / "users", _env(OMP_NUM_THREADS=str(mine)))
    why = "OMP_NUM_THREADS={} (set before start)".format(mine)
    assert _threads(proc.stdout) == {0: (mine, why), 1: (mine, why)}, proc.stdout
    assert s["cpu_binding"]["threads"] == mine


def test_torchrun_ranks_take_their_share_over_torchruns_one_thread_but_not_over_the_users(shapes, tmp_path):
    def torchrun(out, env):
        return _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     os.path.join(ROOT, "main.py"), shapes, "--output-dir", str(out)] + STEP, env, out)

    proc, s = torchrun(tmp_path / "default", _env())  # torchrun exports OMP_NUM_THREADS=1 to its ranks
    assert _threads(proc.stdout) == {0: (SHARE, SHARED), 1: (SHARE, SHARED)}, proc.stdout
    assert s["cpu_binding"]["threads_from"] == SHARED
    proc, s = torchrun(tmp_path / "users", _env(OMP_NUM_THREADS="1"))
    why = "OMP_NUM_THREADS=1 (set before start)"
    assert _threads(proc.stdout) == {0: (1, why), 1: (1, why)}, proc.stdout


@pytest.mark.skipif(CORES < 2, reason="binding each rank to a core of its own needs two cores")
def test_shell_loop_ranks_share_the_cores_and_ranks_bound_before_start_use_their_own(shapes, tmp_path):
    """ModelZoo's loop (RANK_ID / RANK_SIZE): unbound, each rank its share; bound one core each before start
    (taskset per rank in a launch script), each rank all of its own cores."""
    cores = sorted(os.sched_getaffinity(0))

    def loop(out, pin):
        env = _env(RANK_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = [subprocess.Popen([PY, os.path.join(ROOT, "main.py"), shapes, "--output-dir", str(out),
                                   "--modelzoo", "off"] + STEP, cwd=ROOT, env=dict(env, RANK_ID=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=(lambda c=cores[r]: os.sched_setaffinity(0, {c})) if pin else None)
                 for r in range(2)]
        outs = [p.communicate(timeout=280) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
        return {**_threads(outs[0][0]), **_threads(outs[1][0])}

    assert loop(tmp_path / "shared", False) == {0: (SHARE, SHARED), 1: (SHARE, SHARED)}
    own = "this rank's 1 core(s), bound before start"
    assert loop(tmp_path / "pinned", True) == {0: (1, own), 1: (1, own)}
