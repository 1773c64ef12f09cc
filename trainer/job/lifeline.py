"""A process ends with the one that started it (``PR_SET_PDEATHSIG``: Linux), also when that was killed (``kill
-9``, the OOM killer): spawn's and the drivers' ranks, every loader worker. Right after arming it the child checks
its parent is still the one that started it: one that died before sends nothing. DataLoader's own watchdog misses
that moment (a worker then waits without end: ``tests/test_lifeline.py`` shows it with torch's own loader).
"""
import ctypes
import functools
import os
import signal
import threading

from trainer.job.stop import WARNING

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig, parent_pid):
    """``sig`` ends this process when its parent ends, now if ``parent_pid`` (its starter) has ended already."""
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "prctl"):
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def _worker_init(parent_pid, worker_id):
    die_with_parent(signal.SIGKILL, parent_pid)  # a worker holds nothing to save
    # a stop request is its rank's: a worker ending at Ctrl-C or SIGUSR1 would fail the rank's loader first
    for sig in (signal.SIGINT, WARNING):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    _sigterm_only_from(parent_pid)


def _sigterm_only_from(parent_pid):
    """SIGTERM ends this process only when ``parent_pid`` sends it (not Slurm's to a whole step): a thread waits for
    it (``sigwaitinfo`` names the sender); every other thread blocks it."""
    if not hasattr(signal, "sigwaitinfo"):  # not Linux: SIGTERM keeps its course
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait():
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent_pid:
            pass
        os._exit(0)  # asked by its rank: a clean end (torch's SIGCHLD check of the workers blames any other)

    threading.Thread(target=wait, name="sigterm-from-parent", daemon=True).start()


def worker_init():
    """A DataLoader ``worker_init_fn`` for a loader this process iterates: each worker ends with this process."""
    return functools.partial(_worker_init, os.getpid())
