"""The stop path under seeded fault injection (tools/inject_faults.py): 12 injections of stop signals (one or two
of SIGINT, SIGTERM, SIGUSR1) into one-process runs, and 6 into spawn's, torchrun's and a ModelZoo driver's, at drawn
moments of every phase (start-up, building, a step, validation, a checkpoint's write, an epoch's end; -j 0 and -j 2),
each resumed with --resume auto and compared with the run that was not stopped: every outcome exact (the exit code,
every step's loss, every validation, Acc@1, the weights, no step trained twice, no lock or process left, no hang).
``make soak`` draws more."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ONCE, PY, RANKS, ROOT, STACK, assert_one_line_error, dataset
from tools import inject_faults
from tools._faults import child_env, into, run_args, start

# a stop signal to a real run, resumed: as tests/test_stop.py, what clusters do (make test-clients)
pytestmark = [STACK, pytest.mark.clients, pytest.mark.timeout(900)]

SEED, COUNT = 55, 12  # every phase twice, both worker counts, all three signals, four second signals
RANKS_SEED, RANKS_COUNT = 4, 6  # one of each phase; every launcher, all three signals, two pairs, mostly in epoch 0


@pytest.fixture(scope="module")
def faults_data(tmp_path_factory):
    """10 classes x 8 training (5 steps of 16 an epoch) and 2 validation images (2 batches) of 32 px."""
    return dataset(tmp_path_factory, "faults", 10, 8, 2, seed=0)


def test_seeded_stop_signals_in_every_phase_resume_exactly(faults_data, tmp_path, capsys):
    """Two injections at a time (each waits on its run's log lines, never on a fixed time, so that a loaded
    machine only moves where a signal lands); the references (-j 0, -j 2) made once."""
    out = tmp_path / "faults.json"
    code = inject_faults.main(["--work-dir", str(tmp_path), "--data", str(faults_data), "--seed", str(SEED), "-n",
                               str(COUNT), "--workers", "0", "2", "--jobs", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    with open(str(out)) as f:
        records = json.load(f)["injections"]
    assert len(records) == COUNT and {r["phase"] for r in records} == set(inject_faults.PHASES), printed
    assert {r["workers"] for r in records} == {0, 2}, printed
    assert {s for r in records for s in r["signals"]} == set(inject_faults.SIGNALS), printed
    assert sum(len(r["signals"]) == 2 for r in records) >= 2, printed
    bad = [line for line in printed.splitlines() if line.startswith("#") and "  exact  " not in line]
    assert not bad and code == 0, "\n".join(bad + printed.strip().splitlines()[-9:])


@ONCE  # on torch 2.1, spawn's SIGTERM at start-up once left rank 1 waiting out --dist-timeout (issue 55, open)
@RANKS
def test_seeded_stop_signals_to_spawn_torchrun_and_a_modelzoo_driver_resume_exactly(faults_data, tmp_path, capsys):
    """Six injections, one in each phase, into the other launchers: spawn's 2 ranks (a signal to its parent, as
    Ctrl-C and Kubernetes send it), torchrun's 2 workers (to the agent and every process it started, as Slurm sends
    it; the agent's own exit, 1 at its SignalException or killed by SIGUSR1, is allowed) and ModelZoo's
    test/train_full_1p.sh (to the driver, its rank's log followed in its file): every run resumes exactly."""
    out = tmp_path / "faults.json"
    code = inject_faults.main(["--work-dir", str(tmp_path), "--data", str(faults_data), "--seed", str(RANKS_SEED),
                               "-n", str(RANKS_COUNT), "--launchers", "spawn", "torchrun", "driver", "--workers", "0",
                               "--jobs", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    with open(str(out)) as f:
        records = json.load(f)["injections"]
    assert {r["phase"] for r in records} == set(inject_faults.PHASES), printed
    assert {r["launcher"] for r in records} == {"spawn", "torchrun", "driver"}, printed
    assert {s for r in records for s in r["signals"]} == set(inject_faults.SIGNALS), printed
    bad = [line for line in printed.splitlines() if line.startswith("#") and "  exact  " not in line]
    assert not bad and code == 0, "\n".join(bad + printed.strip().splitlines()[-9:])


@ONCE
def test_a_checkpoint_write_begun_before_it_is_held_is_a_missed_moment_not_a_failure(faults_data, tmp_path):
    """A loaded machine can read the epoch's first line after its checkpoint's write began: the harness finds the
    temporary file there, sends nothing, and inject_one starts the run again (up to inject_faults.TRIES runs)."""
    a = inject_faults.build_parser().parse_args(["--work-dir", str(tmp_path), "--data", str(faults_data),
                                                 "--epochs", "1"])
    out = str(tmp_path / "run")
    os.makedirs(out)
    child = start(into(run_args(a, "one", 0), out), out, out + ".err", child_env(1))
    try:
        with open(os.path.join(out, ".checkpoint.pth.tar.tmp-{}".format(child.proc.pid)), "w"):
            pass  # as the trainer's atomic write opens it
        inj = {"phase": "checkpoint", "epoch": 0, "delay": 0.0, "launcher": "one"}
        assert inject_faults.reach(child, inj, 5, out, child.started + 240) == inject_faults.MISSED
        assert not any("## SIG" in line for line in child.lines)
    finally:
        child.kill_all(signal.SIGKILL)
        child.finish(time.monotonic() + 60)


@ONCE
@pytest.mark.parametrize("args, fragment", [(["-n", "0"], "-n/--count"), (["--data", "missing"], "--data 'missing'"),
                                            (["--launchers", "srun"], "--launchers")])
def test_bad_input_is_one_line(tmp_path, args, fragment):
    proc = subprocess.run([PY, "-m", "tools.inject_faults", "--work-dir", str(tmp_path / "w")] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, fragment)
    assert not os.path.exists(str(tmp_path / "w" / "faults.json"))
