"""Several processes on CPU with gloo: every launch mode, one behaviour."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest
import torch

from conftest import (PY, RANKS, ROOT, SMALL, STACK, WAYS, assert_one_line, assert_one_line_error, free_port, gone,
                      read_lines, read_summary, run_main)
from trainer.device import torch_load

pytestmark = [STACK, RANKS]

# one optimizer step of a BN-free model, then a full validation pass
STEP = ["-a", "tiny_cnn", "--epochs", "1", "--max-steps-per-epoch", "1", "-b", "8", "--lr", "0.1",
        "--momentum", "0.9", "--wd", "1e-4", "--seed", "11", "--device", "cpu",
        "--dist-timeout", "120"] + SMALL  # a rendezvous that cannot complete fails in 2 minutes with torch's reason



def weights(out_dir):
    return torch_load(os.path.join(str(out_dir), "checkpoint.pth.tar"), weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def single(data70, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    proc = run_main([data70, "--output-dir", str(out)] + STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def assert_same_as_single(out, single):
    s = read_summary(out)
    assert s["status"] == "ok" and s["world_size"] == 2 and s["per_device_batch_size"] == 4
    assert s["global_batch_size"] == 8
    assert s["val_images"] == 70
    a, b = weights(single), weights(out)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-6), k
    assert any(not torch.equal(a[k], torch.zeros_like(a[k])) for k in a)


@WAYS
def test_spawn_two_processes_match_one(data70, single, tmp_path):
    proc = run_main([data70, "--output-dir", str(tmp_path), "--multiprocessing-distributed",
                     "--device-list", "0,1", "--port", "0"] + STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_as_single(tmp_path, single)
    assert "batch 4 per device, 8 global" in proc.stdout


@WAYS
def test_torchrun_two_processes_match_one(data70, single, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path)] + STEP,
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_as_single(tmp_path, single)


@WAYS
def test_shell_loop_two_processes_match_one(data70, single, tmp_path):
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK_ID=str(rank), RANK_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PYTHONUNBUFFERED="1")
        # RANK_SIZE marks a ModelZoo script's run, which takes ModelZoo's defaults: this loop compares the recipe
        # of the single process (pytorch/examples')
        procs.append(subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path),
                                       "--modelzoo", "off"] + STEP, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert_same_as_single(tmp_path, single)
    assert "Epoch: [0]" in outs[0][0] and "Epoch: [0]" not in outs[1][0]  # rank 0 logs the metrics


def _loop(data70, tmp_path, per_rank_env, per_rank_args, shared_env):
    """Start one main.py per rank the way a guide's shell loop does; returns their (stdout, stderr)."""
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for k in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "LOCAL_RANK"):
            env.pop(k, None)
        env.update(shared_env)
        env.update(per_rank_env(rank))
        procs.append(subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path)]
                                      + STEP + per_rank_args(rank), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    return outs


@WAYS
def test_910b_guide_train_sh_loop_is_one_job(data70, single, tmp_path):
    """seed 003's train.sh: MASTER_ADDR, MASTER_PORT, WORLD_SIZE=2 exported; LOCAL_RANK=$i and --local_rank=$i
    per process; no RANK. One job of two ranks, every validation image counted once."""
    shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    outs = _loop(data70, tmp_path, lambda r: {"LOCAL_RANK": str(r)}, lambda r: ["--local_rank={}".format(r)], shared)
    assert_same_as_single(tmp_path, single)
    assert "2 process(es)" in outs[0][0] and "Epoch: [0]" not in outs[1][0]


