"""The one stop path of a run: SIGINT, SIGTERM and SIGUSR1 (Slurm's warning). In the training loop and in validation a
signal sets a flag: the run stops at a point every rank agrees on (a step boundary, a validation batch, an epoch's
end), saves first what it holds (the mid-epoch checkpoint, or the epoch's with its validation still due) and its
summary, and exits with 128 + the signal. In a one-process run a first SIGINT or SIGTERM outside the loops raises
``Stopped``; SIGUSR1 waits for the loop, which stops before its first step and requeues. Several ranks never leave
at a first signal (none may be left blocked in a collective): they agree on it before training, at print steps and
at an epoch's end. A second signal raises, but never while a checkpoint is written: from an agreed stop to the exit,
and during any checkpoint's write, signals are recorded (``later``); a second one during another write is acted on
once the write is whole. A requeueable Slurm job stopped by the warning is requeued once its checkpoint is written
(SIGTERM and SIGINT end it). Before the run's handlers (``hold_stops``: main.py's first line, a spawned rank's) a
stop signal is kept, never its default action: one process acts on it as they are installed; a rank's SIGINT or
SIGTERM ends it at the rendezvous (held_stderr), where no other rank waits for it (a second one ends it at once).
Once the run has ended (``StopRequest.end``: its summary says how) a stop signal is recorded, never acted on, and at
the exit all three are ignored: one then leaves the exit code as the run decided it.
"""
import atexit
import contextlib
import os
import signal
import subprocess
import time

WARNING = getattr(signal, "SIGUSR1", None)  # Slurm's warning signal: kept until the loop can act on it
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, WARNING) if s is not None)
_KEPT = []  # (signal, time) of the stop signals that came while no run's handler was installed
_ENDED = []  # a run has ended in this process (StopRequest.end): a stop signal after it is only kept
REPEAT = 2.0  # s: the same signal this soon is one delivered twice (Ctrl-C, and the supervisor passing it on)


def _keep(signum, frame):
    if _KEPT and signum != WARNING and not _ENDED and time.time() - _KEPT[0][1] >= REPEAT:
        raise Stopped(signum)  # a second SIGINT or SIGTERM while the process starts: it ends now
    _KEPT.append((signum, time.time()))


def _ignore_stops():
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def hold_stops():
    """From here on a stop signal outside a run's handlers is kept (``kept``), not the end of the process; unblocked
    if the process started with them blocked (``stops_blocked``: they waited there). At the exit (the last of its
    atexit calls) the stop signals are ignored: Python's exit puts the handlers it set back to their defaults while it
    tears down modules and torch, so a signal then would end a run that finished, or stopped, by the signal (Slurm:
    FAILED), not by the exit code it decided. (A teardown that hangs then needs SIGKILL, which the supervisors send
    after their grace.)"""
    del _ENDED[:]
    for s in SIGNALS:
        signal.signal(s, _keep)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))
    atexit.unregister(_ignore_stops)
    atexit.register(_ignore_stops)


def keeping(handler):
    """Whether ``handler`` is the one that keeps stop signals while a process starts (``hold_stops``)."""
    return handler is _keep


def pending():
    """The stop signals kept so far, in order (``kept`` forgets them)."""
    return [s for s, _ in _KEPT]


def kept():
    """The first stop signal kept since the last call (which forgets them), else None."""
    first = _KEPT[0][0] if _KEPT else None
    del _KEPT[:]
    return first


