"""Who a failure is blamed on, and what a stopped rank leaves on its stderr: a rank's own error keeps its
traceback (also one that mentions a broken pipe), a peer is named only on the store's evidence, and the
stderr held back at the rendezvous is written out when the rank is stopped there."""
import os
import re
import signal
import subprocess
import textwrap

import pytest

from conftest import ONCE, PY, RANKS, ROOT, SMALL, STACK, child_env, finish, free_port, read_lines, read_summary
from trainer.job.ranks import Ranks

pytestmark = [STACK, pytest.mark.timeout(300)]

# a long run of a BN-free model, a line per step: each test stops it early
LONG = ["-a", "tiny_cnn", "--epochs", "100", "-b", "4", "--lr", "0.1", "--seed", "11", "--device", "cpu",
        "--dist-timeout", "120"] + SMALL[:-2] + ["-p", "1"]

# A user's own training script: main.py's main(), with every forward pass counted on the store of the user's
# dashboard (host:port, its first argument). Once the dashboard is gone, torch's store raises "Broken pipe" (or
# "Connection reset by peer"). The world size -1 (unknown) is the form every torch from 1.11 on takes (1.11
# refuses None).
USER_SCRIPT = textwrap.dedent("""\
    import datetime
    import sys

    import torch

    sys.path.insert(0, {root!r})
    import main

    host, port = sys.argv[1].split(":")
    dashboard = torch.distributed.TCPStore(host, int(port), -1, False, datetime.timedelta(seconds=10))


    def count(module, inputs, output):
        dashboard.add("forwards", 1)


    torch.nn.modules.module.register_module_forward_hook(count)

    if __name__ == "__main__":
        sys.exit(main.main(sys.argv[2:]))
    """)

DASHBOARD = ("import datetime, sys, time, torch\n"
             "s = torch.distributed.TCPStore('127.0.0.1', 0, -1, True, datetime.timedelta(seconds=30),"
             " wait_for_workers=False)\n"
             "print(s.port, flush=True)\n"
             "time.sleep(600)\n")


class Dashboard:
    """The user's dashboard: a store on a free port of localhost, until ``kill``."""

    def __enter__(self):
        self.proc = subprocess.Popen([PY, "-c", DASHBOARD], stdout=subprocess.PIPE, text=True, env=child_env())
        self.address = "127.0.0.1:{}".format(self.proc.stdout.readline().strip())
        return self

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def __exit__(self, *exc):
        self.kill()


def user_script(tmp_path):
    path = tmp_path / "train_with_dashboard.py"
    path.write_text(USER_SCRIPT.format(root=ROOT))
    return str(path)


