"""One writer per --output-dir: ``run.lock``, held from start to end by a training run's launching process (rank
0's, or the parent of ``--multiprocessing-distributed``'s ranks); a second run into the folder is refused with one
line naming the holder, a stale lock file is taken over with a note (docs/DESIGN.md tells the rest).

Liveness is a POSIX record lock (``fcntl.lockf``), which the kernel drops however the holder ends (kill -9 included),
an NFS server when a dead client's lease expires (NFSv4; about 90 s after a power loss). It needs record locks
coherent across the machines sharing the folder (local disks, NFSv3 with lockd, NFSv4, Lustre mounted with
``flock``, GPFS, CephFS). Where the lock call fails (ENOLCK / EOPNOTSUPP), a holder on this host is checked by pid
and start time; one on another host is trusted to be alive, and the message says to delete the file if it is not.
"""
import contextlib
import errno
import json
import os
import socket
import sys
import time

try:
    import fcntl
except ImportError:  # not on Linux / macOS
    fcntl = None

from trainer.errors import UsageError

LOCK = "run.lock"
_HELD = []  # this process's locks: one that ends by a signal's default action (no finally runs) lets them go first
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP))
START, PARENT = 19, 1  # numbers of /proc/PID/stat after the command: start time (clock ticks since boot), parent pid


def proc_stat(pid, field=START):
    """Number ``field`` of a process's /proc/PID/stat (Linux), or None; its start time tells a reused pid apart."""
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            return int(f.read().rsplit(")", 1)[1].split()[field])
    except (OSError, ValueError, IndexError):
        return None


def _alive_here(info):
    """Whether the holder described by ``info`` (written on this host) still runs."""
    pid = info.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = proc_stat(pid)
    return start is None or info.get("proc_start") in (None, start)


def _try_lock(fd):
    """True: locked; False: another process holds it; None: this filesystem has no record locks."""
    if fcntl is None:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        if exc.errno in _UNSUPPORTED:
            return None
        raise


def _describe(info, path):
    if not info:
        return "another run (its lock file '{}' is being written)".format(path)
    return "the run of pid {} on host {} started {}".format(
        info.get("pid", "?"), info.get("host", "?"), info.get("started", "?"))


class RunLock:
    """``with RunLock(folder):``, or ``acquire()`` / ``release()``. ``taken_over``: the description of a stale lock
    replaced (for a note), else None; ``previous``: its contents ({} if none); ``info``: what the lock file says."""

    def __init__(self, folder):
        self.folder, self.path = folder, os.path.join(folder, LOCK)
        self.fd = self.taken_over = self.info = None
        self.previous, self._made_folder = {}, False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def acquire(self):
        try:
            if not os.path.isdir(self.folder):
                os.makedirs(self.folder, exist_ok=True)
                self._made_folder = True
            for _ in range(20):  # retried when a holder removed the file between our open and our lock
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    locked = _try_lock(fd)
                except BaseException:
                    os.close(fd)
                    raise
                if locked is not False and not self._same_file(fd):
                    os.close(fd)
                    continue
                previous = _read(fd)  # without record locks, its content says whether its holder still runs
                alive = previous and (previous.get("host") != socket.gethostname() or _alive_here(previous))
                if locked is False or (locked is None and alive):
                    os.close(fd)
                    self._refuse(previous)
                self.fd = fd
                if previous:
                    self.taken_over, self.previous = _describe(previous, self.path), previous
                self._write_info()
                _HELD.append(self)
                return self
        except OSError as exc:
            raise UsageError("--output-dir '{}' cannot be written ({}): choose a folder you can write to".format(
                self.folder, exc.strerror or exc))
        raise UsageError("--output-dir '{}': could not take its lock file '{}' (it keeps being replaced)".format(
            self.folder, self.path))

    def _same_file(self, fd):
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def _refuse(self, info):
        self._remove_made_folder()
        how = "wait for it to finish or stop it" if info else "wait a moment"
        hint = "" if info.get("host") in (None, socket.gethostname()) or fcntl is not None else (
            "; if it is no longer running (this filesystem has no record locks), delete the lock file")
        raise UsageError("--output-dir '{}' is in use by {}: {}, or choose another --output-dir{}".format(
            self.folder, _describe(info, self.path), how, hint))

    def record(self, files):
        """The lock lists ``files`` (paths relative to the folder) as what this run may write there."""
        self.info["files"] = sorted(files)
        self._write_info()

    def _write_info(self):
        if self.info is None:
            self.info = {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": proc_stat(os.getpid()),
                         "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv)[:500]}
        data = (json.dumps(self.info) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0) if hasattr(os, "pwrite") else os.write(self.fd, data)
        os.fsync(self.fd)

    def release(self):
        """Remove the lock file, then let the record lock go (in this order: a run waiting on it retries)."""
        if self.fd is None:
            return
        with contextlib.suppress(ValueError):
            _HELD.remove(self)
        with contextlib.suppress(OSError):
            if self._same_file(self.fd):
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = None
        self._remove_made_folder()

    def _remove_made_folder(self):
        """A folder this lock created and nothing else filled is removed again (a refused run leaves none)."""
        if self._made_folder:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)
        self._made_folder = False


def release_held():
    """Every lock this process holds, released: for a process about to end by a signal's default action (a rank
    stopped at the rendezvous), where no ``finally`` runs."""
    for held in list(_HELD):
        with contextlib.suppress(OSError):
            held.release()


def _read(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 65536).decode("utf-8", "replace").strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "started": "? (unreadable lock file)"}


def holder(folder):
    """The description of the live run holding ``folder``, or None (a launcher must not move it aside then)."""
    path = os.path.join(folder, LOCK)
    if fcntl is None or not os.path.isfile(path):
        return None
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            return _describe(_read(fd), path) if _try_lock(fd) is False else None  # (closing the fd drops our lock)
        finally:
            os.close(fd)
    except OSError:
        return None
