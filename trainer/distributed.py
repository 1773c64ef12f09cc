"""Process launch (single | spawn | process: torchrun, the guides' shell loop, several nodes), where
this process sits in the job, the supervisor of a node's ranks (spawn's and the drivers'), and the
collectives the trainer uses. Launch modes, batch and LR rules, rendezvous: docs/DESIGN.md.
"""
import ctypes
import datetime
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback

import torch

from trainer import device as devmod
from trainer.errors import UsageError
from trainer.guard import EXIT_DIVERGED

DEFAULT_PORT = 29688


def _env_int(env, name):
    try:
        return int(env[name])
    except ValueError:
        raise UsageError("environment variable {}='{}' is not a whole number".format(name, env[name]))


def resolve_launch(ns, env):
    """Work out this process's place in the job from flags and environment (no side effects)."""
    out = _place(ns, env)
    if out["world_size"] and ns.batch_size % out["world_size"]:
        raise UsageError("--batch-size {} (global) does not divide over {} processes; use a multiple of {}".format(
            ns.batch_size, out["world_size"], out["world_size"]))
    return out


def process_count(ns, env):
    """How many processes the job will have (spawn without --device-list: every visible device)."""
    place = _place(ns, env)
    if place["world_size"]:
        return place["world_size"]
    return place["nodes"] * max(1, devmod.count(devmod.resolve_kind(ns.device)))


