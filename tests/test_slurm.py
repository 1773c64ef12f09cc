"""Ranks started by a real Slurm (make test-slurm: tools/slurm_local.sh starts a private one-node Slurm first and
the lane exports its SLURM_CONF). Without that Slurm taking jobs these tests fail, they do not skip: the lane must
not pass without one, nor run on a cluster's Slurm (/etc/slurm/slurm.conf)."""
import os
import re
import shutil
import subprocess
import time

import pytest
import torch

from conftest import PY, ROOT, SMALL, STACK, dataset, finish, read_summary, run_main
from test_stop import per_step, same_weights

pytestmark = [STACK, pytest.mark.slurm, pytest.mark.timeout(400)]

STEP = ["-a", "tiny_cnn", "--epochs", "2", "-b", "8", "--lr", "0.1", "--momentum", "0.9", "--wd", "1e-4",
        "--seed", "11", "--device", "cpu", "--dist-timeout", "120"] + SMALL


@pytest.fixture(scope="module")
def slurm():
    for tool in ("srun", "sbatch", "sinfo"):
        assert shutil.which(tool), "{} is missing: run the lane with make test-slurm".format(tool)
    private = os.path.join(os.path.abspath(os.environ.get("SLURM_LOCAL_STATE", "/tmp/slurm-local")), "slurm.conf")
    assert os.environ.get("SLURM_CONF") == private, (
        "SLURM_CONF is {!r}, not tools/slurm_local.sh's {}: run the lane with make test-slurm, or export the line "
        "that tools/slurm_local.sh prints".format(os.environ.get("SLURM_CONF"), private))
    state = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30)
    assert state.returncode == 0 and any(s in state.stdout for s in ("idle", "mixed")), (
        "no Slurm node takes jobs (sinfo: {!r} {!r}): start one with tools/slurm_local.sh".format(
            state.stdout, state.stderr))
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PATH=os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture(scope="module")
def single(data70, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    proc = run_main([data70, "--output-dir", str(out)] + STEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def assert_same_as_single(out, single):
    s = read_summary(out)
    assert s["status"] == "ok" and s["world_size"] == 2 and s["per_device_batch_size"] == 4
    assert s["val_images"] == 70 and s["epochs_completed"] == 2
    a = torch.load(os.path.join(str(single), "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    b = torch.load(os.path.join(str(out), "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), k


def test_srun_two_tasks_train_as_one_job(slurm, data70, single, tmp_path):
    proc = subprocess.run(["srun", "-n", "2", "--kill-on-bad-exit=1", PY, os.path.join(ROOT, "main.py"), data70,
                           "--output-dir", str(tmp_path)] + STEP, env=slurm, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "2 process(es) | batch 4 per device, 8 global" in proc.stdout
    assert proc.stdout.count("Epoch: [1][") >= 1 and proc.stderr.strip() == "", proc.stderr[-2000:]
    assert_same_as_single(tmp_path, single)


def test_the_sbatch_example_runs(slurm, data70, single, tmp_path):
    """examples/slurm_one_node.sbatch as a user submits it (its 8 tasks and ResNet-50 overridden for this box)."""
    out = tmp_path / "run"
    proc = subprocess.run(["sbatch", "--wait", "--ntasks-per-node", "2", "--output", str(tmp_path / "job.out"),
                           os.path.join(ROOT, "examples", "slurm_one_node.sbatch"), data70, str(out)] + STEP,
                          env=slurm, cwd=ROOT, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, (proc.stderr[-2000:], log[-3000:])
    assert "=> no checkpoint in '{}' to resume: starting a new run".format(out) in log
    assert_same_as_single(out, single)


@pytest.fixture(scope="module")
def long_data(tmp_path_factory):
    """6400 training images: one epoch of 400 steps at -b 16 (LONG), each a fifth of a second on one thread here."""
    return dataset(tmp_path_factory, "long", 10, 640, 2, seed=3)


# One epoch at 224-pixel crops of 32-pixel images: about 80 s here on one thread (OMP_NUM_THREADS=1, the slurm
# fixture's), well past the job's one-minute time limit
LONG = ["-a", "tiny_cnn", "--epochs", "1", "-b", "16", "--lr", "0.1", "--seed", "11", "--device", "cpu",
        "--train-crop-size", "224", "--val-resize-size", "32", "--val-crop-size", "32", "-j", "0", "-p", "1"]


@pytest.mark.timeout(480)
def test_a_job_that_outlasts_its_time_limit_is_warned_requeued_and_ends_as_the_uninterrupted_run(
        slurm, long_data, tmp_path):
    """docs/DISTRIBUTED.md's one-process command: ``sbatch --signal=B:USR1@N --requeue --wrap "exec python3 main.py
    ... --resume auto"``, with a one-minute --time that the run outlasts. Slurm itself sends the warning (its time
    limit check, every 30 s, sends it once at most N + 30 s remain: N = 10 gives the run 20 s or more to start); the
    run stops after its step, saves, requeues its job and exits; Slurm starts the job again (tools/slurm_local.sh's
    cred_expire and sched_interval: seconds later), and --resume auto goes on at the next step, as many times as
    the limit cuts the run. The job ends ``ok`` with the per-step losses, Acc@1 and weights of the run that trained
    without Slurm (the same thread, concurrently)."""
    out, log, whole = tmp_path / "run", tmp_path / "job.out", tmp_path / "whole"
    cmd = "exec python3 main.py {} --output-dir {} --resume auto {}".format(long_data, out, " ".join(LONG))
    sub = subprocess.run(["sbatch", "--parsable", "--time=1", "--signal=B:USR1@10", "--requeue", "--open-mode=append",
                          "--output", str(log), "--wrap", cmd], env=slurm, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    with open(str(tmp_path / "whole.out"), "w") as whole_out:
        reference = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), long_data, "--output-dir", str(whole)] + LONG,
                                     env=slurm, cwd=ROOT, stdout=whole_out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 400
        while subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True,
                             timeout=30).stdout.strip():
            assert time.time() < deadline, log.read_text()[-3000:] if log.exists() else "no job output"
            time.sleep(1)
        finish(reference, timeout=max(30, deadline - time.time()))
    finally:
        subprocess.run(["scancel", job], env=slurm, timeout=30)
        if reference.poll() is None:
            reference.kill()
    assert reference.returncode == 0, (tmp_path / "whole.out").read_text()[-3000:]
    text = log.read_text()
    shown = subprocess.run(["scontrol", "show", "job", job], env=slurm, capture_output=True, text=True,
                           timeout=30).stdout.split()
    stops = re.findall(r"^=> (SIG\w+): stopped at epoch (\d+) step (\d+) of 400 ", text, re.M)
    goes_on = re.findall(r"^=> continuing epoch (\d+) at step (\d+) of 400 \(a mid-epoch checkpoint, saved for "
                         r"(SIG\w+)\)$", text, re.M)
    assert stops and {s[0] for s in stops} == {"SIGUSR1"}, text[-3000:]  # Slurm's warning, never its time limit
    assert text.count("=> Slurm job {} requeued".format(job)) == len(stops), text[-3000:]
    facts = [w for w in shown if w.split("=")[0] in ("JobState", "Restarts", "ExitCode", "Reason", "RunTime")]
    lines = "\n".join(line for line in text.splitlines() if not line.startswith(("Epoch: ", "Test: ")))[-3000:]
    assert "Restarts={}".format(len(stops)) in shown and "JobState=COMPLETED" in shown, (facts, lines)
    assert goes_on == [(e, s, sig) for sig, e, s in stops], (stops, goes_on)  # each goes on at its step: none redone
    assert [int(s[2]) for s in stops] == sorted(int(s[2]) for s in stops), stops  # a warning at start-up: the same step
    assert "Traceback" not in text, text[text.index("Traceback"):][:3000]
    s = read_summary(out)
    assert s["status"] == "ok" and s["epochs_completed"] == 1 and s["steps_redone"] == 0
    assert s["resumed"] == dict(epoch=0, step=int(stops[-1][2]), global_step=int(stops[-1][2]), saved_for="SIGUSR1")
    mine, theirs = per_step(out), per_step(whole)
    assert len(theirs[0]) == 400 and mine == theirs
    assert same_weights(whole, out)


def test_scancel_of_a_requeueable_job_saves_and_ends_it(slurm, long_data, tmp_path):
    """``scancel`` of an ``sbatch --requeue`` job: its SIGTERM stops the run at a step, which saves, says it is not
    requeued, and ends; Slurm does not start the job again (only the warning, SIGUSR1, requeues: the test above)."""
    out, log = tmp_path / "run", tmp_path / "job.out"
    cmd = "exec python3 main.py {} --output-dir {} --resume auto {}".format(long_data, out, " ".join(LONG))
    sub = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", "--output", str(log), "--wrap",
                          cmd], env=slurm, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        deadline = time.time() + 300
        while not (log.exists() and "Epoch: [0][" in log.read_text()):
            assert time.time() < deadline, log.read_text()[-3000:] if log.exists() else "no job output"
            time.sleep(0.5)
        assert subprocess.run(["scancel", job], env=slurm, timeout=30).returncode == 0
        while subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True,
                             timeout=30).stdout.strip():
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        # a requeue (scontrol requeue, before the run exits) would have put the job back in the queue: it is gone
        queued = subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run(["scancel", job], env=slurm, timeout=30)
    text = log.read_text()
    shown = subprocess.run(["scontrol", "show", "job", job], env=slurm, capture_output=True, text=True,
                           timeout=30).stdout.split()
    facts = [w for w in shown if w.split("=")[0] in ("JobState", "Restarts", "ExitCode", "Reason", "RunTime")]
    assert queued.stdout.strip() == "" and "Restarts=0" in shown, (facts, text[-3000:])
    stops = re.findall(r"^=> (SIG\w+): stopped at epoch 0 step (\d+) of 400 ", text, re.M)
    assert [s[0] for s in stops] == ["SIGTERM"], text[-3000:]
    assert "=> Slurm job {} not requeued: SIGTERM ends it".format(job) in text, text[-3000:]
    s = read_summary(out)
    assert s["status"] == "interrupted" and s["stopped"]["signal"] == "SIGTERM", s
    assert s["stopped"]["step"] == int(stops[0][1]) and os.path.exists(os.path.join(str(out), "checkpoint.pth.tar"))
