"""Jobs of several ranks meeting and failing: torchrun's restarts (under load), the rendezvous timeout, the guides'
tcp:// URL, on the CPU and on the NPU (the torch_npu double); each failure as one line. (A rank killed mid-step:
tests/test_failures.py.)"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import (DOUBLE, PY, RANKS, ROOT, SMALL, STACK, child_env, finish, free_port, read_lines, read_summary,
                      run_main)

pytestmark = [STACK, RANKS, pytest.mark.timeout(400)]

# three epochs of a BN-free model: the result does not depend on how the global batch is split over ranks
EPOCHS3 = ["-a", "tiny_cnn", "--epochs", "3", "-b", "8", "--lr", "0.1", "--momentum", "0.9", "--wd", "1e-4",
           "--seed", "11", "--device", "cpu", "--dist-timeout", "120"] + SMALL[:-2] + ["-p", "1"]




def torchrun(args, out_dir, data, extra=(), **kw):
    return subprocess.Popen([PY, "-m", "torch.distributed.run"] + list(args) + [
        os.path.join(ROOT, "main.py"), data, "--output-dir", str(out_dir)] + EPOCHS3 + list(extra),
        env=dict(child_env(), OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, **kw)


def workers_of(out_dir):
    """{pid: RANK} of the main.py processes writing to ``out_dir`` that torchrun started (its workers: the agent's own
    command line names main.py and the folder too, but its environment holds no RANK)."""
    pids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/{}/cmdline".format(entry), "rb") as f:
                    args = f.read().split(b"\0")
                with open("/proc/{}/environ".format(entry), "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            if any(a.endswith(b"main.py") for a in args) and str(out_dir).encode() in args and b"RANK" in env:
                pids[int(entry)] = int(env[b"RANK"])
    return pids


def last_rank(out_dir):
    """The pid of the highest rank of torchrun's workers writing to ``out_dir`` (not the highest pid: pids wrap)."""
    workers = workers_of(out_dir)
    assert workers, "no torchrun worker found for {}".format(out_dir)
    return max(workers, key=workers.get)