def test_two_node_ranks_on_one_machine(data70, single, tmp_path):
    """--world-size 2 nodes x 1 process, node ranks 0 and 1, rendezvous by --addr/--port."""
    port = str(free_port())
    procs = []
    for node in range(2):
        procs.append(subprocess.Popen(
            [PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path), "--multiprocessing-distributed",
             "--world-size", "2", "--rank", str(node), "--device-list", "0", "--addr", "127.0.0.1", "--port", port]
            + STEP, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert_same_as_single(tmp_path, single)


def _two_nodes(data70, folders, args):
    """Two "nodes" of one process each (--world-size 2 --rank N), each with its own --output-dir."""
    port = str(free_port())
    procs = [subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(folders[node]),
                               "--world-size", "2", "--rank", str(node), "--addr", "127.0.0.1", "--port", port]
                              + STEP + args, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in range(2)]
    return [(p.communicate(timeout=300), p.returncode) for p in procs]


def test_nodes_with_their_own_output_dirs_each_keep_checkpoints_and_resume_alike(data70, tmp_path):
    """The guide's layout: each node saves on its own disk. Each node's local rank 0 writes the checkpoints and
    summary into its folder, so --resume auto resumes both at the same epoch; folders holding different epochs
    stop the job before training, with one line per node and nothing overwritten."""
    folders = [tmp_path / "node0", tmp_path / "node1"]
    runs = _two_nodes(data70, folders, [])
    assert [rc for _, rc in runs] == [0, 0], [err[-2000:] for (out, err), _ in runs]
    assert "1 of 2 nodes do not see rank 0's folder" in runs[0][0][0]
    assert "node 1 writes its own checkpoints and summary in '{}'".format(folders[1]) in runs[1][0][0]
    for folder in folders:
        assert read_summary(folder)["status"] == "ok" and read_summary(folder)["epochs_completed"] == 1
    a, b = weights(folders[0]), weights(folders[1])
    assert all(torch.equal(a[k], b[k]) for k in a)

    runs = _two_nodes(data70, folders, ["--resume", "auto", "--epochs", "2"])
    assert [rc for _, rc in runs] == [0, 0], [err[-2000:] for (out, err), _ in runs]
    assert "resumed '{}' at epoch 1".format(os.path.join(str(folders[0]), "checkpoint.pth.tar")) in runs[0][0][0]
    for folder in folders:
        assert read_summary(folder)["epochs_completed"] == 2

    os.remove(os.path.join(str(folders[1]), "checkpoint.pth.tar"))  # node 1's disk lost its checkpoint
    with open(os.path.join(str(folders[0]), "checkpoint.pth.tar"), "rb") as f:
        before = f.read()
    runs = _two_nodes(data70, folders, ["--resume", "auto", "--epochs", "3"])
    for node, ((out, err), rc) in enumerate(runs):
        assert_one_line(rc, err, "the ranks would start at different epochs (0 to 2)", "copy the newest "
                        "checkpoint.pth.tar", out=out)
        assert "Epoch: [" not in out
    assert "this node has '{}".format(folders[0]) in runs[0][0][1]
    assert "this node has no checkpoint in '{}'".format(folders[1]) in runs[1][0][1]
    with open(os.path.join(str(folders[0]), "checkpoint.pth.tar"), "rb") as f:
        assert f.read() == before
    assert read_summary(folders[1])["epochs_completed"] == 2  # the failed start left the summaries alone


def test_busy_port_is_a_clear_error(data70, tmp_path):
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = run_main([data70, "--output-dir", str(tmp_path), "--multiprocessing-distributed",
                         "--device-list", "0,1", "--port", str(port)] + STEP)
    assert_one_line_error(proc, "port {} is in use".format(port), "--port 0")


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/{}/stat".format(entry)) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(entry))
            except (OSError, IndexError):
                pass
    return out


