"""A process ends with the one that started it (the kernel's ``PR_SET_PDEATHSIG``: Linux; elsewhere only the
check below).

Spawn's ranks end with their supervisor, the ModelZoo drivers' ranks with their driver, and every data-loader
worker with its rank, also when the parent was killed (``kill -9``, the out-of-memory killer) and could stop
nothing itself. Right after arming the signal, the child checks that its parent is still the one that started
it: a parent that died before that moment sends nothing.

DataLoader's own watchdog does not cover that moment: a worker whose rank dies before the worker has set the
watchdog up keeps waiting for work, without end (``tests/test_lifeline.py`` shows it with torch's own loader).
"""
import ctypes
import functools
import os
import signal
import threading

from trainer.job.stop import WARNING

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig, parent_pid):
    """The kernel sends ``sig`` to this process when its parent ends; if ``parent_pid`` (the process that
    started this one) has ended already, this process ends now, with ``sig``."""
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
    # a stop request is its rank's to act on (trainer/job/stop.py): a worker that ended at a terminal's Ctrl-C, at
    # Slurm's SIGUSR1 or at its SIGTERM to every process of a step would fail the rank's loader before the rank
    # has stopped
    for sig in (signal.SIGINT, WARNING):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)
    _sigterm_only_from(parent_pid)


def _sigterm_only_from(parent_pid):
    """SIGTERM ends this process when ``parent_pid`` sends it (a DataLoader ends its workers with it, and so does
    multiprocessing at the parent's exit), and is left to the parent when anyone else does (Slurm's SIGTERM to
    every process of a step at its time limit, a kill of the process group). A thread waits for it
    (``sigwaitinfo`` names the sender); the signal is blocked in every other thread of the process."""
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
