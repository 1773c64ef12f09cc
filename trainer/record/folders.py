"""Who writes --output-dir: one writer per folder, and one per node when the nodes do not share it.

Global rank 0 writes the checkpoints and summary. Nodes often do not share --output-dir (local disks; the Ascend
guides save on every node's local rank 0): ``--resume auto`` would then resume node 0 and start the others anew. So
after the rendezvous rank 0 leaves a token file in its folder, and each node's local rank 0 looks for it in its own:
a node that does not find it takes its own folder's lock and writes the same files there. Every rank then resumes
from the same epoch, or the job stops with one line before training (``check_same_epoch``).
"""
import contextlib
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
    """``take_folder`` in the process that starts rank 0 of a training run: (the lock, or None elsewhere; the plan)."""
    first = plan.launch.node_rank == 0 if plan.launch.mode == "spawn" else plan.launch.rank == 0
    return take_folder(plan) if first and not plan.run.evaluate else (None, plan)


def take_folder(plan, log=None):
    """The folder's lock, an earlier run there moved aside (--output-dir not given) or refused, and what this run
    may write there listed in the lock. Returns (lock, the plan with the notes and its inputs' paths as read). A
    move's notes are printed as it happens (``log``: stdout by default; the plan's ``shown`` keeps the log from
    repeating them), after every check of the inputs (trainer/plan.py)."""
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
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.2)
    return os.path.exists(path)


def node_writer(plan, dist, device, log):
    """On every rank together: whether this rank writes --output-dir. Returns (writes, lock or None, the plan):
    rank 0 writes (its launching process holds the lock); a node's local rank 0 that does not see rank 0's folder
    writes its own and takes its lock here. A node whose folder cannot be taken stops every rank with its one line."""
    if not dist.active or plan.launch.nodes <= 1:
        return dist.is_main, None, plan
    token = dist.broadcast_int(secrets.randbits(30), device)  # every rank calls it; rank 0's value wins
    path = os.path.join(plan.run.output_dir, TOKEN.format(token))
    if dist.is_main:
        os.makedirs(plan.run.output_dir, exist_ok=True)
        open(path, "w").close()
    dist.barrier()
    own = (plan.launch.local_rank or 0) == 0 and not dist.is_main and not _sees(path)  # a leader without it
    dist.barrier()
    if dist.is_main:
        with contextlib.suppress(OSError):
            os.remove(path)
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
    """Every rank must start at the same epoch (``epoch``: this rank's); else each node's local rank 0 says which
    folder holds what, and every rank stops (exit 2)."""
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