def test_killing_one_rank_stops_the_job(data70, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path),
                          "--multiprocessing-distributed", "--device-list", "0,1", "--port", "0", "-a", "resnet18",
                          "--epochs", "100", "-b", "4", "--device", "cpu", "-p", "1"] + SMALL[:6] + ["-j", "1"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_lines(p, lambda lines: re.match(r"Epoch: \[0\]\[\s*2/", lines[-1]), timeout=180)
    ranks = [c for c in _children(p.pid) if "spawn" in open("/proc/{}/cmdline".format(c)).read()]
    assert len(ranks) == 2, ranks
    family = ranks + [g for r in ranks for g in _children(r)]  # ranks and their data workers
    os.kill(ranks[-1], signal.SIGKILL)
    try:
        p.wait(timeout=120)  # 100 epochs would take far longer: the job was stopped
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode not in (0, None)
    assert all(gone(q, within=15) for q in family), "processes left behind"
    assert "failed" in p.stderr.read()


# ---------------------------------------------------------------- spawn's supervision (any torch)


def crash_on_rank_1(plan):
    """A rank body for spawn: local rank 1 raises, the others would run past the test's time limit."""
    if plan.launch.local_rank == 1:
        raise RuntimeError("injected failure on local rank {}".format(plan.launch.local_rank))
    time.sleep(600)
    return 0


def test_a_spawned_ranks_traceback_reaches_the_user_once_and_the_others_stop(tmp_path, capfd):
    from trainer import config
    from trainer.job import ranks
    from trainer.plan import plan
    cfg = config.parse_config(["--dummy", "--device", "cpu", "--multiprocessing-distributed", "--device-list",
                               "0,1", "--port", "0", "-b", "8", "--output-dir", str(tmp_path)], env={}).cfg
    code = ranks.spawn(plan(cfg, env={}), crash_on_rank_1)
    err = capfd.readouterr().err
    assert code == 1, (code, err)
    assert err.count("RuntimeError: injected failure on local rank 1") == 1, err
    assert "Traceback" in err and "in crash_on_rank_1" in err
    assert err.strip().splitlines()[-1] == "error: local rank 1 failed (exit code 1); stopped the other ranks"


def _describe(pid):
    """A process for a failure message: pid, state, parent, command line."""
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/{}/cmdline".format(pid)) as f:
            cmd = f.read().replace("\0", " ")[:120]
        return "{} {} ppid {} {}".format(pid, fields[0], fields[1], cmd)
    except OSError:
        return "{} gone".format(pid)


def _spawned_job(data70, tmp_path):
    """main.py with two spawned ranks, in a session of its own (a terminal's process group), SIGINT as a
    terminal has it; returns (Popen, rank pids, ranks and their data workers) once it trains."""
    p = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path),
                          "--multiprocessing-distributed", "--device-list", "0,1", "--port", "0", "-a", "tiny_cnn",
                          "--epochs", "1000", "-b", "4", "--device", "cpu", "-p", "1"] + SMALL[:6] + ["-j", "1"],
                         env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    read_lines(p, lambda lines: re.match(r"Epoch: \[0\]\[\s*2/", lines[-1]), timeout=180)
    ranks = [c for c in _children(p.pid) if "spawn" in open("/proc/{}/cmdline".format(c)).read()]
    assert len(ranks) == 2, ranks
    return p, ranks, ranks + [g for r in ranks for g in _children(r)]


def test_ctrl_c_stops_every_rank(data70, tmp_path):
    p, _, family = _spawned_job(data70, tmp_path)
    try:
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err[-3000:]
    assert re.search(r"interrupted by SIGINT: all 2 ranks stopped at epoch \d+ step \d+ \(global step \d+\); "
                     r"checkpoint '", err), err[-3000:]
    assert all(gone(q, within=15) for q in family), "processes left behind"
    assert read_summary(tmp_path)["status"] == "interrupted"


def test_ranks_end_with_their_killed_supervisor(data70, tmp_path):
    p, _, family = _spawned_job(data70, tmp_path)
    try:
        p.kill()  # SIGKILL: the supervisor cannot stop anything itself
        p.wait(timeout=30)
        left = [q for q in family if not gone(q, within=30)]
        assert not left, "ranks went on training without their supervisor: " + "; ".join(map(_describe, left))
    finally:
        for q in family:
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