class Busy:
    """Both cores kept busy by other processes (the load under which restarts used to fail)."""

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def uninterrupted(data70, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    p = torchrun(["--standalone", "--nproc_per_node", "2"], out, data70)
    _, err = finish(p, timeout=300)
    assert p.returncode == 0, err[-3000:]
    return read_summary(out)


def assert_same_result(out, reference, rel=0.0):
    """The numbers of ``reference``: equal, or within ``rel`` where the sums' order changed (another world size:
    the gradient and validation sums then add the same numbers in another order)."""
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 3 and s["val_images"] == 70
    assert s["final_acc1"] == reference["final_acc1"]
    for key in ("final_loss", "val_loss"):
        assert s[key] == pytest.approx(reference[key], rel=rel, abs=0), key


def test_a_torchrun_restart_under_load_comes_up_and_ends_as_an_uninterrupted_run(data70, uninterrupted, tmp_path):
    """SIGKILL one worker in epoch 1 of 3 under --max-restarts 1, both cores busy while the group restarts: the
    first restart comes up (the stale keys of the killed attempt are not read: rendezvous.py), resumes from
    epoch 1's checkpoint (--resume auto, which --max-restarts requires), and ends with the uninterrupted run's
    numbers."""
    p = torchrun(["--standalone", "--nproc_per_node", "2", "--max_restarts", "1"], tmp_path, data70,
                 ["--resume", "auto"])
    try:
        read_lines(p, lambda lines: lines[-1].startswith("Epoch: [1]["), timeout=240)
        with Busy():
            os.kill(last_rank(tmp_path), signal.SIGKILL)
            out, err = finish(p, timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    assert "=> resumed '{}' at epoch 1".format(os.path.join(str(tmp_path), "checkpoint.pth.tar")) in out
    assert "connectFullMesh" not in err
    assert_same_result(tmp_path, uninterrupted)


def test_a_rendezvous_timeout_is_one_line_naming_who_did_not_arrive(data70, tmp_path):
    port = str(free_port())
    proc = run_main([data70, "--output-dir", str(tmp_path), "--world-size", "2", "--rank", "0", "--port", port]
                    + EPOCHS3 + ["--dist-timeout", "5"], timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = "error: rendezvous timed out after --dist-timeout 5 s at 127.0.0.1:{}: rank(s) 0 of 2 arrived, " \
           "rank(s) 1 did not".format(port)
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(line), proc.stderr
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and s["error"] == proc.stderr.strip()[len("error: "):]

    alone = run_main([data70, "--output-dir", str(tmp_path / "r1"), "--world-size", "2", "--rank", "1", "--port",
                      str(free_port())] + EPOCHS3 + ["--dist-timeout", "5"], timeout=120)
    assert alone.returncode == 1 and len(alone.stderr.strip().splitlines()) == 1, alone.stderr
    assert alone.stderr.startswith("error: rank 1 of 2 could not reach the master at 127.0.0.1:")

    # spawn's ranks share one terminal: node 0 of two (node 1 never started) says it once
    port = str(free_port())
    node0 = run_main([data70, "--output-dir", str(tmp_path / "n0"), "--multiprocessing-distributed", "--world-size",
                      "2", "--rank", "0", "--device-list", "0,1", "--port", port] + EPOCHS3 + ["--dist-timeout", "5"],
                     timeout=120)
    assert node0.returncode == 1 and node0.stderr.strip().splitlines() == [
        "error: rendezvous timed out after --dist-timeout 5 s at 127.0.0.1:{}: rank(s) 0,1 of 4 arrived, rank(s) 2,3 "
        "did not: start them (each node with the same --addr and --port), or raise --dist-timeout".format(port)], \
        node0.stderr


def test_the_guides_tcp_url_is_where_the_ranks_meet(data70, tmp_path):
    """The guide's 8-card line as typed (its placeholder --addr 1.1.1.1 and --dist-url tcp://127.0.0.1:PORT): the
    ranks meet at the URL's host and port, with a note, and train."""
    port = free_port()
    proc = run_main([data70, "--output-dir", str(tmp_path), "--addr=1.1.1.1", "--dist-url",
                     "tcp://127.0.0.1:{}".format(port), "--multiprocessing-distributed", "--world-size", "1",
                     "--rank", "0", "--device-list", "0,1"] + EPOCHS3 + ["--epochs", "1", "--max-steps-per-epoch",
                                                                          "1"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    note = "--dist-url tcp://127.0.0.1:{}: the ranks meet at 127.0.0.1:{} (env://".format(port, port)
    assert note in proc.stdout and "--addr 1.1.1.1 ignored" in proc.stdout
    assert json.dumps(read_summary(tmp_path)["status"]) == '"ok"'


def test_a_node_leaving_a_torchrun_job_of_nnodes_1_to_2_ends_as_an_uninterrupted_run(data70, uninterrupted, tmp_path):
    """Two agents (two "nodes" of one worker) under --nnodes 1:2 with the c10d rendezvous; one node dies (agent and
    worker) in epoch 1, both cores busy: the other agent restarts the group at world size 1, which resumes with the
    global batch kept (8 on one device instead of 4 on each of two; the LR as given), and ends with the numbers of
    the uninterrupted run of two ranks."""
    port = free_port()
    rdzv = ["--nnodes", "1:2", "--nproc_per_node", "1", "--max_restarts", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "127.0.0.1:{}".format(port), "--rdzv_id", "leave",
            "--rdzv_conf", "last_call_timeout=20,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120"]
    agents = [torchrun(rdzv, tmp_path, data70, ["--resume", "auto"])]
    try:
        _listening(port, 120)  # the first agent hosts the rendezvous (node 0 stays; the leaving node is another)
        agents.append(torchrun(rdzv, tmp_path, data70, ["--resume", "auto"]))
        read_lines(agents[0], lambda lines: any("| 2 process(es) |" in ln for ln in lines)
                   and lines[-1].startswith("Epoch: [1]["), timeout=240)
        leaving = agents[1]
        doomed = [pid for pid in workers_of(tmp_path) if _parent(pid) == leaving.pid] + [leaving.pid]
        with Busy():
            for pid in doomed:
                os.kill(pid, signal.SIGKILL)
            out, err = finish(agents[0], timeout=300)
    finally:
        for p in agents:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert agents[0].returncode == 0, err[-3000:]
    assert "=> resumed '{}' at epoch 1".format(os.path.join(str(tmp_path), "checkpoint.pth.tar")) in out
    assert "1 process(es) | batch 8 per device, 8 global" in out
    assert "the world changed from 2 to 1 process(es) since the checkpoint: the global batch 8 is kept" in out
    assert_same_result(tmp_path, uninterrupted, rel=1e-6)


def _listening(port, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the first agent did not open its rendezvous port"
            time.sleep(0.2)


def _parent(pid):
    with open("/proc/{}/stat".format(pid)) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@DOUBLE
def test_the_guides_tcp_url_forms_the_hccl_group_on_the_npu_and_trains_as_on_the_cpu(npu_double, data70, tmp_path):
    """On the NPU (the torch_npu double), where a tcp:// URL used to be refused: the guide's 8-card line as typed
    (placeholder --addr 1.1.1.1, --dist-url tcp://127.0.0.1:PORT, --dist-backend hccl) forms the hccl group of both
    ranks and trains to the end with the numbers of the same line on the CPU (gloo there). (With --addr alone the
    job would have stopped before any rank started: 1.1.1.1 is not this machine.)"""
    calls = tmp_path / "calls.jsonl"
    fake = {"PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests", "fake_npu"), ROOT]),
            "FAKE_NPU_DEVICE_COUNT": "8", "FAKE_NPU_CALL_LOG": str(calls), "OMP_NUM_THREADS": "1"}
    runs = {}
    for device, env in (("npu", fake), ("cpu", {"OMP_NUM_THREADS": "1"})):
        out = tmp_path / device
        proc = run_main([data70, "--output-dir", str(out), "--addr=1.1.1.1", "--dist-url",
                         "tcp://127.0.0.1:{}".format(free_port()), "--dist-backend", "hccl",
                         "--multiprocessing-distributed", "--world-size", "1", "--rank", "0", "--device-list", "0,1"]
                        + EPOCHS3 + ["--epochs", "1", "--max-steps-per-epoch", "2", "--device", device], env=env,
                        timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[device] = read_summary(out)
    with open(str(calls)) as f:
        made = sorted(tuple(json.loads(line)["call"]) for line in f)
    assert ("hccl.new_group", 0, 2) in made and ("hccl.new_group", 1, 2) in made, made
    npu, cpu = runs["npu"], runs["cpu"]
    assert npu["status"] == cpu["status"] == "ok" and npu["device"] == "npu:0" and npu["world_size"] == 2
    assert npu["config"]["dist_backend"] == "hccl" and npu["final_acc1"] == cpu["final_acc1"]
    for key in ("final_loss", "val_loss"):
        assert npu[key] == pytest.approx(cpu[key], rel=1e-5), key