def start(args, env=None, script=None, dashboard=None):
    cmd = [PY, script, dashboard] if script else [PY, os.path.join(ROOT, "main.py")]
    return subprocess.Popen(cmd + [str(a) for a in args], env=dict(child_env(), OMP_NUM_THREADS="1", **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal has it


def stepping(proc, epoch=0, step=1):
    read_lines(proc, lambda lines: re.match(r"Epoch: \[{}\]\[\s*{}/".format(epoch, step), lines[-1]), timeout=180)


# what torch's store raises once the dashboard is gone (which of the two: when the kill came), the words of a
# collective whose peer died; in a rank of a process group torch starts each line of a traceback with "[rank1]: "
GONE = (r"^(\[rank\d\]: )?(torch\.distributed\.)?(DistNetworkError|RuntimeError): "
        r"(Broken pipe|Connection reset by peer)$")


def assert_own_broken_pipe(rc, err):
    """The rank's own error as Python raised it: its traceback through the user's hook, exit 1, no peer named."""
    assert rc == 1, err[-3000:]
    assert "Traceback (most recent call last)" in err and ", in count" in err, err[-3000:]
    assert re.search(GONE, err, re.M), err[-3000:]
    assert "stopped: " not in err and "a peer" not in err, err[-3000:]


# ---------------------------------------------------------------- item: a rank's own error is its own


def dashboard_dies_mid_run(p, dashboard):
    """Once ``p`` trains, the user's dashboard is killed; ``p``'s stderr once it has ended."""
    try:
        stepping(p)
        dashboard.kill()
        return finish(p)[1]
    finally:
        if p.poll() is None:
            p.kill()


def test_a_single_process_runs_own_broken_pipe_keeps_its_traceback(shapes, tmp_path):
    """The user's script counts forward passes on a dashboard that dies mid-run: the store raises "Broken pipe"
    in the run's own process, a run of one process: the traceback and exit 1, as any other error, and the
    summary says what failed (not "a peer failed": there is none)."""
    with Dashboard() as dashboard:
        p = start([shapes, "--output-dir", tmp_path] + LONG, script=user_script(tmp_path),
                  dashboard=dashboard.address)
        err = dashboard_dies_mid_run(p, dashboard)
    assert_own_broken_pipe(p.returncode, err)
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and re.search(GONE, s["error"]), s["error"]


@RANKS
def test_a_ranks_own_broken_pipe_keeps_its_traceback_and_its_peer_names_it(shapes, tmp_path):
    """Two ranks (the guide's loop: --world-size 2 --rank N); rank 1 runs the user's script, whose dashboard dies
    mid-run. Rank 1 shows its own traceback (its peer is alive: nothing blames it); rank 0, cut off, names rank 1
    in one line, which the store's record of rank 1's failure proves."""
    job = ["--output-dir", tmp_path, "--world-size", "2", "--port", free_port()] + LONG
    with Dashboard() as dashboard:
        procs = [start([shapes, "--rank", "0"] + job),
                 start([shapes, "--rank", "1"] + job, script=user_script(tmp_path), dashboard=dashboard.address)]
        try:
            stepping(procs[0])
            dashboard.kill()
            errs = [finish(p)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    assert_own_broken_pipe(procs[1].returncode, errs[1])
    assert procs[0].returncode == 1 and "Traceback" not in errs[0], errs[0][-3000:]
    lines = errs[0].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank 0 of 2 stopped: rank(s) 1 failed ("), errs[0]
    assert read_summary(tmp_path)["error"] == lines[0][len("error: "):]


@RANKS
def test_a_spawned_ranks_own_broken_pipe_reaches_the_user_as_its_traceback(shapes, tmp_path):
    """--multiprocessing-distributed through the user's script (each spawned rank imports it, and counts on the
    dashboard): the dashboard dies, the rank that failed first leaves its traceback in its trace file, which the
    supervisor prints once, with the line naming that rank."""
    with Dashboard() as dashboard:
        p = start([shapes, "--output-dir", tmp_path, "--multiprocessing-distributed", "--device-list", "0,1",
                   "--port", "0"] + LONG, script=user_script(tmp_path), dashboard=dashboard.address)
        err = dashboard_dies_mid_run(p, dashboard)
    assert p.returncode == 1, err[-3000:]
    assert err.count("Traceback (most recent call last)") == 1 and ", in count" in err, err[-3000:]
    assert re.search(GONE, err, re.M), err[-3000:]
    assert re.search(r"^error: local rank [01] failed \(exit code 1\); stopped the other ranks$",
                     err.strip().splitlines()[-1]), err[-3000:]
    assert "a peer" not in err


@ONCE
def test_the_supervisor_blames_the_rank_with_the_traceback_over_the_one_that_named_it():
    """Spawn's and the drivers' supervisor (stand-in ranks: sh): rank 0 exits first with a line naming rank 1's
    failure, rank 1 then with its traceback (its own error): rank 1 is the one to blame, whose traceback the user
    gets."""
    ranks = Ranks([subprocess.Popen(["sh", "-c", s]) for s in ("exit 1", "sleep 0.5; exit 1")])
    assert ranks.supervise(poll=0.05, named=lambda r: r == 0) == 1 and ranks.codes() == [1, 1]


# ---------------------------------------------------------------- item: a killed peer is named


@RANKS
@pytest.mark.parametrize("killed", [1, 0])
def test_a_rank_killed_mid_step_is_named_by_the_survivor(data70, tmp_path, killed):
    """kill -9 of one rank of two mid-step: the survivor's one line names it (rank 1: its process is seen gone
    on this machine; rank 0: the store it held is gone), exit 1, no traceback."""
    job = ["--output-dir", tmp_path, "--world-size", "2", "--port", free_port()] + LONG
    procs = [start([data70, "--rank", r] + job) for r in range(2)]
    survivor = 1 - killed
    try:
        stepping(procs[0], step=3)
        procs[killed].kill()
        procs[killed].wait()
        _, err = finish(procs[survivor])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert procs[survivor].returncode == 1 and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank {} of 2 stopped: rank(s) {} failed (".format(
        survivor, killed)), err
    assert "continue with --resume auto" in lines[0]
    if survivor == 0:
        s = read_summary(tmp_path)
        assert s["status"] == "failed" and s["error"] == lines[0][len("error: "):]


# ---------------------------------------------------------------- item: held-back stderr written out when stopped


@RANKS
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_rank_stopped_at_the_rendezvous_writes_out_its_held_back_stderr(data70, tmp_path, sig):
    """Rank 0 of 2 (torchrun's variables, the other rank never started), c10d's log at INFO: while it waits its
    stderr is held back (a rendezvous that succeeds hides c10d's noise). Stopped there, as a supervisor, a driver
    or torchrun stops it (SIGTERM) or by Ctrl-C (SIGINT), it writes out what it held, once, and ends by the
    signal, without waiting out --dist-timeout."""
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCH_CPP_LOG_LEVEL": "INFO"}
    p = start([data70, "--output-dir", tmp_path] + LONG + ["--dist-timeout", "600"], env=env)
    try:
        read_lines(p, lambda lines: lines[-1].startswith("note: rank 0 of 2 waiting "), timeout=120)
        p.send_signal(sig)
        _, err = finish(p, timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -sig, (p.returncode, err[-3000:])
    held = [ln for ln in err.splitlines() if "[c10d] The client socket has connected to [" in ln]
    assert held and all(err.count(ln) == 1 for ln in held), err[-3000:]  # written out once (1.11 logs 2 sockets)
    assert "Traceback" not in err and "error:" not in err, err[-3000:]
