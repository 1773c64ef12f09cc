"""Who writes --output-dir: one writer per folder, and one per node when the nodes do not share it.

A job's checkpoints and summary are written by global rank 0 into --output-dir. Several nodes often do not
share that folder: each has its own local disk (the Ascend guides save on every node's local rank 0). Then
the other nodes' folders would hold nothing, and ``--resume auto`` would resume node 0 at its last epoch
and start the others from scratch. So after the rendezvous, rank 0 leaves a token file in its folder; each
node's local rank 0 looks for it in its own --output-dir. A node that finds it shares rank 0's folder
(one writer, one lock, as on one node); a node that does not keeps its own copy: its local rank 0 takes
its folder's lock and writes the same checkpoints and summary there. Every rank then resumes from the
same epoch, or the job stops with one line before training (``check_same_epoch``).
"""
import dataclasses
import functools
import os
import secrets
import time

from trainer.record import checkpoint, files, lock
from trainer.record.earlier import earlier_run, move_earlier_run
from trainer.errors import UsageError

RUN_FILES = (checkpoint.CHECKPOINT, checkpoint.BEST, files.SUMMARY)
TOKEN = ".shared-{:08x}"
# a token created on another machine of a network filesystem can take a moment to show up in a lookup
# (NFS caches "no such file" for a few seconds): a node that does not see it looks again for this long
LOOK_AGAIN_SECONDS = 2.0


class Quiet(UsageError):
    """The same error as another rank's, which prints it: this rank exits 2 without a line of its own."""

    quiet = True


def hold_folder(plan):
    """The process that starts rank 0 of a training run holds --output-dir for the job: ``take_folder`` there.
    Returns (the lock, or None for any other process; the plan, with take_folder's notes and paths)."""
    first = plan.launch.node_rank == 0 if plan.launch.mode == "spawn" else plan.launch.rank == 0
    if not first or plan.run.evaluate:
        return None, plan
    return take_folder(plan)


def take_folder(plan, log=None):
    """The folder's lock (one writer per --output-dir), then the check that a new run starts in a folder
    without one: an earlier run there is moved aside (--output-dir not given, ``move_earlier_run``) or refused.
    The lock then lists what this run may write there. Returns (lock, the plan with the notes: a stale lock taken
    over, an earlier run moved; its input files' paths as they are read). The notes on a move are printed as it
    happens (``log``: stdout by default), whatever comes next; the plan's ``shown`` keeps the log from repeating
    them. Every check of the run's inputs came before (trainer/plan.py): nothing moves for a run that cannot start."""
    held_lock = lock.RunLock(plan.run.output_dir).acquire()
    folder, notes = plan.run.output_dir, ()
    try:
        if plan.run.resume is None and plan.run.move_earlier_run:
            earlier, older = earlier_run(plan, held_lock.previous if held_lock.taken_over else None)
            if earlier:
                plan, notes = move_earlier_run(plan, earlier, older)
                for note in notes:
                    (log or functools.partial(print, flush=True))("note: " + note)
                plan = dataclasses.replace(plan, shown=plan.shown + notes)
        elif plan.run.resume is None:
            names = RUN_FILES + (checkpoint.last_name(plan.run.checkpoint_prefix),)
            held = [f for f in sorted(set(names)) if os.path.exists(os.path.join(folder, f))]
            if held:
                raise UsageError("--output-dir '{}' already holds a run ({}): pass --resume auto to continue it, "
                                 "or choose another --output-dir".format(folder, ", ".join(held)))
        held_lock.record([n for n in files.outputs(plan) if not os.path.lexists(os.path.join(folder, n))])
    except BaseException:
        held_lock.release()
        raise
    if held_lock.taken_over:
        notes += ("took over the lock of {}, which is no longer running".format(held_lock.taken_over),)
    return held_lock, dataclasses.replace(plan, notes=plan.notes + notes)


def _sees(path):
    deadline = time.time() + LOOK_AGAIN_SECONDS
    while True:
        if os.path.exists(path):
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.2)


def node_writer(plan, dist, device, log):
    """Decide, on every rank of the job together, whether this rank writes --output-dir.

    Returns (writes, lock or None, the plan: take_folder's where this rank takes a folder): rank 0 writes (its
    folder's lock is held by the launching process);
    a node's local rank 0 whose --output-dir is not rank 0's folder writes its own and holds its lock here.
    A node whose folder cannot be taken (in use, or a new run into a folder holding one) stops every rank
    with that node's one line.
    """
    if not dist.active or plan.launch.nodes <= 1:
        return dist.is_main, None, plan
    leader = (plan.launch.local_rank or 0) == 0
    token = dist.broadcast_int(secrets.randbits(30), device)  # every rank calls it; rank 0's value wins
    path = os.path.join(plan.run.output_dir, TOKEN.format(token))
    if dist.is_main:
        os.makedirs(plan.run.output_dir, exist_ok=True)
        open(path, "w").close()
    dist.barrier()
    own = leader and not dist.is_main and not _sees(path)
    dist.barrier()
    if dist.is_main:
        try:
            os.remove(path)
        except OSError:
            pass
    held, problem = None, None
    if own and not plan.run.evaluate:
        try:
            held, plan = take_folder(plan, lambda line: log(line, all_ranks=True))
        except UsageError as exc:
            problem = exc
    bad = int(dist.max(plan.launch.node_rank + 1.0 if problem else 0.0, device))  # the last such node, counted from 1
    if bad:
        if held is not None:
            held.release()
        if problem is not None:
            raise problem
        message = "node {} cannot write its own --output-dir (its error line says why)".format(bad - 1)
        raise UsageError(message) if dist.is_main else Quiet(message)
    owners = int(round(dist.sum(1.0 if own else 0.0, device)))
    if owners == 0:
        log("=> --output-dir '{}' is shared by all {} nodes: rank 0 writes the checkpoints and the summary".format(
            plan.run.output_dir, plan.launch.nodes))
    else:
        log("=> --output-dir: {} of {} nodes do not see rank 0's folder; each of them keeps its own checkpoints and "
            "summary (written by its local rank 0) in its own --output-dir".format(owners, plan.launch.nodes))
    if own:
        log("=> node {} writes its own checkpoints and summary in '{}' (not the folder rank 0 writes)".format(
            plan.launch.node_rank, plan.run.output_dir), all_ranks=True)
    return dist.is_main or own, held, plan


def check_same_epoch(dist, device, epoch, where, leader):
    """Every rank starts at the same epoch: ``epoch`` is this rank's (its checkpoint's, or where a new run
    starts). Otherwise each node's local rank 0 says which folder holds what, and every rank stops (exit 2)."""
    if not dist.active:
        return
    hi = int(dist.max(epoch, device))
    lo = -int(dist.max(-epoch, device))
    if hi == lo:
        return
    message = ("the ranks would start at different epochs ({} to {}): this node has {} (epoch {}); every node's "
               "--output-dir must hold the same checkpoint: copy the newest checkpoint.pth.tar into each node's "
               "--output-dir, or start all nodes anew in empty folders".format(lo, hi, where, epoch))
    raise UsageError(message) if leader else Quiet(message)