def _place(ns, env):
    """The launch table (README "How processes find each other"), first match wins:

    torchrun / torch.distributed.launch  RANK + WORLD_SIZE (+ LOCAL_RANK or --local_rank)
    the ModelZoo shell loop              RANK_SIZE + RANK_ID (+ LOCAL_RANK)
    a shell loop with spawn's flags      LOCAL_RANK + --multiprocessing-distributed (the Ascend guide's loop:
                                         this process is one of the node's ranks; nothing is spawned)
    spawn                                --multiprocessing-distributed
    one node, rank = local rank          WORLD_SIZE + LOCAL_RANK or --local_rank, no RANK (the 910B guide's
                                         train.sh)
    flags                                --world-size N --rank R
    single                               none of these
    """
    addr = ns.addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = ns.port if ns.port is not None else (
        _env_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise UsageError("--port must be 0-65535, got {}".format(port))
    url = ns.dist_url or "env://"
    if not url.startswith(("env://", "tcp://", "file://")):
        raise UsageError("--dist-url must be env://, tcp://HOST:PORT or file://PATH, got '{}'".format(url))
    local_rank = ns.local_rank
    if env.get("LOCAL_RANK"):
        from_env = _env_int(env, "LOCAL_RANK")
        if local_rank is not None and local_rank != from_env:
            raise UsageError("--local_rank {} and LOCAL_RANK={} disagree: set one of them".format(local_rank, from_env))
        local_rank = from_env
    if local_rank is not None and local_rank < 0:
        local_rank = None  # torch.distributed.launch's "not set" (-1)
    torchrun = "RANK" in env and "WORLD_SIZE" in env
    shell_loop = "RANK_SIZE" in env
    env_world = _env_int(env, "WORLD_SIZE") if env.get("WORLD_SIZE") and not torchrun else None
    out = {"addr": addr, "port": port, "dist_url": url, "local_rank": local_rank,
           "nodes": 1, "node_rank": 0, "procs_per_node": 1, "notes": ()}
    spawn = ns.multiprocessing_distributed
    if spawn and (torchrun or shell_loop):  # the guide's launch.py line passes it: the launcher's job
        spawn = False
        out["notes"] = ("--multiprocessing-distributed is ignored under {}: the launcher already started one "
                        "process per device".format("torchrun / torch.distributed.launch" if torchrun
                                                     else "RANK_SIZE/RANK_ID"),)
    if spawn:
        nodes = ns.world_size if ns.world_size > 0 else 1
        node_rank = ns.rank if ns.rank >= 0 else 0
        if node_rank >= nodes:
            raise UsageError("--rank {} (node rank) must be below --world-size {} (nodes)".format(node_rank, nodes))
        if local_rank is not None:  # one rank of a shell loop: count the node's processes, spawn nothing
            per_node = len(ns.device_list) if ns.device_list else devmod.count(devmod.resolve_kind(ns.device))
            world = env_world if env_world else nodes * per_node
            if not 0 <= local_rank < per_node:
                raise UsageError("LOCAL_RANK {} with --multiprocessing-distributed: this node has {} process slot(s) "
                                 "(--device-list or its visible devices); start local ranks 0..{}".format(
                                     local_rank, per_node, per_node - 1))
            rank = node_rank * per_node + local_rank
            if world != nodes * per_node or rank >= world:
                raise UsageError("WORLD_SIZE={} does not match {} node(s) x {} device(s): export the total number "
                                 "of processes, or unset it".format(world, nodes, per_node))
            out.update(launch="process" if world > 1 else "single", world_size=world, rank=rank, nodes=nodes,
                       node_rank=node_rank, procs_per_node=per_node)
        else:
            if nodes > 1 and port == 0:
                raise UsageError("--port 0 (pick a free port) works on one node only; give all nodes the same --port")
            procs = len(ns.device_list) if ns.device_list else None
            out.update(launch="spawn", nodes=nodes, node_rank=node_rank, procs_per_node=procs or 0,
                       world_size=nodes * procs if procs else 0, rank=node_rank * (procs or 0))
    elif torchrun or shell_loop:
        if torchrun:
            world, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
            per_node = _env_int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
        else:
            world = _env_int(env, "RANK_SIZE")
            rank = _env_int(env, "RANK") if env.get("RANK") else (
                _env_int(env, "RANK_ID") if env.get("RANK_ID") else 0)
            per_node = world
        if local_rank is None:
            local_rank = _env_int(env, "RANK_ID") if env.get("RANK_ID") else rank % per_node
        if world < 1 or not 0 <= rank < world:
            raise UsageError("rank {} is outside a world of {} processes (check RANK/WORLD_SIZE or "
                             "RANK_ID/RANK_SIZE)".format(rank, world))
        out.update(launch="process" if world > 1 else "single", world_size=world, rank=rank,
                   local_rank=local_rank, procs_per_node=per_node, nodes=max(1, world // per_node),
                   node_rank=rank // per_node)
    elif env_world is not None and env_world > 1 and ns.rank < 0:
        if local_rank is None:
            raise UsageError("WORLD_SIZE={} is set but nothing says which process this is: export RANK (and "
                             "LOCAL_RANK) per process, LOCAL_RANK alone on one node, or use torchrun; unset "
                             "WORLD_SIZE for a single-process run".format(env_world))
        if not 0 <= local_rank < env_world:
            raise UsageError("LOCAL_RANK {} is outside WORLD_SIZE={} (one node: local ranks 0..{})".format(
                local_rank, env_world, env_world - 1))
        if ns.world_size > 0 and ns.world_size != env_world:
            raise UsageError("--world-size {} and WORLD_SIZE={} disagree: set one of them".format(
                ns.world_size, env_world))
        out.update(launch="process", world_size=env_world, rank=local_rank, local_rank=local_rank,
                   procs_per_node=env_world, nodes=1, node_rank=0)
    elif ns.world_size > 1 or ns.rank >= 0:
        world = ns.world_size
        if world < 1 or not 0 <= ns.rank < world:
            raise UsageError("--world-size {} with --rank {}: the rank must be 0..world-1 (without "
                             "--multiprocessing-distributed these count processes)".format(world, ns.rank))
        out.update(launch="process" if world > 1 else "single", world_size=world, rank=ns.rank,
                   local_rank=local_rank if local_rank is not None else 0, procs_per_node=1,
                   nodes=world, node_rank=ns.rank)
    else:
        out.update(launch="single", world_size=1, rank=0, local_rank=local_rank if local_rank is not None else 0)
    if out["launch"] != "single" and ns.gpu is not None:
        raise UsageError("--gpu picks the device of a single-process run; with several processes use --device-list")
    return out


def settle_backend(cfg, kind):
    """``cfg`` with a --dist-backend that names another device's collective library (the guides' hccl on a GPU
    or CPU, nccl off CUDA) replaced by this device's own, and a note saying so."""
    owner = devmod.backend_owner(cfg.dist_backend)
    if owner is None or owner == kind:
        return cfg
    own = devmod.default_backend(kind)
    return cfg.replace(dist_backend=own, notes=cfg.notes + (
        "--dist-backend {} is the {} collective library; this run is on {}: using {}".format(
            cfg.dist_backend, owner.upper(), kind.upper(), own),))


def check_launch(cfg, kind):
    """Before any process starts: the rendezvous and the device count suit ``kind``. Returns notes."""
    schemes = devmod.rendezvous_schemes(kind)
    if cfg.world_size != 1 and not cfg.dist_url.startswith(schemes):
        raise UsageError("--dist-url {}: {} processes start their group from environment variables only "
                         "(init_method env://, as the Ascend guide says); drop --dist-url and give the master as "
                         "--addr HOST --port PORT".format(cfg.dist_url, kind.upper()))
    allowed = devmod.supported_devices_per_node(kind)
    per_node = cfg.procs_per_node or (len(cfg.device_list) if cfg.device_list else devmod.count(kind))
    if allowed and cfg.world_size != 1 and per_node not in allowed:
        return ("{} device(s) per node: the Ascend guide supports only {} {}s per node for collective "
                "communication; expect the collectives to fail".format(per_node, "/".join(map(str, allowed)),
                                                                        kind.upper()),)
    return ()


def device_index(cfg):
    """The device this process uses: its slot of --device-list, or --gpu, or its local rank."""
    slot = cfg.local_rank or 0
    if cfg.device_list:
        if slot >= len(cfg.device_list):
            raise UsageError("local rank {} has no entry in --device-list {} ({} entries)".format(
                slot, ",".join(map(str, cfg.device_list)), len(cfg.device_list)))
        return cfg.device_list[slot]
    if cfg.device_index is not None:
        return cfg.device_index
    return slot


def check_devices(cfg, kind):
    """Before any process starts: the device list exists on this machine."""
    ids = cfg.device_list
    if not ids or not devmod.has_device_ids(kind):
        return
    problem = devmod.visible_devices_problem(kind)
    if problem:
        raise UsageError(problem)
    visible = devmod.count(kind)
    env = devmod.visible_devices_env(kind)
    bad = [i for i in ids if i >= visible]
    if bad:
        raise UsageError("--device-list asks for {} device {} but {} visible (ids 0-{}){}".format(
            kind, bad[0], visible, visible - 1,
            " under {}={}".format(env, os.environ[env]) if env and os.environ.get(env) else ""))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def check_port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            raise UsageError("port {} is in use: pass --port N with a free port, or --port 0 to pick one".format(port))


# ---------------------------------------------------------------- supervision


STOP_GRACE = 15.0  # seconds a rank is given to stop before it is killed
# exit codes of a rank that stopped on its own and said why (a user error, a divergence, Ctrl-C): every
# rank meets the same condition, so the others are given STOP_GRACE to stop as well before being stopped
ORDERLY = (2, EXIT_DIVERGED, 130)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the process that supervises the ranks."""

    def __init__(self, signum):
        Exception.__init__(self, signum)
        self.signum = signum
        self.exit_code = 130 if signum == signal.SIGINT else 143


def _on_signal(signum, frame):
    raise Interrupted(signum)


def _exit_code(proc):
    return proc.poll() if hasattr(proc, "poll") else proc.exitcode  # subprocess.Popen | multiprocessing.Process


class Ranks:
    """The rank processes of one job on this node, however started (``spawn``'s workers, or one process per
    device from the drivers): wait for them, name the rank to blame, stop the others. ``groups``: each rank
    leads its own process group, which is signalled as a whole (its data loader workers included).
    Inside ``with ranks:`` SIGINT and SIGTERM raise Interrupted, so that the caller stops the ranks."""

    def __init__(self, procs=(), groups=False):
        self.procs, self.groups, self._handlers = list(procs), groups, {}

    def __enter__(self):
        self._handlers = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self._handlers.items():
            signal.signal(s, h)
        return False

    def codes(self):
        return [_exit_code(p) for p in self.procs]

    def running(self):
        return any(c is None for c in self.codes())

    def failed(self):
        """The rank to blame once one failed (a killed rank rather than its peers), else None."""
        bad = [(r, c) for r, c in enumerate(self.codes()) if c not in (None, 0)]
        killed = [r for r, c in bad if c < 0]
        return (killed or [r for r, _ in bad] or [None])[0]

    def signal_all(self, sig):
        for p in self.procs:
            if _exit_code(p) is None or (self.groups and sig == signal.SIGKILL):
                try:
                    (os.killpg if self.groups else os.kill)(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def _settle(self, seconds, poll):
        deadline = time.time() + seconds
        while self.running() and time.time() < deadline:
            time.sleep(poll)

    def stop(self, sig=signal.SIGTERM, poll=0.2):
        """``sig`` to every rank still running, SIGKILL after STOP_GRACE (and to what is left in their groups)."""
        self.signal_all(sig)
        self._settle(STOP_GRACE, poll)
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            (p.wait if hasattr(p, "wait") else p.join)()

    def supervise(self, poll=0.2):
        """Wait for every rank; once one failed, stop the others (a rank that stopped in ORDERLY fashion leaves
        them STOP_GRACE to stop on their own first). Returns the rank to blame, or None."""
        while self.running() and self.failed() is None:
            time.sleep(poll)
        blame = self.failed()
        if blame is not None and self.codes()[blame] in ORDERLY:
            self._settle(STOP_GRACE, poll)
            blame = self.failed()
        if self.running():
            self.stop(poll=poll)
        return blame


# ---------------------------------------------------------------- spawn


def spawn(cfg, kind, worker):
    """--multiprocessing-distributed: one process per device, supervised (``Ranks``).

    If any rank fails, the others are stopped and this returns its exit code (2 for a
    user error, 4 for a divergence, 1 otherwise); Ctrl-C stops all of them (130, SIGTERM 143).
    """
    ids = cfg.device_list or tuple(range(devmod.count(kind)))
    nprocs = len(ids)
    world = cfg.nodes * nprocs
    if cfg.batch_size % world:
        raise UsageError("--batch-size {} (global) does not divide over {} processes; use a multiple of {}".format(
            cfg.batch_size, world, world))
    port = cfg.port
    if cfg.dist_url.startswith("env://") and cfg.node_rank == 0:
        if port == 0:
            port = free_port()
        else:
            check_port_free(port)
    child = cfg.replace(device_list=tuple(ids), world_size=world, procs_per_node=nprocs,
                        rank=cfg.node_rank * nprocs, port=port)
    ranks, trace_dir = Ranks(), tempfile.mkdtemp(prefix="ranks-")
    traces = [os.path.join(trace_dir, "rank{}.trace".format(i)) for i in range(nprocs)]
    try:
        with ranks:
            context = multiprocessing.get_context("spawn")
            for i in range(nprocs):
                proc = context.Process(target=_spawn_entry, args=(i, child, worker, traces[i]),
                                       name="spawn rank {}".format(i))
                proc.start()
                ranks.procs.append(proc)
            r = ranks.supervise()
    except Interrupted as exc:
        # Ctrl-C: the ranks are interrupted too (a terminal signals them already; kill -INT does not), so that
        # each ends as an interrupted run, summary written; SIGTERM is passed on as it came
        ranks.stop(sig=signal.SIGINT if exc.signum == signal.SIGINT else signal.SIGTERM)
        sys.stderr.write("interrupted: all ranks stopped; summary and checkpoints in '{}'; continue with "
                         "--resume auto\n".format(cfg.output_dir))
        return exc.exit_code
    finally:
        if ranks.running():
            ranks.stop()
        traces = [_take_trace(f) for f in traces]
        shutil.rmtree(trace_dir, ignore_errors=True)
    if r is None:
        return 0
    code = ranks.codes()[r]
    if code in (2, EXIT_DIVERGED):
        return code  # the rank printed its one-line error already
    if traces[r]:
        sys.stderr.write(traces[r])
    how = "exit code {}".format(code) if code >= 0 else "signal {}".format(-code)
    sys.stderr.write("error: local rank {} failed ({}); stopped the other ranks\n".format(r, how))
    return 1


def _take_trace(path):
    """The traceback a spawned rank left in its trace file ("" if it left none)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(sig=signal.SIGTERM):
    """Linux: the kernel sends ``sig`` to this process when its parent dies, so that no rank trains on
    unsupervised after the supervisor was killed (elsewhere: nothing). SIGTERM ends the rank at once (ranks
    leave it unhandled), also inside a collective that waits for a rank that is gone."""
    try:
        libc = ctypes.CDLL(None)
        if hasattr(libc, "prctl"):
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _spawn_entry(local_index, cfg, worker, trace_path):
    """A spawned rank: run ``worker``, exit with its code. A raised exception's traceback goes to
    ``trace_path`` for the supervisor to print once (the rank itself prints nothing), exit code 1."""
    _die_with_parent()
    cfg = cfg.replace(local_rank=local_index, rank=cfg.rank + local_index)
    try:
        code = worker(cfg)
    except KeyboardInterrupt:
        code = 130
    except Exception:
        with open(trace_path, "w") as f:
            f.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code or 0)


# ---------------------------------------------------------------- collectives


class Dist:
    """This process's view of the job; a world of one needs no process group."""

    def __init__(self, rank=0, world_size=1, active=False):
        self.rank, self.world_size, self.active = rank, world_size, active

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

    def __init__(self, cfg):
        self.cfg, self.done, self.thread = cfg, threading.Event(), None

    def line(self, waited):
        cfg = self.cfg
        where = "{}:{}".format(cfg.addr, cfg.port) if cfg.dist_url.startswith("env://") else cfg.dist_url
        if cfg.launch == "spawn":
            hint = "start the other nodes with the same --addr and --port"
        elif os.environ.get("TORCHELASTIC_RUN_ID"):
            hint = "torchrun starts the others; check the other nodes' launch"
        else:
            hint = ("start the other ranks in the background (end each 'python3 main.py ...' line of a loop with &), "
                    "or they never start while this one waits")
        return ("note: rank {} of {} waiting {:.0f} s at the rendezvous {} for the other {} process(es): {}; "
                "giving up after --dist-timeout {:g} s".format(cfg.rank, cfg.world_size, waited, where,
                                                              cfg.world_size - 1, hint, cfg.dist_timeout))

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


def init(cfg, device):
    """Join the process group (after the device is set); returns a Dist."""
    if cfg.world_size <= 1 or cfg.launch == "single":
        return Dist()
    backend = cfg.dist_backend or device.dist_backend
    if cfg.dist_url.startswith("env://"):
        os.environ["MASTER_ADDR"] = cfg.addr
        os.environ["MASTER_PORT"] = str(cfg.port)
    try:
        with _SayWhileWaiting(cfg):
            torch.distributed.init_process_group(
                backend=backend, init_method=cfg.dist_url, world_size=cfg.world_size, rank=cfg.rank,
                timeout=datetime.timedelta(seconds=cfg.dist_timeout))
    except (RuntimeError, ValueError) as exc:
        text = str(exc)
        if "in use" in text.lower() or "EADDRINUSE" in text:
            raise UsageError("port {} on {} is in use: pass --port N with a free port, or --port 0 to pick "
                             "one".format(cfg.port, cfg.addr))
        if "backend" in text.lower() and backend in text:
            raise UsageError("distributed backend '{}' is not available in this torch ({})".format(
                backend, text.splitlines()[0]))
        raise
    return Dist(cfg.rank, cfg.world_size, active=True)
