"""One writer per output folder: the run lock.

A training run holds ``<output-dir>/run.lock`` from its start to its end (the launching process: rank 0's
process, or the parent of ``--multiprocessing-distributed``'s ranks). The file names the holder: host, pid,
start time, command. A second run into the same folder is refused with one line naming the holder.

Liveness comes from a POSIX record lock (``fcntl.lockf``) on the file, not from the file's existence: the
kernel drops it when the holding process ends in any way (exit, crash, kill -9), and an NFS server drops a
dead client's locks when its lease expires (NFSv4; about 90 s after a power loss). So a lock file left by
a killed run is stale as soon as nothing holds its record lock, and the next run (``--resume auto``
included) takes it over with a note. What this relies on: the folder's filesystem supports POSIX record
locks coherently across the machines that share it (local disks, NFSv3 with lockd, NFSv4, Lustre mounted
with ``flock``, GPFS, CephFS). Where it does not (the lock call fails with ENOLCK / EOPNOTSUPP), the lock
falls back to the file's content: a holder on this host is checked by pid and process start time; a holder
on another host is trusted to be alive, and the message says to delete the file if it is not.

Once the folder is taken, the lock also lists what the run may write there (``record``): a run that dies
before its summary.json lists its files leaves that list for the next run, which moves those files aside with it
(trainer/record/folders.py).
"""
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


def _describe(info, path):
    if not info:
        return "another run (its lock file '{}' is being written)".format(path)
    return "the run of pid {} on host {} started {}".format(
        info.get("pid", "?"), info.get("host", "?"), info.get("started", "?"))


class RunLock:
    """``with RunLock(folder):`` holds the folder for this process; ``acquire()`` / ``release()`` otherwise.

    ``taken_over`` holds the description of a stale lock this run replaced (for a note), else None; ``previous``
    that lock's contents ({} if none).
    """

    def __init__(self, folder):
        self.folder = folder
        self.path = os.path.join(folder, LOCK)
        self.fd = None
        self.taken_over = None
        self.previous = {}
        self.info = None  # what the lock file says
        self._made_folder = False

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def acquire(self):
        try:
            if not os.path.isdir(self.folder):
                os.makedirs(self.folder, exist_ok=True)
                self._made_folder = True
            return self._acquire()
        except OSError as exc:
            raise UsageError("--output-dir '{}' cannot be written ({}): choose a folder you can write to".format(
                self.folder, exc.strerror or exc))

    def _acquire(self):
        for _ in range(20):  # retried when a holder removed the file between our open and our lock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = self._try_lock(fd)
            except BaseException:
                os.close(fd)
                raise
            if locked is False:
                info = _read(fd)
                os.close(fd)
                self._refuse(info)
            if not self._same_file(fd):
                os.close(fd)
                continue
            previous = _read(fd)
            if locked is None and previous and not self._stale_without_locks(previous):
                os.close(fd)
                self._refuse(previous)
            self.fd = fd
            if previous:
                self.taken_over, self.previous = _describe(previous, self.path), previous
            self._write_info()
            return self
        raise UsageError("--output-dir '{}': could not take its lock file '{}' (it keeps being replaced)".format(
            self.folder, self.path))

    def _try_lock(self, fd):
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

    def _same_file(self, fd):
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def _stale_without_locks(self, info):
        if info.get("host") == socket.gethostname():
            return not _alive_here(info)
        return False

    def _refuse(self, info):
        if self._made_folder:
            self._remove_made_folder()
        how = ("wait for it to finish or stop it" if info else "wait a moment")
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
        try:
            if self._same_file(self.fd):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        if self._made_folder:
            self._remove_made_folder()

    def _remove_made_folder(self):
        """A folder this lock created and nothing else filled is removed again (a refused run leaves none)."""
        try:
            os.rmdir(self.folder)
        except OSError:
            pass
        self._made_folder = False


def _read(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 65536).decode("utf-8", "replace").strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "started": "? (unreadable lock file)"}


def holder(folder):
    """The description of the live run holding ``folder``, or None (for launchers that would move the
    folder aside: they must not move a folder a run is writing)."""
    path = os.path.join(folder, LOCK)
    if fcntl is None or not os.path.isfile(path):
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return _describe(_read(fd), path)
            return None
        fcntl.lockf(fd, fcntl.LOCK_UN)  # (closing the fd would drop it too)
        return None
    finally:
        os.close(fd)
