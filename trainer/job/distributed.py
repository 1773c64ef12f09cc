"""The process group and the collectives the trainer uses (``Dist``); joining the group (``init``), saying
while it waits at the rendezvous what it waits for."""
import datetime
import os
import sys
import threading
import time

import torch

from trainer.job import clusters, rendezvous
from trainer.errors import UsageError


class Dist:
    """This process's view of the job; a world of one needs no process group."""

    def __init__(self, rank=0, world_size=1, active=False, store=None):
        self.rank, self.world_size, self.active = rank, world_size, active
        self.store = store  # the store the group started from (rendezvous.open_store), None for other URLs

    @property
    def is_main(self):
        return self.rank == 0

    def all_reduce_sum(self, tensor):
        if self.active:
            torch.distributed.all_reduce(tensor)
        return tensor

    def all_reduce_max(self, tensor):
        if self.active:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor

    def max(self, value, device):
        if not self.active:
            return value
        t = device.move(torch.tensor([float(value)]))
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def sum(self, value, device):
        if not self.active:
            return value
        t = device.move(torch.tensor([float(value)]))
        torch.distributed.all_reduce(t)
        return float(t.item())

    def broadcast_int(self, value, device):
        if not self.active:
            return value
        t = device.move(torch.tensor([int(value)], dtype=device.index_dtype))
        torch.distributed.broadcast(t, 0)
        return int(t.item())

    def barrier(self):
        if self.active:
            torch.distributed.barrier()

    def record_failure(self):
        """This rank ends with a failure of its own: said in the store, so that the ranks it cuts off blame it
        (rendezvous.peer_failure)."""
        rendezvous.record_failure(self.store, self.rank)

    def close(self):
        if self.active and torch.distributed.is_initialized():
            # torch 2.1's gloo group can deadlock when the last reference to it goes (DDP's Reducer, freed when the
            # rank's job is): its destructor joins its worker threads while holding the GIL, and a worker thread
            # still freeing a finished collective's tensors waits for the GIL (seen as a rank that never exits).
            # Sleeping releases the GIL, so that they finish that before anything is torn down.
            time.sleep(0.2)
            torch.distributed.destroy_process_group()
            self.active = False


WAIT_FIRST, WAIT_EVERY = 10.0, 30.0  # seconds at the rendezvous before the first "waiting" line, then between


class _SayWhileWaiting:
    """While this rank waits at the rendezvous: a line on stdout after WAIT_FIRST seconds, then every WAIT_EVERY,
    saying which rank this is, for how many it waits, where, and what usually keeps them (the guide's shell loop
    printed without ``&`` starts the next rank only after this one ends). The wait still ends at --dist-timeout."""

    def __init__(self, section):
        self.section, self.done, self.thread = section, threading.Event(), None

    def line(self, waited):
        s = self.section
        where = "{}:{}".format(s.addr, s.port) if s.dist_url.startswith("env://") else s.dist_url
        if s.mode == "spawn":
            hint = "start the other nodes with the same --addr and --port"
        elif os.environ.get("TORCHELASTIC_RUN_ID"):
            hint = "torchrun starts the others; check the other nodes' launch"
        else:
            hint = ("start the other ranks in the background (end each 'python3 main.py ...' line of a loop with &), "
                    "or they never start while this one waits")
        return ("note: rank {} of {} waiting {:.0f} s at the rendezvous {} for the other {} process(es): {}; "
                "giving up after --dist-timeout {:g} s".format(s.rank, s.world_size, waited, where,
                                                              s.world_size - 1, hint, s.dist_timeout))

    def _run(self):
        t0, wait = time.time(), WAIT_FIRST
        while not self.done.wait(wait):
            sys.stdout.write(self.line(time.time() - t0) + "\n")
            sys.stdout.flush()
            wait = WAIT_EVERY

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, name="rendezvous-wait", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        return False


def init(section, device):
    """Join the process group (after the device is set); returns a Dist."""
    if section.world_size <= 1 or section.mode == "single":
        return Dist()
    backend = section.dist_backend or device.dist_backend
    try:
        with _SayWhileWaiting(section), rendezvous.quiet_stderr():
            store = _start(section, backend)
    except rendezvous.RendezvousError as exc:
        exc.quiet = section.mode == "spawn" and bool(section.local_rank)  # spawn's ranks share one terminal
        raise
    return Dist(section.rank, section.world_size, active=True, store=store)


def _start(section, backend):
    """The store (env://: rendezvous.open_store) and the process group; its failures as one line."""
    store = None
    os.environ.update(clusters.hccl_timeout(os.environ))  # with a rank table, before HCCL starts
    try:
        if section.dist_url.startswith("env://"):
            os.environ["MASTER_ADDR"] = section.addr
            os.environ["MASTER_PORT"] = str(section.port)
            store = rendezvous.open_store(section)
        if store is not None:
            kwargs = dict(store=torch.distributed.PrefixStore("trainer/group", store))
        else:  # file://, or a launcher whose own store torch_npu opens from env:// (torch_npu_run)
            kwargs = dict(init_method=section.dist_url)
        torch.distributed.init_process_group(
            backend=backend, world_size=section.world_size, rank=section.rank,
            timeout=datetime.timedelta(seconds=section.dist_timeout), **kwargs)
    except (RuntimeError, ValueError, OSError) as exc:  # OSError: torch 2.1's TimeoutError
        text = str(exc)
        if "in use" in text.lower() or "EADDRINUSE" in text:
            raise UsageError("port {} on {} is in use: pass --port N with a free port, or --port 0 to pick "
                             "one".format(section.port, section.addr))
        if "backend" in text.lower() and backend in text:
            raise UsageError("distributed backend '{}' is not available in this torch ({})".format(
                backend, text.splitlines()[0]))
        failure = None if rendezvous.show_traces() else rendezvous.init_failure(exc, section)
        if failure is None:
            raise
        raise failure
    return store
