"""A stopped run loses at most a step: real signals to real runs (trainer/job/stop.py). SIGTERM in the middle of
an epoch saves a mid-epoch checkpoint, and --resume auto ends exactly as the uninterrupted run (every step's loss,
Acc@1, the weights): one process, with and without data workers, and after a resolution change; a model with
dropout (its step draws from torch's RNG, which no loader moves), mid-epoch and killed after an epoch; a second
signal while the stop writes its checkpoint; SIGTERM in a validation, the last epoch's too (saved first, the
validation run by the resumed run); a kill -9 under --save-every; 2 spawned ranks and a torchrun worker (make
test-ranks); --amp on the NPU double (make test-npu). The summary names the signal and the step, the lock is
released. (The Slurm lane's requeue: tests/test_slurm.py.)"""
import fcntl
import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch

import main as entry
from tools._faults import waits_in_open
from trainer.record.observe import LOSSES, read_losses

from conftest import (ONCE, PY, RANKS, ROOT, SMALL, STACK, child_env, finish, read_checkpoint, read_lines, read_metrics,
                      read_summary)
from conftest import DOUBLE, assert_call_error, dataset, run_main, trained
from test_npu_double import fake_env
from test_rendezvous import last_rank

# the signals clusters stop runs with: an outside client's (make test-clients; the ranks' and the double's runs stay
# in their lanes)
pytestmark = [STACK, pytest.mark.timeout(300), pytest.mark.clients]

TINY = ["-a", "tiny_cnn", "-b", "16", "--lr", "0.1", "--epochs", "2", "--device", "cpu", "--seed", "5"] + \
    SMALL[:-2] + ["-p", "1"]


def stopped_at(data, out, args, sig, at, env=None):
    """main.py on ``data`` into ``out``, sent ``sig`` once its log shows the step ``at`` ("1][ 5"); returns the
    finished process's (code, stdout lines, stderr)."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(data), "--output-dir", str(out)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(**(env or {})),
                            cwd=ROOT)
    lines = read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [{}/".format(at)), timeout=240)
    proc.send_signal(sig)
    out_text, err = finish(proc, timeout=240)
    return proc.returncode, lines + out_text.splitlines(), err


def spawned_ranks(supervisor):
    """The pids of spawn's ranks under ``supervisor``, rank 0 first (started in turn; not its resource tracker)."""
    with open("/proc/{0}/task/{0}/children".format(supervisor)) as f:
        children = [int(p) for p in f.read().split()]
    ranks = []
    for pid in children:
        with open("/proc/{}/cmdline".format(pid), "rb") as f:
            if b"spawn_main" in f.read():
                ranks.append(pid)
    return sorted(ranks)


def signalled_while_building(data, out, args, sig, ranks=1):
    """main.py on ``data`` into ``out``, its ``ranks`` process(es) set up (their handlers installed, each has logged
    its cpu binding line) and building the run: the first held (SIGSTOP), ``sig`` to the last, then the first let
    go. Returns the finished process's (code, stdout, stderr)."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(data), "--output-dir", str(out)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        read_lines(proc, lambda lines: sum("=> cpu binding" in line for line in lines) >= ranks, timeout=240)
        pids = spawned_ranks(proc.pid) if ranks > 1 else [proc.pid]
        os.kill(pids[0], signal.SIGSTOP)
        try:
            os.kill(pids[-1], sig)
            time.sleep(1.0)
        finally:
            os.kill(pids[0], signal.SIGCONT)
        out_text, err = finish(proc, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out_text, err


def assert_stopped_before_training(out_dir, code, out, err, sig):
    """The run ended by ``sig`` before its first step: 128 + its number, nothing trained, nothing saved, its summary
    ``interrupted`` at global step 0, its lock released."""
    assert code == 128 + sig, err[-3000:]
    assert "=> {}: stopped at epoch 0 step 0 of 25 (global step 0); no checkpoint yet".format(sig.name) in out, \
        out[-3000:]
    assert not [line for line in out.splitlines() if line.startswith("Epoch: [")], "a step was trained"
    summary = read_summary(out_dir)
    assert summary["status"] == "interrupted" and summary["stopped"]["global_step"] == 0, summary
    assert not os.path.exists(os.path.join(str(out_dir), "run.lock"))


def per_step(out):
    """(global step, loss) of every step of a run, and its last epoch's Acc@1, from metrics.jsonl."""
    records = read_metrics(out)
    return [tuple(p) for r in records for p in r["step_losses"]], records[-1]["val_acc1"]


