"""The one stop path of a run: SIGINT (Ctrl-C), SIGTERM (Slurm's time limit, scancel, Kubernetes, torchrun's
agent, ``timeout``, ``docker stop``) and SIGUSR1 (Slurm's warning, ``sbatch --signal=B:USR1@120``) ask the run to
stop. In the training loop the request only sets a flag: the loop stops at a step boundary that every rank agrees
on, the run saves a mid-epoch checkpoint, writes its summary (status ``interrupted``, the signal and the step),
releases its lock, closes TensorBoard and exits with 128 + the signal's number. In a run of one process the first
SIGINT or SIGTERM outside the loop (building the run, validating, saving) raises ``Stopped`` at once, as Ctrl-C
always did; SIGUSR1, a warning that time runs out, is kept until the loop starts, which stops before its first
step (and requeues the job: a warning during a requeued job's start-up does not end it for good). A
run of several ranks never leaves on its own at the first signal, wherever it comes: each rank keeps the flag, and
the ranks agree on it before training starts and at the loop's print steps, so that none waits for a peer that left
(a rank that left in the middle of a step would leave its peers blocked in the step's collectives). A second signal
always raises at once.

Under Slurm a job that may be requeued is requeued (``scontrol requeue``) once its checkpoint is written: it
starts again and continues with --resume auto. Under torchrun a stopped worker exits non-zero, and the agent's
--max-restarts starts it again.
"""
import os
import signal
import subprocess
import time

WARNING = getattr(signal, "SIGUSR1", None)  # Slurm's warning signal: kept until the loop can act on it
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, WARNING) if s is not None)


class Stopped(KeyboardInterrupt):
    """A stop signal outside the training loop (or a second one): the run ends at once, as Ctrl-C ends it."""

    def __init__(self, signum):
        KeyboardInterrupt.__init__(self, signum)
        self.signum = signum


def name(signum):
    """SIGTERM, SIGUSR1, ... for a signal number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal {}".format(signum)


def exit_code(signum):
    """The exit code of a run stopped by ``signum``: 128 + its number (130 for SIGINT, 143 for SIGTERM), what
    shells, torchrun and Slurm read as "ended by that signal"."""
    return 128 + int(signum)


class StopRequest:
    """The signals' handler while a run trains. ``armed``: the loop checks ``signum`` at its step boundaries
    (else a signal raises Stopped); ``several``: the ranks of a job agree on the stop wherever the signal came, so
    a first signal never raises. ``install`` returns self; ``restore`` puts the previous handlers back."""

    REPEAT = 2.0  # seconds: the same signal again this soon is the one signal delivered twice (a terminal's
    # Ctrl-C reaches a rank, and its supervisor passes it on), not a second request

    def __init__(self):
        self.signum, self.armed, self.several, self._previous, self._at = None, False, False, {}, 0.0

    def install(self, several=False):
        self.several = several
        try:
            self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        except ValueError:  # not the main thread: the signals stay as they were
            self._previous = {}
        return self

    def ignore(self):
        """The run has stopped and its checkpoint is whole: later signals are ignored until ``restore``, so that
        none cuts its exit short (Slurm ends the processes of a job it requeues with SIGTERM, while rank 0 still
        waits for ``scontrol requeue`` or logs it)."""
        for s in self._previous:
            signal.signal(s, signal.SIG_IGN)

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame):
        if self.signum == signum and time.time() - self._at < self.REPEAT:
            return
        if self.signum is not None or not (self.armed or self.several or signum == WARNING):
            self.signum = self.signum or signum
            raise Stopped(signum)
        self.signum, self._at = signum, time.time()

    @property
    def asked(self):
        return self.signum is not None


def requeue(env=None, run=subprocess.run):
    """Under Slurm, requeue this job where it may be requeued (``Requeue=1`` in ``scontrol show job``: sbatch
    --requeue, or the cluster's JobRequeue default). Returns a line saying what was done, or None outside Slurm."""
    env = os.environ if env is None else env
    job = env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") and "{}_{}".format(
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) or env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        shown = run(["scontrol", "show", "job", job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    universal_newlines=True, timeout=30)
        if "Requeue=1" not in shown.stdout.split():
            return "Slurm job {} may not be requeued (sbatch --requeue): it ends here".format(job)
        done = run(["scontrol", "requeue", job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   universal_newlines=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return "Slurm job {} not requeued: {}".format(job, exc)
    if done.returncode != 0:
        return "Slurm job {} not requeued: scontrol requeue: {}".format(job, (done.stderr or "").strip()[:200])
    return "Slurm job {} requeued: it continues from the checkpoint with --resume auto".format(job)