@contextlib.contextmanager
def stops_blocked():
    """The stop signals blocked while processes start (they inherit them blocked: a signal waits for their
    ``hold_stops``, and none can end a rank in its interpreter's start-up); then one kept before is delivered to the
    handler in force."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))
    first = kept()
    if first is not None:
        os.kill(os.getpid(), first)


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
    """128 + ``signum`` (130 for SIGINT, 143 for SIGTERM): what shells, torchrun and Slurm read as ended by it."""
    return 128 + int(signum)


class StopRequest:
    """The signals' handler while a run trains. ``armed``: the loops check ``signum`` at their safe points (else a
    signal raises Stopped); ``several``: the ranks agree on the stop, so a first signal never raises; ``agreed``:
    the stop the ranks agreed on, from which signals are only recorded (``later``) until the exit."""

    REPEAT = REPEAT

    def __init__(self):
        self.signum, self.armed, self.several, self._previous, self._at = None, False, False, {}, 0.0
        self.agreed, self.later, self._writing, self.ended = None, [], 0, False

    def install(self, several=False):
        self.several = several
        try:
            self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        except ValueError:  # not the main thread: the signals stay as they were
            self._previous = {}
        first = kept() if self._previous else None
        if first is not None:  # a signal while the process started: as if it came now
            self._on_signal(first, None)
        return self

    def end(self):
        """The run has ended (its summary is written, or is being written, as it ended): from here a stop signal is
        recorded, never acted on, so none turns a finished run into a stopped one."""
        self.ended, self.armed = True, False
        _ENDED.append(True)

    def agree(self, signum):
        """Every rank stops for ``signum``: from here the run saves and exits, and no signal cuts that short."""
        if self.signum is None:
            self.signum, self._at = signum, time.time()
        self.agreed = signum

    @contextlib.contextmanager
    def writing(self):
        """A checkpoint (and its summary) being written: a signal meanwhile is recorded, not acted on; a second one
        (``Stopped``) is raised once the write is whole, unless the stop is agreed (its exit follows anyway)."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if not self._writing and self.later and self.agreed is None:
            raise Stopped(self.later[-1])

    def ignore(self):
        """The checkpoint is whole: later signals are ignored until ``restore``, so none cuts the exit short (Slurm
        SIGTERMs a job it requeues while rank 0 still waits for ``scontrol requeue``)."""
        for s in self._previous:
            signal.signal(s, signal.SIG_IGN)

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame):
        if self.signum == signum and time.time() - self._at < self.REPEAT:
            return
        if self.agreed is not None or self._writing or self.ended:  # recorded: the write (an exit) goes on
            if self.signum is None:
                self.signum, self._at = signum, time.time()
            else:
                self.later.append(signum)
            return
        if self.signum is not None or not (self.armed or self.several or signum == WARNING):
            self.signum = self.signum or signum
            raise Stopped(signum)
        self.signum, self._at = signum, time.time()

    @property
    def asked(self):
        return self.signum is not None


def requeue(signum, env=None, run=subprocess.run):
    """After a stop by ``signum``: requeue this Slurm job where the signal is Slurm's warning and ``scontrol show job``
    says Requeue=1 (SIGTERM and SIGINT, as ``scancel`` sends, end it, as Lightning does); returns what was done, None
    outside Slurm."""
    env = os.environ if env is None else env
    job = env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") and "{}_{}".format(
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) or env.get("SLURM_JOB_ID")
    if not job:
        return None
    if signum != WARNING:
        return "Slurm job {} not requeued: {} ends it (only Slurm's warning, {}, requeues: sbatch --signal=B:{}@N " \
               "--requeue)".format(job, name(signum), name(WARNING), name(WARNING)[3:])
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    try:
        if "Requeue=1" not in run(["scontrol", "show", "job", job], **kw).stdout.split():
            return "Slurm job {} may not be requeued (sbatch --requeue): it ends here".format(job)
        done = run(["scontrol", "requeue", job], **kw)
    except (OSError, subprocess.SubprocessError) as exc:
        return "Slurm job {} not requeued: {}".format(job, exc)
    if done.returncode != 0:
        return "Slurm job {} not requeued: scontrol requeue: {}".format(job, (done.stderr or "").strip()[:200])
    return "Slurm job {} requeued: it continues from the checkpoint with --resume auto".format(job)
