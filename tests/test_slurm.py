"""Ranks started by a real Slurm (make test-slurm: tools/slurm_local.sh starts a private one-node Slurm first and
the lane exports its SLURM_CONF). Without that Slurm taking jobs these tests fail, they do not skip: the lane must
not pass without one, nor run on a cluster's Slurm (/etc/slurm/slurm.conf)."""
import os
import shutil
import subprocess
import time

import pytest
import torch

from conftest import PY, ROOT, SMALL, read_summary, run_main

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

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


def test_a_requeueable_job_warned_with_usr1_is_requeued_and_ends_as_the_uninterrupted_run(slurm, shapes, tmp_path):
    """sbatch --requeue of one process that the batch shell execs; Slurm's warning signal delivered with
    ``scancel --signal=USR1 --batch`` (what --signal=B:USR1@N sends at its time: the local Slurm's minutes and its
    once-a-minute check of the time limit would make the lane wait minutes). The run saves a mid-epoch checkpoint,
    requeues its job (scontrol requeue) and exits 138; the job starts again, --resume auto continues at the next
    step, and it ends with the uninterrupted run's weights."""
    args = ["-a", "tiny_cnn", "--epochs", "1", "-b", "16", "--lr", "0.1", "--seed", "11", "--device", "cpu"] + \
        SMALL[:-2] + ["-p", "1"]
    whole = run_main([shapes, "--output-dir", str(tmp_path / "whole")] + args, env={"OMP_NUM_THREADS": "1"})
    assert whole.returncode == 0, whole.stderr[-3000:]
    out, log = tmp_path / "run", tmp_path / "job.out"
    cmd = "exec {} {} {} --output-dir {} --resume auto {}".format(PY, os.path.join(ROOT, "main.py"), shapes, out,
                                                                  " ".join(args))
    sub = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", "--output", str(log),
                          "--wrap", cmd], env=slurm, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    try:
        deadline = time.time() + 300
        while "Epoch: [0][ 3/" not in (log.read_text() if log.exists() else ""):
            assert time.time() < deadline, log.read_text()[-3000:] if log.exists() else "no job output"
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm, check=True, timeout=30)
        while subprocess.run(["squeue", "-h", "-j", job], env=slurm, capture_output=True, text=True,
                             timeout=30).stdout.strip():
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], env=slurm, timeout=30)
    text = log.read_text()
    assert "=> SIGUSR1: stopped at epoch 0 step" in text and "=> Slurm job {} requeued".format(job) in text, text
    assert "=> continuing epoch 0 at step" in text, text[-3000:]
    s = read_summary(out)
    assert s["status"] == "ok" and s["resumed"]["saved_for"] == "SIGUSR1" and s["steps_redone"] == 0
    a = torch.load(os.path.join(str(tmp_path / "whole"), "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    b = torch.load(os.path.join(str(out), "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
