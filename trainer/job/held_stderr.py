"""File descriptor 2 held back while torch's C++ side may write on it (the rendezvous), written out once however the
hold ends: as its owner decides, or at an exception, the process's exit or SIGINT/SIGTERM (a rank stopped while it
waits keeps its diagnostics, and ends by the signal: one kept while the process started ends it before the wait).
Used through rendezvous.quiet_stderr."""
import atexit
import contextlib
import ctypes
import os
import select
import signal
import sys
import tempfile
import threading
import time

from trainer.job import stop
from trainer.record import lock


class _Hold:
    def __init__(self):
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        self.released, self.drop = False, False

    def release(self, replay):
        """fd 2 back as it was, the held text written there if ``replay``; only the first call acts."""
        if self.released:
            return
        self.released = True
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        if replay:
            self.file.seek(0)
            text = self.file.read()
            while text:
                text = text[os.write(2, text):]
        self.file.close()


_HOLDS = []  # the holds in force, outermost first
_HOLDS_LOCK = threading.RLock()


def _release_all():
    """Every hold in force written out, innermost first (each into the one around it)."""
    with _HOLDS_LOCK:
        for hold in reversed(_HOLDS):
            hold.release(True)


atexit.register(_release_all)


def _end_by(sig):
    """End this process by ``sig``'s default action, from any thread (libc's ``signal``: Python's is main-only), its
    run's lock let go first (no ``finally`` runs)."""
    lock.release_held()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(int(sig), None)  # SIG_DFL
        os.kill(os.getpid(), sig)
        time.sleep(1.0)
    os._exit(128 + int(sig))


class _OnStop:
    """While stderr is held, SIGINT or SIGTERM write it out at once, then take their course. A thread told by
    ``signal.set_wakeup_fd`` does it: the main thread may be inside torch's wait (until --dist-timeout)."""

    def __init__(self):
        self.old, self.wakeup = {}, None
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        try:
            self.wakeup = signal.set_wakeup_fd(self.write)  # ValueError outside the main thread
            for sig in (signal.SIGINT, signal.SIGTERM):
                handler = signal.getsignal(sig)
                if handler not in (signal.SIG_IGN, None):
                    self.old[sig] = handler
                    signal.signal(sig, self._handler)
        except ValueError:
            self.close()
            raise
        self.thread = threading.Thread(target=self._watch, name="held-stderr", daemon=True)
        self.thread.start()
        for sig in stop.pending():  # one that came while the process started: it ends here, before the wait
            if sig in self.old and stop.keeping(self.old[sig]):
                self._write_out(sig)

    def _write_out(self, sig):
        """Held text out, then the end of the process where ``sig`` would end it (KeyboardInterrupt too, and a
        process that keeps its stop signals until its run's handlers: stopped while it waits for the others, it has
        nothing to save, and the others may never come)."""
        _release_all()
        if self.old[sig] in (signal.SIG_DFL, signal.default_int_handler) or stop.keeping(self.old[sig]):
            _end_by(sig)

    def _handler(self, sig, frame):  # the main thread, once Python runs again there
        self._write_out(sig)
        self.old[sig](sig, frame)

    def _watch(self):  # at once
        while True:
            select.select([self.read], [], [])
            for sig in bytearray(os.read(self.read, 64)):
                if sig == 0:
                    return
                if sig in self.old:
                    self._write_out(sig)

    def close(self):
        if self.wakeup is not None:
            signal.set_wakeup_fd(self.wakeup)
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        if getattr(self, "thread", None) is not None:
            os.write(self.write, b"\0")
            self.thread.join()
        os.close(self.read)
        os.close(self.write)


@contextlib.contextmanager
def hold(write_out, watch_signals=True):
    """fd 2 held while the block runs, written out after it if ``write_out`` and not ``.drop``; ``watch_signals``."""
    with _HOLDS_LOCK:
        held = _Hold()
        _HOLDS.append(held)
    on_stop = None
    if watch_signals and len(_HOLDS) == 1:
        with contextlib.suppress(ValueError):  # not the main thread: no signal handlers
            on_stop = _OnStop()
    try:
        yield held
    finally:
        with _HOLDS_LOCK:
            held.release(write_out and not held.drop)
            _HOLDS.remove(held)
        if on_stop is not None:
            on_stop.close()
