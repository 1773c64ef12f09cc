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
import glob
import os
import secrets
import time

from trainer import checkpoint, lock, observe, summary
from trainer.errors import UsageError

RUN_FILES = (checkpoint.CHECKPOINT, checkpoint.BEST, summary.SUMMARY)
TOKEN = ".shared-{:08x}"
# a token created on another machine of a network filesystem can take a moment to show up in a lookup
# (NFS caches "no such file" for a few seconds): a node that does not see it looks again for this long
LOOK_AGAIN_SECONDS = 2.0


class Quiet(UsageError):
    """The same error as another rank's, which prints it: this rank exits 2 without a line of its own."""

    quiet = True


def hold_folder(plan):
    """The process that starts rank 0 of a training run holds --output-dir for the job: ``take_folder`` there.
    Returns (the lock, or None for any other process; notes)."""
    first = plan.launch.node_rank == 0 if plan.launch.mode == "spawn" else plan.launch.rank == 0
    if not first or plan.run.evaluate:
        return None, ()
    return take_folder(plan)


def take_folder(plan):
    """The folder's lock (one writer per --output-dir), then the check that a new run starts in a folder
    without one. Returns (lock, notes: one when a stale lock was taken over)."""
    held_lock = lock.RunLock(plan.run.output_dir).acquire()
    notes = ()
    try:
        if plan.run.resume is None:
            names = RUN_FILES + (checkpoint.last_name(plan.run.checkpoint_prefix),)
            held = [f for f in sorted(set(names)) if os.path.exists(os.path.join(plan.run.output_dir, f))]
            if held and plan.run.move_earlier_run:
                notes += (move_earlier_run(plan.run.output_dir, plan.run.checkpoint_prefix),)
            elif held:
                raise UsageError("--output-dir '{}' already holds a run ({}): pass --resume auto to continue it, "
                                 "or choose another --output-dir".format(plan.run.output_dir, ", ".join(held)))
    except BaseException:
        held_lock.release()
        raise
    if held_lock.taken_over:
        notes += ("took over the lock of {}, which is no longer running".format(held_lock.taken_over),)
    return held_lock, notes


EARLIER = "previous_runs"  # where a new run in the default --output-dir moves the run it finds there


def move_earlier_run(folder, prefix="checkpoint"):
    """Move the files of the run in ``folder`` (checkpoints, summaries, metrics, TensorBoard, traces) into
    ``folder/previous_runs/STAMP/``; returns the note saying so. ModelZoo's scripts run their entry twice in the same
    folder (the performance script, then the full one): the second run must neither fail nor overwrite the first."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = os.path.join(folder, EARLIER, stamp), 1
    while os.path.exists(dest):
        dest, n = os.path.join(folder, EARLIER, "{}-{}".format(stamp, n)), n + 1
    names = set(RUN_FILES + (checkpoint.last_name(prefix), observe.METRICS, summary.EVAL_SUMMARY, "tensorboard"))
    paths = [os.path.join(folder, f) for f in names]
    paths += glob.glob(os.path.join(folder, "profile_rank*")) + glob.glob(os.path.join(folder, "*_epoch*.pth.tar"))
    moved = []
    os.makedirs(dest)
    for path in sorted(p for p in set(paths) if os.path.exists(p)):
        try:
            os.rename(path, os.path.join(dest, os.path.basename(path)))
        except OSError as exc:
            raise UsageError("cannot move the earlier run's {} aside into '{}' ({}): pass --output-dir DIR for the "
                             "new run".format(path, dest, exc.strerror or exc))
        moved.append(os.path.basename(path))
    return "--output-dir '{}' held an earlier run: {} moved to {} (--output-dir DIR to write elsewhere)".format(
        folder, ", ".join(moved), dest)


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

    Returns (writes, lock or None, notes): rank 0 writes (its folder's lock is held by the launching process);
    a node's local rank 0 whose --output-dir is not rank 0's folder writes its own and holds its lock here.
    A node whose folder cannot be taken (in use, or a new run into a folder holding one) stops every rank
    with that node's one line.
    """
    if not dist.active or plan.launch.nodes <= 1:
        return dist.is_main, None, ()
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
    held, problem, notes = None, None, ()
    if own and not plan.run.evaluate:
        try:
            held, notes = take_folder(plan)
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
    return dist.is_main or own, held, notes


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
