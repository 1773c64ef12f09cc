"""Jobs of several ranks meeting and failing: torchrun's restarts (under load), the rendezvous timeout, a rank
killed mid-step, the guides' tcp:// URL; each failure as one line."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import PY, RANKS, ROOT, SMALL, child_env, finish, read_lines, read_summary, run_main
from tools.make_dataset import generate

pytestmark = [RANKS, pytest.mark.timeout(400)]

# three epochs of a BN-free model: the result does not depend on how the global batch is split over ranks
EPOCHS3 = ["-a", "tiny_cnn", "--epochs", "3", "-b", "8", "--lr", "0.1", "--momentum", "0.9", "--wd", "1e-4",
           "--seed", "11", "--device", "cpu", "--dist-timeout", "120"] + SMALL[:-2] + ["-p", "1"]


@pytest.fixture(scope="module")
def data70(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "d70")
    return generate(out, classes=10, train_per_class=6, val_per_class=7, size=32, seed=5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, out_dir, data, extra=(), **kw):
    return subprocess.Popen([PY, "-m", "torch.distributed.run"] + list(args) + [
        os.path.join(ROOT, "main.py"), data, "--output-dir", str(out_dir)] + EPOCHS3 + list(extra),
        env=dict(child_env(), OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, **kw)


def workers_of(out_dir):
    """The pids of the main.py processes writing to ``out_dir`` (torchrun's workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/{}/cmdline".format(entry), "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"main.py") for a in args) and str(out_dir).encode() in args:
                pids.append(int(entry))
    return pids


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
    p = torchrun(["--standalone", "--nproc-per-node", "2"], out, data70)
    _, err = finish(p, timeout=300)
    assert p.returncode == 0, err[-3000:]
    return read_summary(out)


def assert_same_result(out, reference):
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 3 and s["val_images"] == 70
    assert (s["final_acc1"], s["final_loss"], s["val_loss"]) == (
        reference["final_acc1"], reference["final_loss"], reference["val_loss"])


def test_a_torchrun_restart_under_load_comes_up_and_ends_as_an_uninterrupted_run(data70, uninterrupted, tmp_path):
    """SIGKILL one worker in epoch 1 of 3 under --max-restarts 1, both cores busy while the group restarts: the
    first restart comes up (the stale keys of the killed attempt are not read: rendezvous.py), resumes from
    epoch 1's checkpoint without --resume, and ends with the uninterrupted run's numbers."""
    p = torchrun(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"], tmp_path, data70)
    try:
        read_lines(p, lambda lines: lines[-1].startswith("Epoch: [1]["), timeout=240)
        with Busy():
            os.kill(max(workers_of(tmp_path)), signal.SIGKILL)
            out, err = finish(p, timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err[-3000:]
    assert "attempt 2 of at most 2): resuming from the last checkpoint" in out
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


def test_a_rank_killed_mid_step_is_one_line_naming_it(data70, tmp_path):
    port = str(free_port())
    long_run = EPOCHS3 + ["--epochs", "100", "-b", "4"]
    procs = [subprocess.Popen([PY, os.path.join(ROOT, "main.py"), data70, "--output-dir", str(tmp_path),
                               "--world-size", "2", "--rank", str(r), "--port", port] + long_run,
                              env=dict(child_env(), OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        read_lines(procs[0], lambda lines: re.match(r"Epoch: \[0\]\[\s*3/", lines[-1]), timeout=180)
        procs[1].kill()
        _, err = finish(procs[0], timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[0].returncode == 1 and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank 0 of 2 stopped: rank(s) 1 failed ("), err
    assert "continue with --resume auto" in lines[0]
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and s["error"] == lines[0][len("error: "):]


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
