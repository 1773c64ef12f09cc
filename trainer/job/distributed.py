"""The process group and the collectives the trainer uses (``Dist``); joining it (``init``), saying what it awaits."""
import contextlib
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
        return self._all_reduce(tensor, torch.distributed.ReduceOp.SUM)

    def all_reduce_max(self, tensor):
        return self._all_reduce(tensor, torch.distributed.ReduceOp.MAX)

    def _all_reduce(self, tensor, op):
        if self.active:
            torch.distributed.all_reduce(tensor, op=op)
        return tensor

    def max(self, value, device):
        return float(self.all_reduce_max(device.move(torch.tensor([float(value)])))) if self.active else value

    def sum(self, value, device):
        return float(self.all_reduce_sum(device.move(torch.tensor([float(value)])))) if self.active else value

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
        rendezvous.record_failure(self.store, self.rank)

    def close(self):
        if self.active and torch.distributed.is_initialized():
            # torch 2.1's gloo group can deadlock as DDP's Reducer frees it (a rank that never exits): its destructor
            # joins threads holding the GIL while one still frees a collective's tensors. Sleeping lets them finish.
            time.sleep(0.2)
            torch.distributed.destroy_process_group()
            self.active = False


WAIT_FIRST, WAIT_EVERY = 10.0, 30.0  # seconds at the rendezvous before the first "waiting" line, then between


@contextlib.contextmanager
def _say_while_waiting(s):
    """After WAIT_FIRST s at the rendezvous, then every WAIT_EVERY: who waits for whom, where, what keeps them."""
    where = "{}:{}".format(s.addr, s.port) if s.dist_url.startswith("env://") else s.dist_url
    if s.mode == "spawn":
        hint = "start the other nodes with the same --addr and --port"
    elif os.environ.get("TORCHELASTIC_RUN_ID"):
        hint = "torchrun starts the others; check the other nodes' launch"
    else:
        hint = ("start the other ranks in the background (end each 'python3 main.py ...' line of a loop with &), "
                "or they never start while this one waits")
    done = threading.Event()

    def run():
        t0, wait = time.time(), WAIT_FIRST
        while not done.wait(wait):
            sys.stdout.write("note: rank {} of {} waiting {:.0f} s at the rendezvous {} for the other {} process(es): "
                             "{}; giving up after --dist-timeout {:g} s\n".format(
                                 s.rank, s.world_size, time.time() - t0, where, s.world_size - 1, hint, s.dist_timeout))
            sys.stdout.flush()
            wait = WAIT_EVERY

    thread = threading.Thread(target=run, name="rendezvous-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def init(section, device):
    """Join the process group (after the device is set); returns a Dist."""
    if section.world_size <= 1 or section.mode == "single":
        return Dist()
    backend = section.dist_backend or device.dist_backend
    try:
        with _say_while_waiting(section), rendezvous.quiet_stderr():
            store = _start(section, backend)
    except rendezvous.RendezvousError as exc:
        exc.quiet = section.mode == "spawn" and bool(section.local_rank)  # spawn's ranks share one terminal
        raise
    return Dist(section.rank, section.world_size, active=True, store=store)


def _start(section, backend):
    """The store (env://) and the process group; its failures as one line."""
    store = None
    os.environ.update(clusters.hccl_timeout(os.environ))  # with a rank table, before HCCL starts
    try:
        if section.dist_url.startswith("env://"):
            os.environ["MASTER_ADDR"] = section.addr
            os.environ["MASTER_PORT"] = str(section.port)
            store = rendezvous.open_store(section)
        # file://, or a launcher whose own store torch_npu opens from env:// (torch_npu_run): the URL
        kwargs = dict(init_method=section.dist_url) if store is None else dict(
            store=torch.distributed.PrefixStore("trainer/group", store))
        torch.distributed.init_process_group(backend=backend, world_size=section.world_size, rank=section.rank,
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
