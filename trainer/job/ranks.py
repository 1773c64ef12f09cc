"""A node's rank processes: ``spawn`` (--multiprocessing-distributed) starts them, ``Ranks`` supervises them
(spawn's and the ModelZoo drivers'): waits, names the rank to blame, stops the others, passes Ctrl-C on."""
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

from trainer.guard import EXIT_DIVERGED
from trainer.job.launch import check_port_free, free_port
from trainer.job.lifeline import die_with_parent
from trainer.job.stop import SIGNALS, exit_code, hold_warning, name, warning_blocked


STOP_GRACE = 15.0  # seconds a rank is given to stop before it is killed
SIGNAL_GRACE = 120.0  # a stop signal passed on: the ranks' agreed step, and their mid-epoch checkpoint's write
# a signal reached the ranks but not their supervisor: the ranks agreed on the stop and each saved its part
STOPPED = tuple(exit_code(s) for s in SIGNALS)
# a rank stopped on its own and said why: the others meet the same condition and get STOP_GRACE to stop as well
ORDERLY = (2, EXIT_DIVERGED) + STOPPED


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGUSR1 reached the process that supervises the ranks."""

    def __init__(self, signum):
        Exception.__init__(self, signum)
        self.signum = signum
        self.exit_code = exit_code(signum)


def _on_signal(signum, frame):
    raise Interrupted(signum)


def _exit_code(proc):
    return proc.poll() if hasattr(proc, "poll") else proc.exitcode  # subprocess.Popen | multiprocessing.Process


class Ranks:
    """The rank processes of one job on this node (``spawn``'s or the drivers'). ``groups``: each rank leads its own
    process group (its loader workers included). Inside ``with ranks:`` a stop signal raises Interrupted."""

    def __init__(self, procs=(), groups=False):
        self.procs, self.groups, self._handlers = list(procs), groups, {}

    def __enter__(self):
        self._handlers = {s: signal.signal(s, _on_signal) for s in SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, h in self._handlers.items():
            signal.signal(s, h)
        return False

    def codes(self):
        return [_exit_code(p) for p in self.procs]

    def running(self):
        return any(c is None for c in self.codes())

    def failed(self, named=None):
        """The rank to blame, else None: a killed one first, then one that failed on its own (not ``named(rank)``)."""
        bad = [(r, c) for r, c in enumerate(self.codes()) if c not in (None, 0)]
        killed = [r for r, c in bad if c < 0]
        own = [r for r, c in bad if not (named is not None and c == 1 and named(r))]
        return (killed or own or [r for r, _ in bad] or [None])[0]

    def signal_all(self, sig):
        """``sig`` to each rank; SIGKILL to its whole group (a stop signal is the rank's: its workers serve on)."""
        for p in self.procs:
            if _exit_code(p) is None or (self.groups and sig == signal.SIGKILL):
                try:
                    (os.killpg if self.groups and sig == signal.SIGKILL else os.kill)(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _settle(self, seconds, poll):
        deadline = time.time() + seconds
        while self.running() and time.time() < deadline:
            time.sleep(poll)

    def stop(self, sig=signal.SIGTERM, poll=0.2, grace=None):
        """``sig`` to every rank still running, SIGKILL (to their groups too) after ``grace`` (STOP_GRACE) seconds."""
        self.signal_all(sig)
        self._settle(STOP_GRACE if grace is None else grace, poll)
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            (p.wait if hasattr(p, "wait") else p.join)()

    def supervise(self, poll=0.2, named=None):
        """Wait for every rank; once one failed, stop the others (after STOP_GRACE where it stopped ORDERLY or named
        its failure: the one that says why may not exit first). Returns the rank to blame, or None."""
        while self.running() and self.failed() is None:
            time.sleep(poll)
        blame = self.failed(named)
        if blame is not None and (self.codes()[blame] in ORDERLY or
                                  (named is not None and self.codes()[blame] == 1 and named(blame))):
            self._settle(STOP_GRACE, poll)
            blame = self.failed(named)
        if self.running():
            self.stop(poll=poll)
        return blame


def spawn(plan, worker):
    """--multiprocessing-distributed: one supervised ``worker`` per device; returns the job's exit code."""
    section = plan.launch
    ids, port = section.device_list, section.port  # ids: decided by the plan (launch.settle)
    nprocs = len(ids)
    if section.dist_url.startswith("env://") and section.node_rank == 0:
        if port == 0:
            port = free_port()
        else:
            check_port_free(port)
    child = plan.placed(device_list=tuple(ids), world_size=section.nodes * nprocs, procs_per_node=nprocs,
                        rank=section.node_rank * nprocs, port=port)
    ranks, trace_dir = Ranks(), tempfile.mkdtemp(prefix="ranks-")
    traces = [os.path.join(trace_dir, "rank{}.trace".format(i)) for i in range(nprocs)]
    try:
        with ranks:
            context = multiprocessing.get_context("spawn")
            with warning_blocked():  # a rank holds Slurm's warning from its first line
                for i in range(nprocs):
                    proc = context.Process(target=_spawn_entry, args=(i, child, worker, traces[i], os.getpid()),
                                           name="spawn rank {}".format(i))
                    proc.start()
                    ranks.procs.append(proc)
            r = ranks.supervise(named=lambda i: not _take_trace(traces[i]))  # exit 1 without a traceback
    except Interrupted as exc:
        # passed on (a terminal's Ctrl-C reached the ranks already, kill -INT did not): they stop at an agreed step
        ranks.stop(sig=exc.signum, grace=SIGNAL_GRACE)
        sys.stderr.write("interrupted: all ranks stopped; summary and checkpoints in '{}'; continue with "
                         "--resume auto\n".format(plan.run.output_dir))
        return exc.exit_code
    finally:
        if ranks.running():
            ranks.stop()
        traces = [_take_trace(f) for f in traces]
        shutil.rmtree(trace_dir, ignore_errors=True)
    if r is None:
        return 0
    code = ranks.codes()[r]
    if code in STOPPED:
        sys.stderr.write(stopped_line(code, plan.run.output_dir))
        return code
    if code in (2, EXIT_DIVERGED) or (code == 1 and not traces[r]):
        return code  # the rank printed its one-line error already (exit 1 without a traceback: a failure it named)
    sys.stderr.write(traces[r])
    how = "exit code {}".format(code) if code >= 0 else "signal {}".format(-code)
    sys.stderr.write("error: local rank {} failed ({}); stopped the other ranks\n".format(r, how))
    return 1


def stopped_line(code, output_dir):
    """The line of a job whose ranks a signal stopped (``code``: 128 + the signal) without their supervisor."""
    return "interrupted: {} stopped the ranks, all ranks stopped; summary and checkpoints in '{}'; continue with " \
           "--resume auto\n".format(name(code - 128), output_dir)


def _take_trace(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _spawn_entry(local_index, plan, worker, trace_path, supervisor):
    """A spawned rank: run ``worker``, exit with its code; a traceback goes to ``trace_path`` for the supervisor to
    print once (exit 1). The rank ends with its ``supervisor`` (a pid), also when that was killed."""
    hold_warning()
    die_with_parent(signal.SIGTERM, supervisor)  # SIGTERM ends a rank at once (ranks leave it unhandled)
    plan = plan.placed(local_rank=local_index, rank=plan.launch.rank + local_index)
    try:
        code = worker(plan)
    except KeyboardInterrupt:
        code = 130
    except Exception:
        with open(trace_path, "w") as f:
            f.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code or 0)