def same_weights(a, b):
    wa, wb = read_checkpoint(a)["state_dict"], read_checkpoint(b)["state_dict"]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def whole(shapes, tmp_path_factory):
    """The uninterrupted run (one process, no data workers): its folder."""
    out = tmp_path_factory.mktemp("whole")
    trained(shapes, out, TINY + ["-j", "0"])
    return out


def assert_resumes_exactly(data, out, args, stop, reference, steps=25, env=None):
    """``--resume auto`` in ``out`` (stopped at ``stop``, summary.json's "stopped") continues at the next step and
    ends as the ``reference`` run (two epochs of ``steps``): every step's loss, the last Acc@1, the weights."""
    resumed = run_main([str(data), "--output-dir", str(out)] + args + ["--resume", "auto"], env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "=> continuing epoch {} at step {} of {}".format(stop["epoch"], stop["step"], steps) in resumed.stdout
    first = [line for line in resumed.stdout.splitlines() if line.startswith("Epoch: ")][0]
    assert re.match(r"Epoch: \[{}\]\[\s*{}/{}\]".format(stop["epoch"], stop["step"] + 1, steps), first), first
    summary = read_summary(out)
    assert summary["status"] == "ok" and summary["resumed"]["global_step"] == stop["global_step"]
    assert summary["trained_steps"] == 2 * steps - stop["global_step"]  # no step trained twice
    mine, theirs = per_step(out), per_step(reference)
    assert len(theirs[0]) == 2 * steps and mine == theirs
    # step_losses.csv: every step once (what the stopped run wrote past its checkpoint was dropped), as the reference
    rows = read_losses(os.path.join(str(out), LOSSES))
    assert [s for s, _ in rows] == list(range(1, 2 * steps + 1)), rows
    assert rows == read_losses(os.path.join(str(reference), LOSSES))
    assert same_weights(reference, out)
    return summary


@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigterm_mid_epoch_then_resume_auto_equals_the_uninterrupted_run(shapes, tmp_path, whole, workers):
    """Also with 2 data workers against the run without: the crops are (seed, epoch, sample)'s."""
    args = TINY + ["-j", workers]
    code, lines, err = stopped_at(shapes, tmp_path, args, signal.SIGTERM, "1][ 5")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    summary = read_summary(tmp_path)
    stop = summary["stopped"]
    assert summary["status"] == "interrupted" and stop["signal"] == "SIGTERM" and stop["epoch"] == 1, summary
    assert 5 <= stop["step"] < 25 and "SIGTERM" in summary["error"], summary
    assert err.strip().splitlines()[-1].startswith("interrupted by SIGTERM at global step {}".format(
        stop["global_step"])), err
    assert not os.path.exists(str(tmp_path / "run.lock"))
    mid = read_checkpoint(tmp_path)["mid_epoch"]
    assert (mid["epoch"], mid["step"], mid["signal"]) == (1, stop["step"], "SIGTERM")
    summary = assert_resumes_exactly(shapes, tmp_path, args, stop, whole)
    assert summary["steps_redone"] == 0


DROPOUT = [a if a != "tiny_cnn" else "tiny_cnn_dropout" for a in TINY]  # a step that draws from torch's RNG


@pytest.fixture(scope="module")
def whole_dropout(shapes, tmp_path_factory):
    """The uninterrupted run of the model with dropout (one process, 2 persistent data workers, whose loader's
    iterator is made once): its folder."""
    out = tmp_path_factory.mktemp("whole_dropout")
    trained(shapes, out, DROPOUT + ["-j", "2"])
    return out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_model_with_dropout_stopped_mid_epoch_resumes_exactly(shapes, tmp_path, whole_dropout, workers):
    """Dropout draws from torch's generator at every step: the checkpoint's state, restored, is the one the step
    after the stop drew from in the uninterrupted run (no loader draws from it, with or without data workers: the
    run without ends as the one with)."""
    args = DROPOUT + ["-j", workers]
    code, _, err = stopped_at(shapes, tmp_path, args, signal.SIGTERM, "1][ 5")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stop = read_summary(tmp_path)["stopped"]
    assert stop["signal"] == "SIGTERM" and stop["epoch"] == 1 and 5 <= stop["step"] < 25, stop
    assert_resumes_exactly(shapes, tmp_path, args, stop, whole_dropout)


def test_a_model_with_dropout_killed_after_an_epoch_resumes_exactly(shapes, tmp_path, whole_dropout):
    """kill -9 once epoch 1 has begun (epoch 0's checkpoint written), with 2 persistent data workers: --resume auto
    trains epoch 1 from its start, drawing what the uninterrupted run drew, and ends as it."""
    args = DROPOUT + ["-j", "2"]
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [1]"), timeout=240)
    proc.kill()
    finish(proc, timeout=240)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt["epoch"] == 1 and "mid_epoch" not in ckpt
    resumed = run_main([str(shapes), "--output-dir", str(tmp_path)] + args + ["--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "' at epoch 1 (best Acc@1 " in resumed.stdout and "=> continuing epoch" not in resumed.stdout
    summary = read_summary(tmp_path)
    assert summary["status"] == "ok" and summary["trained_steps"] == 25, summary
    mine, theirs = per_step(tmp_path), per_step(whole_dropout)
    assert len(theirs[0]) == 50 and mine == theirs
    assert same_weights(whole_dropout, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_a_signal_to_the_whole_process_group_stops_at_a_step_and_resumes_exactly(shapes, tmp_path, whole, sig):
    """Slurm's warning without B: (sbatch --signal=USR1@N), and its SIGTERM at the time limit, reach every process
    of the step, the data workers too: they leave it to their rank, which stops at its step boundary and saves."""
    args = TINY + ["-j", "2"]
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT,
                            start_new_session=True)
    read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [1][ 5/"), timeout=240)
    os.killpg(proc.pid, sig)
    _, err = finish(proc, timeout=240)
    assert proc.returncode == 128 + sig, err[-3000:]
    stop = read_summary(tmp_path)["stopped"]
    assert stop["signal"] == sig.name and stop["epoch"] == 1, stop
    assert_resumes_exactly(shapes, tmp_path, args, stop, whole)


def test_a_second_signal_while_the_stop_writes_its_checkpoint_does_not_lose_it(shapes, tmp_path, whole):
    """Slurm's warning, then SIGTERM while the stop writes its mid-epoch checkpoint: the write is held in the open
    of its temporary file (a FIFO of that name waits for a reader), the FIFO is removed and SIGTERM sent there. The
    signal is recorded, not acted on: the open goes on into a file, the checkpoint and summary are whole, the run
    exits as the warning asked (138), and --resume auto ends as the uninterrupted run."""
    args = TINY + ["-j", "0"]
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        lines = read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [1][ 5/"), timeout=240)
        fifo = str(tmp_path / ".checkpoint.pth.tar.tmp-{}".format(proc.pid))  # checkpoint.atomic_write's
        os.mkfifo(fifo)
        proc.send_signal(signal.SIGUSR1)
        lines += read_lines(proc, lambda lines: ": stopped at epoch 1 step" in lines[-1], timeout=240)
        deadline = time.monotonic() + 240
        while not waits_in_open(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the stop's write did not reach its open"
            time.sleep(0.01)
        os.remove(fifo)
        proc.send_signal(signal.SIGTERM)
        out, err = finish(proc, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += out.splitlines()
    assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
    assert "=> SIGTERM while the run stopped: recorded, the checkpoint and summary were written whole" in lines
    summary = read_summary(tmp_path)
    stop = summary["stopped"]
    assert summary["status"] == "interrupted" and stop["signal"] == "SIGUSR1" and stop["epoch"] == 1, summary
    mid = read_checkpoint(tmp_path)["mid_epoch"]
    assert (mid["epoch"], mid["step"], mid["signal"]) == (1, stop["step"], "SIGUSR1")
    assert not [name for name in os.listdir(str(tmp_path)) if ".tmp-" in name]
    assert_resumes_exactly(shapes, tmp_path, args, stop, whole)


@pytest.fixture(scope="module")
def long_val(tmp_path_factory):
    """shapes' 400 training images (25 steps of 16) and 2400 validation images: 150 validation batches."""
    return dataset(tmp_path_factory, "longval", 10, 40, 240, seed=0)


@pytest.fixture(scope="module")
def whole_val(long_val, tmp_path_factory):
    """The uninterrupted run on ``long_val``: its folder."""
    out = tmp_path_factory.mktemp("whole_val")
    trained(long_val, out, TINY + ["-j", "0"])
    return out


def stopped_in_validation(data, out, args, epoch):
    """main.py on ``data`` into ``out``, sent SIGTERM once it prints a "Test: [" line of epoch ``epoch``'s
    validation. Its stdout is a pipe of one page: the run cannot be more than two pages of lines (about 90 of its
    150 "Test: [" lines) past the line read when the signal comes. Returns (code, stdout lines, the index of the line
    the signal followed, stderr)."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(data), "--output-dir", str(out)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        fcntl.fcntl(proc.stdout.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
        trained_it = "Epoch: [{}][".format(epoch)
        lines = read_lines(proc, lambda lines: lines[-1].startswith("Test: [") and any(
            line.startswith(trained_it) for line in lines), timeout=240)
        proc.send_signal(signal.SIGTERM)
        out_text, err = finish(proc, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, lines + out_text.splitlines(), len(lines) - 1, err


def assert_stops_in_validation_and_resumes_exactly(data, out, args, epoch, reference):
    """SIGTERM in epoch ``epoch``'s validation (of 2 epochs of 25 steps): the run stops within it (no Acc@1 line,
    no step after it), saves the epoch's checkpoint with its validation due, exits 143, ``interrupted``; --resume
    auto runs that validation first, trains on, and ends as ``reference``: every step's loss, every validation,
    best_acc1, the weights, model_best's."""
    code, lines, at, err = stopped_in_validation(data, out, args, epoch)
    assert code == 128 + signal.SIGTERM, (lines[-20:], err[-3000:])
    after = lines[at:]
    assert not [line for line in after if line.startswith((" *   Acc@1", "Epoch: ["))], after
    done = epoch + 1
    assert "=> SIGTERM: stopped at epoch {} step 0 of 25 (global step {}), before epoch {}'s validation; " \
           "checkpoint".format(done, 25 * done, epoch) in "\n".join(after), after[-5:]
    summary = read_summary(out)
    assert summary["status"] == "interrupted", summary
    assert summary["stopped"] == dict(signal="SIGTERM", epoch=done, step=0, global_step=25 * done,
                                      validation_due=True, checkpoint=os.path.join(str(out), "checkpoint.pth.tar")), \
        summary["stopped"]
    saved = read_checkpoint(out)
    assert saved["epoch"] == done and "mid_epoch" not in saved and saved["validation_due"]["signal"] == "SIGTERM"
    records = read_metrics(out) if os.path.exists(str(out / "metrics.jsonl")) else []
    assert [r["epoch"] for r in records] == list(range(epoch))  # the epoch's record waits for its validation
    resumed = run_main([str(data), "--output-dir", str(out)] + args + ["--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "=> validating epoch {} first: SIGTERM stopped the run before its validation".format(epoch) \
        in resumed.stdout, resumed.stdout[-3000:]
    trained_lines = [line for line in resumed.stdout.splitlines() if line.startswith("Epoch: [")]
    assert all(line.startswith("Epoch: [{}]".format(done)) for line in trained_lines), trained_lines[:3]
    mine, theirs = read_summary(out), read_summary(reference)
    assert mine["status"] == "ok" and mine["trained_steps"] == 25 * (2 - done), mine
    assert mine["best_acc1"] == theirs["best_acc1"] and mine["final_acc1"] == theirs["final_acc1"]
    assert per_step(out) == per_step(reference)
    validations = [[(r["epoch"], r["val_loss"], r["val_acc1"]) for r in read_metrics(f)] for f in (out, reference)]
    assert validations[0] == validations[1] and len(validations[0]) == 2
    assert same_weights(reference, out)
    best = [read_checkpoint(f, "model_best.pth.tar")["state_dict"] for f in (out, reference)]
    assert best[0].keys() == best[1].keys() and all(torch.equal(best[0][k], best[1][k]) for k in best[1])


def test_sigterm_during_validation_saves_first_and_the_resumed_run_validates(long_val, tmp_path, whole_val):
    """Before: the validation ran on, the epoch's checkpoint was written, a step of the next epoch trained, then
    the run stopped."""
    assert_stops_in_validation_and_resumes_exactly(long_val, tmp_path, TINY + ["-j", "0"], 0, whole_val)


def test_sigterm_during_the_last_epochs_validation_is_not_swallowed(long_val, tmp_path, whole_val):
    """Before: the last validation ran on and the run ended ``ok``, exit 0."""
    assert_stops_in_validation_and_resumes_exactly(long_val, tmp_path, TINY + ["-j", "0"], 1, whole_val)


@ONCE
def test_slurms_warning_during_start_up_stops_before_the_first_step(shapes, tmp_path):
    """SIGUSR1 (Slurm's warning) while one process builds its run, held there (SIGSTOP) once its handlers are
    installed: the warning is kept rather than ending the run, which stops before its first step, saved for a
    requeue (a requeued job warned while it starts does not end for good), and exits 138."""
    code, out, err = signalled_while_building(shapes, tmp_path, TINY + ["-j", "0"], signal.SIGUSR1)
    assert_stopped_before_training(tmp_path, code, out, err, signal.SIGUSR1)


@ONCE
def test_slurms_warning_before_main_pys_first_line_is_kept(shapes, tmp_path):
    """main.py started with SIGUSR1 blocked and already pending (a launcher that blocks it while it starts its
    processes, as spawn's supervisor does): main.py's first line takes the warning, which reaches the run's handlers;
    the run stops before its first step, saved for a requeue, and exits 138 (it neither trains on nor dies)."""
    block = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # noqa: E731
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + TINY +
                            ["-j", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=ROOT, preexec_fn=block)
    proc.send_signal(signal.SIGUSR1)
    out, err = finish(proc, timeout=240)
    assert_stopped_before_training(tmp_path, proc.returncode, out, err, signal.SIGUSR1)


@ONCE
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_ctrl_c_or_sigterm_before_main_pys_first_line_ends_the_run_before_it_begins(shapes, tmp_path, sig):
    """main.py started with SIGINT or SIGTERM blocked and pending, as a supervisor starts its ranks: the signal is
    kept from the first line and acted on once the run's handlers are installed. One process ends there: one line,
    128 + the signal, nothing trained or left behind. Before, the signal stayed blocked and the run trained on."""
    block = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # noqa: E731
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + TINY +
                            ["-j", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=ROOT, preexec_fn=block)
    proc.send_signal(sig)
    out, err = finish(proc, timeout=240)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert err.strip().splitlines()[-1] == "interrupted by {}: the run had not begun; nothing to save".format(
        sig.name), err[-3000:]
    assert "Traceback" not in err and not [ln for ln in out.splitlines() if ln.startswith("Epoch: [")], out[-3000:]
    assert not os.path.exists(os.path.join(str(tmp_path), "run.lock"))
    assert not os.path.exists(os.path.join(str(tmp_path), "checkpoint.pth.tar"))


AFTER_THE_RUN = """import os, runpy, signal, sys, time
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as end:
    code = end.code
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)
sys.exit(code)
"""


# SIGUSR1 as Python tears down this module at the exit, after it has put the handlers it set back to their defaults
AT_THE_EXIT = """import os, runpy, signal, sys, time
class Late:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.5)
late = Late()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@ONCE
@pytest.mark.parametrize("when", ["after_the_run", "at_the_exit"])
def test_slurms_warning_after_the_run_ended_leaves_its_exit_code(shapes, tmp_path, when):
    """SIGUSR1 once main.py's run has returned (Slurm's warning to a job that ends within its time), or during
    Python's exit: kept, or ignored, never SIGUSR1's default action, so the process exits 0 and its job is COMPLETED,
    not FAILED by signal 10 (the Slurm lane's time-limit job once ended so)."""
    script = AFTER_THE_RUN if when == "after_the_run" else AT_THE_EXIT
    proc = subprocess.run([PY, "-c", script, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir",
                           str(tmp_path)] + TINY + ["-j", "0", "--epochs", "1"], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_summary(tmp_path)["status"] == "ok"


@ONCE
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=["INT", "TERM", "USR1"])
def test_processes_started_while_the_stops_are_blocked_inherit_them_blocked(sig):
    """stop.stops_blocked, as spawn and the drivers start their ranks: a process started inside it has every stop
    signal blocked (one waits for the rank's hold_stops, and cannot end its interpreter while it starts); one kept
    before is delivered to the handler in force on leaving. Before, only SIGUSR1 was blocked and kept: Ctrl-C passed
    on to ranks still importing torch ended one (exit 1 or -2) and the others waited at the rendezvous."""
    from trainer.job import stop
    previous = {s: signal.getsignal(s) for s in stop.SIGNALS}
    seen = []
    try:
        stop.hold_stops()
        os.kill(os.getpid(), sig)  # kept, the process goes on
        time.sleep(0.1)
        signal.signal(sig, lambda signum, frame: seen.append(signum))
        probe = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
        with stop.stops_blocked():
            inside = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
        time.sleep(0.1)
        outside = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    blocked = lambda text: {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1} & set(json.loads(text))  # noqa: E731
    assert blocked(inside) == {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1} and not blocked(outside), \
        (inside, outside)
    assert seen == [sig] and stop.kept() is None


def test_kill_9_with_save_every_loses_at_most_the_interval(shapes, tmp_path, whole):
    """--save-every 0.002 (0.12 s, a few steps here): a run killed outright once it has saved in its second epoch
    continues from its last mid-epoch checkpoint, and ends as the uninterrupted run."""
    args = TINY + ["-j", "0", "--save-every", "0.002"]
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    saved = re.compile(r"=> --save-every: checkpoint at epoch (\d+) step (\d+) \(global step (\d+)\)")
    lines = read_lines(proc, lambda lines: any(saved.match(ln) and ln.split()[5] == "1" for ln in lines)
                       and lines[-1].startswith("Epoch: [1]"), timeout=240)
    proc.kill()
    lines = lines + finish(proc)[0].splitlines()  # what it printed before the kill landed
    last = [saved.match(ln) for ln in lines if saved.match(ln)][-1]
    mid = read_checkpoint(tmp_path)["mid_epoch"]  # the last save: the one printed, or one the kill cut short after
    stop = dict(epoch=mid["epoch"], step=mid["step"], global_step=25 * mid["epoch"] + mid["step"])  # its write
    assert int(last.group(3)) <= stop["global_step"] and not mid.get("signal"), (last.group(0), mid)
    trained_last = [ln for ln in lines if ln.startswith("Epoch: [")][-1]
    done = 25 + int(re.match(r"Epoch: \[1\]\[\s*(\d+)/", trained_last).group(1))
    assert 0 <= done - stop["global_step"] < 25, (stop, lines[-10:])  # the steps the kill took: since the last save
    assert read_summary(tmp_path)["last_saved"]["global_step"] <= stop["global_step"]
    summary = assert_resumes_exactly(shapes, tmp_path, args, stop, whole)
    assert summary["resumed"]["saved_for"] == "--save-every"


def test_a_stop_after_a_resolution_change_resumes_at_its_size(shapes, tmp_path):
    """32 px in epoch 0, 64 in epoch 1 (--min-res / --max-res): SIGTERM in epoch 1, and --resume auto continues at
    64 px, ending as the uninterrupted run."""
    at = TINY.index("--train-crop-size")
    args = TINY[:at] + TINY[at + 2:] + ["-j", "0", "--min-res", "32", "--max-res", "64", "--start-ramp", "0",
                                        "--end-ramp", "1"]
    trained(shapes, tmp_path / "whole", args)
    code, lines, err = stopped_at(shapes, tmp_path / "cut", args, signal.SIGTERM, "1][ 5")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "=> training resolution 64 from epoch 1" in lines
    stop = read_summary(tmp_path / "cut")["stopped"]
    assert stop["epoch"] == 1 and 5 <= stop["step"] < 25, stop
    assert_resumes_exactly(shapes, tmp_path / "cut", args, stop, tmp_path / "whole")
    assert read_summary(tmp_path / "cut")["train_resolutions"] == [{"from_epoch": 0, "size": 32},
                                                                    {"from_epoch": 1, "size": 64}]


@ONCE
@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_save_every_takes_minutes_above_zero(shapes, tmp_path, capsys, value):
    assert_call_error(entry.main, [shapes, "--output-dir", str(tmp_path), "--save-every", value], capsys,
                      "--save-every", value)
    assert not os.listdir(str(tmp_path))


# ---------------------------------------------------------------- several ranks (make test-ranks)

SPAWN = ["--multiprocessing-distributed", "--device-list", "0,1", "--port", "0", "--dist-timeout", "120", "-j", "0"]


@pytest.fixture(scope="module")
def whole_two(shapes, tmp_path_factory):
    """The uninterrupted job of 2 spawned ranks: its folder."""
    out = tmp_path_factory.mktemp("whole_two")
    trained(shapes, out, TINY + SPAWN)
    return out


@RANKS
def test_two_spawned_ranks_stop_at_one_step_and_resume_exactly(shapes, tmp_path, whole_two):
    """SIGTERM to spawn's supervisor: it passes the signal on, both ranks stop after the same step (agreed at a
    print step), rank 0 writes the mid-epoch checkpoint, and --resume auto ends as the uninterrupted job."""
    args = TINY + SPAWN
    code, lines, err = stopped_at(shapes, tmp_path, args, signal.SIGTERM, "1][ 5")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stop = read_summary(tmp_path)["stopped"]
    assert stop["signal"] == "SIGTERM" and stop["epoch"] == 1 and 5 <= stop["step"] < 25, stop
    assert read_checkpoint(tmp_path)["mid_epoch"]["step"] == stop["step"]
    checkpoint = str(tmp_path / "checkpoint.pth.tar")
    assert stop["checkpoint"] == checkpoint, stop
    # the supervisor's last line: what the ranks did, the step saved and the checkpoint that holds it
    line = "interrupted by SIGTERM: all 2 ranks stopped at epoch 1 step {} (global step {}); checkpoint '{}'; " \
        "continue with --resume auto".format(stop["step"], stop["global_step"], checkpoint)
    assert err.splitlines()[-1] == line, err[-3000:]
    assert not os.path.exists(str(tmp_path / "run.lock"))
    assert_resumes_exactly(shapes, tmp_path, args, stop, whole_two)


@RANKS
def test_a_sigterm_to_spawns_supervisor_while_the_ranks_start_claims_no_checkpoint(shapes, tmp_path):
    """SIGTERM to the supervisor once both ranks exist, before their run's handlers: the signal ends them as they
    start. Nothing was trained or saved, and the supervisor says so (143, no checkpoint named or claimed)."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path)] + TINY +
                            SPAWN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while len(spawned_ranks(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, err = finish(proc, timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    last = err.splitlines()[-1]
    assert last.startswith("interrupted by SIGTERM: ") and "no checkpoint" in last, err[-3000:]
    assert "checkpoints in" not in err and "checkpoint '" not in err, err[-3000:]
    assert not [line for line in out.splitlines() if line.startswith("Epoch: [")], "a step was trained"
    assert not os.path.exists(str(tmp_path / "checkpoint.pth.tar"))


@RANKS
def test_a_signal_to_one_rank_while_the_job_builds_stops_every_rank_before_training(shapes, tmp_path):
    """Rank 0 held (SIGSTOP) once both ranks are set up, SIGTERM to rank 1 alone while it builds the run: rank 1
    keeps the request rather than leaving (rank 0 would wait for it in a collective), the ranks agree on it before
    the first step, both save nothing and end 143, and the supervisor says so."""
    code, out, err = signalled_while_building(shapes, tmp_path, TINY + SPAWN, signal.SIGTERM, ranks=2)
    assert err.splitlines()[-1] == "interrupted by SIGTERM: all 2 ranks stopped at epoch 0 step 0 (global step 0); " \
        "no checkpoint yet (summary in '{}')".format(tmp_path), err[-3000:]
    assert_stopped_before_training(tmp_path, code, out, err, signal.SIGTERM)


@RANKS
def test_a_torchrun_worker_stopped_by_sigterm_is_restarted_and_resumes_exactly(shapes, tmp_path, whole_two):
    """SIGTERM to one worker of two under --max-restarts 1: the other learns it at the next print step, both save
    and exit 143, the agent restarts the group, and --resume auto ends as the uninterrupted job."""
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
           os.path.join(ROOT, "main.py"), str(shapes), "--output-dir", str(tmp_path), "--resume", "auto",
           "--dist-timeout", "120", "-j", "0"] + TINY
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=child_env())  # the threads of the uninterrupted job (its sums add alike)
    try:
        read_lines(proc, lambda lines: lines[-1].startswith("Epoch: [1][ 5/"), timeout=240)
        os.kill(last_rank(tmp_path), signal.SIGTERM)  # rank 1
        out, err = finish(proc, timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"=> SIGTERM: stopped at epoch 1 step (\d+) of 25", out), out[-3000:]
    assert "=> continuing epoch 1 at step" in out
    mine, theirs = per_step(tmp_path), per_step(whole_two)
    assert mine == theirs and same_weights(whole_two, tmp_path)


# ---------------------------------------------------------------- the NPU double (make test-npu)


@DOUBLE
@pytest.mark.usefixtures("npu_double")
def test_on_the_npu_double_with_amp_a_sigterm_then_resume_auto_equals_the_uninterrupted_run(shapes, tmp_path):
    """--device npu --amp on the torch_npu double (its GradScaler's state in the checkpoint): SIGTERM in epoch 1,
    then --resume auto, ends as the uninterrupted run."""
    args = [a if a != "cpu" else "npu" for a in TINY] + ["-j", "0", "--amp", "--max-steps-per-epoch", "10"]
    env = fake_env()
    whole = run_main([str(shapes), "--output-dir", str(tmp_path / "whole")] + args, env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    code, lines, err = stopped_at(shapes, tmp_path / "cut", args, signal.SIGTERM, "1][ 3", env=env)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stop = read_summary(tmp_path / "cut")["stopped"]
    assert stop["signal"] == "SIGTERM" and stop["epoch"] == 1 and 3 <= stop["step"] < 10, stop
    assert "scaler" in read_checkpoint(tmp_path / "cut")
    assert_resumes_exactly(shapes, tmp_path / "cut", args, stop, tmp_path / "whole", steps=10, env=env)
