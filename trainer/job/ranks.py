"""A node's rank processes: ``spawn`` (--multiprocessing-distributed) starts them, ``Ranks`` supervises them
(spawn's and the ModelZoo drivers'): waits, names the rank to blame, stops the others, passes Ctrl-C on, and says
what a stop did (``stop_report``: each rank's exit code, rank 0's summary.json and its checkpoint)."""
import contextlib
import json
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
from trainer.job.stop import SIGNALS, exit_code, hold_stops, name, stops_blocked


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


def _exit_code(proc):
    return proc.poll() if hasattr(proc, "poll") else proc.exitcode  # subprocess.Popen | multiprocessing.Process


class Ranks:
    """The rank processes of one job on this node (``spawn``'s or the drivers'). ``groups``: each rank leads its own
    process group (its loader workers included). Inside ``with ranks:`` a stop signal raises Interrupted, once every
    rank has started where they start inside ``with ranks.starting():``."""

    def __init__(self, procs=(), groups=False):
        self.procs, self.groups, self._handlers = list(procs), groups, {}
        self.killed, self.grace = set(), None  # the ranks ``stop`` killed once its ``grace`` (s) had passed
        self._held = None  # while the ranks start: None, else a list that keeps the signals

    def __enter__(self):
        self._handlers = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def _on_signal(self, signum, frame):
        if self._held is not None:
            self._held.append(signum)
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def starting(self):
        """A stop signal waits until the block has started its ranks: one raised inside a start would leave a rank
        that is not in ``procs`` (a spawned one without its arguments, EOFError), which nothing stops or reports."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
        if held:
            raise Interrupted(held[0])

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
        self.grace = STOP_GRACE if grace is None else grace
        self._settle(self.grace, poll)
        self.killed.update(r for r, c in enumerate(self.codes()) if c is None)
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
    ranks, trace_dir, since = Ranks(), tempfile.mkdtemp(prefix="ranks-"), time.time()
    traces = [os.path.join(trace_dir, "rank{}.trace".format(i)) for i in range(nprocs)]
    try:
        with ranks:
            context = multiprocessing.get_context("spawn")
            with ranks.starting(), stops_blocked():  # a rank keeps the stop signals from its first line
                for i in range(nprocs):
                    proc = context.Process(target=_spawn_entry, args=(i, child, worker, traces[i], os.getpid()),
                                           name="spawn rank {}".format(i))
                    proc.start()
                    ranks.procs.append(proc)
            r = ranks.supervise(named=lambda i: not _take_trace(traces[i]))  # exit 1 without a traceback
    except Interrupted as exc:
        # passed on (a terminal's Ctrl-C reached the ranks already, kill -INT did not): they stop at an agreed step
        ranks.stop(sig=exc.signum, grace=SIGNAL_GRACE)
        return _said(*stop_report(ranks, exc.signum, _summary_path(plan), since, _ids(child),
                                  section.node_rank == 0))
    finally:
        if ranks.running():
            ranks.stop()
        traces = [_take_trace(f) for f in traces]
        shutil.rmtree(trace_dir, ignore_errors=True)
    if r is None:
        return 0
    code = ranks.codes()[r]
    if code in STOPPED:  # the signal reached the ranks alone
        return _said(*stop_report(ranks, code - 128, _summary_path(plan), since, _ids(child),
                                  section.node_rank == 0))
    if code in (2, EXIT_DIVERGED) or (code == 1 and not traces[r]):
        return code  # the rank printed its one-line error already (exit 1 without a traceback: a failure it named)
    sys.stderr.write(traces[r])
    how = "exit code {}".format(code) if code >= 0 else "signal {}".format(-code)
    sys.stderr.write("error: local rank {} failed ({}); stopped the other ranks\n".format(r, how))
    return 1


def _ids(plan):
    return range(plan.launch.rank, plan.launch.rank + plan.launch.procs_per_node)


def _summary_path(plan):
    from trainer.record.files import EVAL_SUMMARY, SUMMARY
    return os.path.join(plan.run.output_dir, EVAL_SUMMARY if plan.run.evaluate else SUMMARY)


def _said(code, line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    return code


def stop_record(summary_path, since):
    """Rank 0's ``stopped`` record (signal, epoch, step, global_step, checkpoint) in ``summary_path`` if this job
    (started at ``since``) wrote it, else None."""
    try:
        if os.path.getmtime(summary_path) < since:
            return None  # an earlier run's
        with open(summary_path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    record = data.get("stopped") if isinstance(data, dict) and data.get("status") == "interrupted" else None
    return record if isinstance(record, dict) else None


def _did(code, killed, grace):
    """What a rank did at a stop, from its exit code (``killed``: after ``grace`` s)."""
    if code is not None and code - 128 in SIGNALS:
        return "stopped ({}, exit code {})".format(name(code - 128), code)
    if killed:
        return "killed after {:.0f} s: it had not stopped".format(grace)
    if code is not None and code < 0 and -code in SIGNALS:
        return "ended by {} as it started (its run had not begun)".format(name(-code))
    if code is not None and code < 0:
        return "killed by signal {}".format(-code)
    return "finished" if code == 0 else "failed (exit code {})".format(code)


def stop_report(ranks, signum, summary_path, since, rank_ids=None, holds_rank0=True):
    """(The job's exit code, its last line) after a stop by ``signum``, from what each rank did: its exit code, and
    rank 0's ``stopped`` record in ``summary_path`` written since ``since`` with the checkpoint it names.
    128 + the signal where every rank stopped (saved, or nothing to save: the signal ended it as it started) or the
    checkpoint was written; 1 where a rank failed or was killed before the stop was saved. ``rank_ids``: the
    global ranks of this node's processes; ``holds_rank0``: rank 0 (the summary's writer) runs on this node."""
    codes, folder = ranks.codes(), os.path.dirname(summary_path) or "."
    if codes and all(c == 0 for c in codes):  # it came after every rank had ended its run: nothing was stopped
        return 0, "note: {} came after every rank had finished: the run ended ok (summary in '{}')".format(
            name(signum), folder)
    rank_ids = list(range(len(codes)) if rank_ids is None else rank_ids)
    record = stop_record(summary_path, since) if holds_rank0 else None
    checkpoint = record.get("checkpoint") if record else None
    saved = bool(checkpoint) and os.path.exists(checkpoint)
    clean = all(c is not None and r not in ranks.killed and (c - 128 in SIGNALS or (c < 0 and -c in SIGNALS))
                for r, c in enumerate(codes))
    if all(c == exit_code(signum) for c in codes):
        what = "all {} ranks stopped".format(len(codes))
    else:
        what = ", ".join("rank {} {}".format(rank_ids[r], _did(c, r in ranks.killed, ranks.grace))
                         for r, c in enumerate(codes))
    if record:
        what += " at epoch {epoch} step {step} (global step {global_step})".format(**record)
    if saved:
        then = "checkpoint '{}'; continue with --resume auto".format(checkpoint)
    elif not holds_rank0:
        then = "rank 0's node holds the summary and any checkpoint; continue with --resume auto"
    elif record:
        then = "no checkpoint yet (summary in '{}')".format(folder)
    else:
        then = "no checkpoint written at this stop (rank 0's summary in '{}' records none)".format(folder)
    if clean or saved:
        return exit_code(signum), "interrupted by {}: {}; {}".format(name(signum), what, then)
    return 1, "error: {} did not stop every rank at a step: {}; {}".format(name(signum), what, then)


def _take_trace(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _spawn_entry(local_index, plan, worker, trace_path, supervisor):
    """A spawned rank: run ``worker``, exit with its code; a traceback goes to ``trace_path`` for the supervisor to
    print once (exit 1). The rank ends with its ``supervisor`` (a pid), also when that was killed."""
    hold_stops()
    die_with_parent(signal.SIGTERM, supervisor)  # a stop like any: kept while it starts, agreed on once it trains
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
