"""Where this process sits in the job (single | spawn | process: torchrun, the guides' shell loops, several
nodes), worked out from flags and environment before anything starts, and the checks of the launch that
need no process group: the backend, the rendezvous scheme, the device list, the port. Launch modes, batch
and LR rules, rendezvous: docs/DESIGN.md."""
import dataclasses
import os
import socket

from trainer.job import clusters, rendezvous
from trainer.cli import counted
from trainer.errors import UsageError

DEFAULT_PORT = 29688


def _env_int(env, name):
    try:
        return int(env[name])
    except ValueError:
        raise UsageError("environment variable {}='{}' is not a whole number".format(name, env[name]))


def resolve_launch(ns, env):
    """Work out this process's place in the job from flags and environment (no side effects; the batch is
    checked against the job's processes by trainer/plan.py)."""
    return _place(ns, env)


def process_count(ns, env):
    """How many processes the job will have (spawn without --device-list: every visible device)."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    place = _place(ns, env)
    if place["world_size"]:
        return place["world_size"]
    return place["nodes"] * max(1, devmod.Device.of(devmod.Device.resolve_kind(ns.device)).count())


def _place(ns, env):
    """The launch table (docs/DISTRIBUTED.md "How processes find each other"), first match wins:

    torchrun / torch.distributed.launch  RANK + WORLD_SIZE (+ LOCAL_RANK or --local_rank)
    the ModelZoo shell loop              RANK_SIZE + RANK_ID (+ LOCAL_RANK)
    Slurm (srun, one task per device)    SLURM_PROCID + SLURM_NTASKS in a job step (trainer/job/clusters.py)
    Ascend's rank table                  RANK_TABLE_FILE (+ RANK_ID, or DEVICE_ID / LOCAL_RANK on a listed host)
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
    url, addr, port, url_notes = rendezvous.read_url(url, addr, port, ns.addr is not None, ns.port is not None)
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
    slurm = None if torchrun or shell_loop else clusters.slurm_tasks(env)
    table = None if torchrun else clusters.rank_table_place(env, rendezvous.is_local_address, local_rank)
    if table is not None and ns.multiprocessing_distributed and local_rank is None and not any(
            env.get(k) for k in ("RANK_ID", "RANK", "DEVICE_ID", "ASCEND_DEVICE_ID")):
        table = None  # spawn's one process per node: the table was checked, spawn places the ranks
    placed = slurm or table
    if placed and placed["addr"] and not ns.addr and not env.get("MASTER_ADDR") and not url_notes:
        addr = placed["addr"]  # rank 0's host: the first of Slurm's node list, the rank table's server of rank 0
    env_world = _env_int(env, "WORLD_SIZE") if env.get("WORLD_SIZE") and not torchrun else None
    out = {"addr": addr, "port": port, "dist_url": url, "local_rank": local_rank, "device_list": None,
           "nodes": 1, "node_rank": 0, "procs_per_node": 1, "notes": url_notes}
    out["resume"], more = clusters.elastic_resume(getattr(ns, "resume", None), env if torchrun else {})
    out["notes"] += more + tuple("RANK_TABLE_FILE: {}={} s (HCCL's link set-up waits 120 s by default)".format(k, v)
                                 for k, v in clusters.hccl_timeout(env).items())
    spawn = ns.multiprocessing_distributed
    if spawn and (torchrun or shell_loop or placed):  # the guide's launch.py line passes it: the launcher's job
        spawn = False  # (in a ModelZoo loop it still says that --world-size / --rank count nodes: _modelzoo_loop)
        if not shell_loop:
            launcher = "torchrun / torch.distributed.launch" if torchrun else "srun" if slurm else "RANK_TABLE_FILE"
            out["notes"] += ("--multiprocessing-distributed is ignored under {}: the launcher already started one "
                             "process per device".format(launcher),)
    if spawn:
        nodes = ns.world_size if ns.world_size > 0 else 1
        node_rank = ns.rank if ns.rank >= 0 else 0
        if node_rank >= nodes:
            raise UsageError("--rank {} (node rank) must be below --world-size {} (nodes)".format(node_rank, nodes))
        if local_rank is not None:  # one rank of a shell loop: count the node's processes, spawn nothing
            from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
            per_node = (len(ns.device_list) if ns.device_list
                        else devmod.Device.of(devmod.Device.resolve_kind(ns.device)).count())
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
            world, rank, local_rank, per_node = _modelzoo_loop(ns, env, local_rank)
        if local_rank is None:
            local_rank = _env_int(env, "RANK_ID") if env.get("RANK_ID") else rank % per_node
        if world < 1 or not 0 <= rank < world:
            raise UsageError("rank {} is outside a world of {} (check RANK/WORLD_SIZE or "
                             "RANK_ID/RANK_SIZE)".format(rank, counted(world, "process")))
        out.update(launch="process" if world > 1 else "single", world_size=world, rank=rank,
                   local_rank=local_rank, procs_per_node=per_node, nodes=max(1, world // per_node),
                   node_rank=rank // per_node)
        if table is not None:  # the ModelZoo loop with a rank table: the table says where each rank sits
            if table["world_size"] != world or table["rank"] != rank:
                raise UsageError("RANK_SIZE {} / RANK_ID {} do not match RANK_TABLE_FILE (rank {} of {}): export the "
                                 "table's rank ids".format(world, rank, table["rank"], table["world_size"]))
            out.update(nodes=table["nodes"], node_rank=table["node_rank"], procs_per_node=table["procs_per_node"],
                       local_rank=table["local_rank"], device_list=_table_devices(ns, table))
        _check_gpu(ns, out)
    elif placed is not None:
        out.update(launch="process", world_size=placed["world_size"], rank=placed["rank"],
                   local_rank=local_rank if local_rank is not None else placed["local_rank"],
                   procs_per_node=placed["procs_per_node"], nodes=placed["nodes"], node_rank=placed["node_rank"])
        if placed is table:  # the table's slot (a local rank given was checked against it) and device
            out.update(local_rank=table["local_rank"], device_list=_table_devices(ns, table))
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
    if out["launch"] != "single" and ns.gpu is not None and not (torchrun or shell_loop):
        raise UsageError("--gpu picks the device of a single-process run; with several processes use --device-list")
    return _slot(ns, out)


def _slot(ns, out):
    """This process's local rank is its slot among its node's processes (0..procs_per_node-1), never a device id.
    Where the node has one process (a single run, --world-size/--rank alone), a local rank given (LOCAL_RANK,
    --local_rank) names its device instead: slot 0, that device (its --device-list entry where one is given;
    --gpu, where given, picks the device as before)."""
    slot, per_node = out["local_rank"], out["procs_per_node"]
    if not slot or not per_node or out["device_list"] is not None:
        return out
    if per_node == 1:
        if ns.gpu is None:
            ids = ns.device_list
            if ids and slot >= len(ids):
                raise UsageError("local rank {} has no entry in --device-list {} ({} entries)".format(
                    slot, ",".join(map(str, ids)), len(ids)))
            out["device_list"] = (ids[slot] if ids else slot,)
        out["local_rank"] = 0
    elif slot >= per_node:
        raise UsageError("local rank {} is outside this node's {} (local ranks 0..{}): export LOCAL_RANK "
                         "as the process's index on its node (LOCAL_WORLD_SIZE or RANK_SIZE processes per node), and "
                         "its device with --device-list".format(slot, counted(per_node, "process"), per_node - 1))
    return out


def _modelzoo_loop(ns, env, local_rank):
    """(world, rank, local rank, processes per node) of one process of a ModelZoo shell loop: RANK_SIZE processes
    per node, this one's index RANK_ID (else --local_rank / LOCAL_RANK, else ResNet50_ID4149's --gpu). With
    --multiprocessing-distributed, --world-size counts nodes and --rank is this node's (ModelZoo's cluster
    script: rank = node rank x RANK_SIZE + index), as in their main.py."""
    per_node = _env_int(env, "RANK_SIZE")
    if env.get("RANK_ID"):
        index = _env_int(env, "RANK_ID")
    elif local_rank is not None:
        index = local_rank
    else:
        index = ns.gpu if ns.gpu is not None else 0
    nodes, node = 1, 0
    if ns.multiprocessing_distributed:
        nodes = ns.world_size if ns.world_size > 0 else 1
        node = ns.rank if ns.rank >= 0 else 0
        if node >= nodes:
            raise UsageError("--rank {} (node rank) must be below --world-size {} (nodes)".format(node, nodes))
    if env.get("RANK"):
        rank = _env_int(env, "RANK")
    else:
        if not 0 <= index < max(per_node, 1):
            raise UsageError("RANK_ID {} is outside a world of {} per node (RANK_SIZE={}: RANK_ID "
                             "0..{})".format(index, counted(per_node, "process"), per_node, per_node - 1))
        rank = node * per_node + index
    return per_node * nodes, rank, local_rank if local_rank is not None else index, per_node


def _table_devices(ns, table):
    """The devices of this host's processes by slot under a rank table: the table's (in its order), or
    --device-list where given, whose entry for this process's slot must be the table's device."""
    if not ns.device_list:
        return table["devices"]
    slot, ids = table["local_rank"], ",".join(map(str, table["devices"]))
    own = ns.device_list[slot] if slot < len(ns.device_list) else None
    if own != table["device"]:
        raise UsageError("--device-list {} gives local rank {} {}, but RANK_TABLE_FILE gives rank {} device {} (this "
                         "host's devices there: {}): pass --device-list {}, or leave it out".format(
                             ",".join(map(str, ns.device_list)), slot,
                             "no device" if own is None else "device {}".format(own), table["rank"], table["device"],
                             ids, ids))
    return tuple(ns.device_list)


def _check_gpu(ns, out):
    """--gpu N in a ModelZoo loop or under torchrun (ResNet50_ID4149's scripts pass --gpu ${RANK_ID}) names this
    process's device: it must be the one its place gives (its --device-list or rank table slot, or its local
    rank)."""
    if ns.gpu is None or out["launch"] == "single":
        return
    slot = out["local_rank"] or 0
    ids = out.get("device_list") or ns.device_list
    own = ids[slot] if ids and slot < len(ids) else slot
    if ns.gpu != own:
        raise UsageError("--gpu {} contradicts this process's place: local rank {} uses device {}{} (drop --gpu, "
                         "or pass the rank's own index)".format(ns.gpu, slot, own, " of --device-list" if ns.device_list
                                                                else " of RANK_TABLE_FILE" if ids else ""))


def settle(section, kind, batch_size, environ=None):
    """Where the processes of the job sit, decided for ``kind`` before any of them starts (trainer/plan.py): the
    devices listed exist, the global batch divides over the processes (spawn's: one per listed or visible device
    of each node), the process group's backend, the rendezvous and its master, and this process's device (a
    spawned rank's is decided where it starts: ``device_index``). ``section``: the config's launch section;
    ``environ``: the environment the messages name. Returns (the launch section decided, notes)."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    check_devices(section, kind, environ)
    world = section.world_size
    if section.mode == "spawn":  # one process per listed device, else per visible one
        section = dataclasses.replace(section, device_list=section.device_list or tuple(
            range(devmod.Device.of(kind).count())))
        world = section.nodes * len(section.device_list)
    if batch_size % world:
        raise UsageError("--batch-size {} (global) does not divide over {} processes; use a multiple of {}".format(
            batch_size, world, world))
    backend, notes = settle_backend(section, kind)
    section = dataclasses.replace(section, device=kind, dist_backend=backend)
    notes += check_launch(section, kind)
    rendezvous.check_master(section)
    if section.mode != "spawn":
        section = dataclasses.replace(section, device_index=device_index(section))
    return section, notes


def settle_backend(section, kind):
    """(the process group's backend: --dist-backend as given, or, where it names another device's collective
    library (the guides' hccl on a GPU or CPU, nccl off CUDA), this device's own; notes: one saying so).
    ``section``: the config's launch section."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    owner = devmod.Device.backend_owner(section.dist_backend)
    if owner is None or owner == kind:
        return section.dist_backend, ()
    own = devmod.Device.of(kind).dist_backend
    return own, ("--dist-backend {} is the {} collective library; this run is on {}: using {}".format(
        section.dist_backend, owner.upper(), kind.upper(), own),)


def check_launch(section, kind):
    """Before any process starts: the rendezvous and the device count suit ``kind``. Returns notes."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    kind_cls = devmod.Device.of(kind)
    schemes = kind_cls.rendezvous_schemes
    if section.world_size != 1 and not section.dist_url.startswith(schemes):
        raise UsageError("--dist-url {}: {} processes start their group from environment variables only "
                         "(init_method env://, as the Ascend guide says); drop --dist-url and give the master as "
                         "--addr HOST --port PORT".format(section.dist_url, kind.upper()))
    allowed = kind_cls.supported_devices_per_node
    per_node = section.procs_per_node or (len(section.device_list) if section.device_list else kind_cls.count())
    if allowed and section.world_size != 1 and per_node not in allowed:
        return ("{} device(s) per node: the Ascend guide supports only {} {}s per node for collective "
                "communication; expect the collectives to fail".format(per_node, "/".join(map(str, allowed)),
                                                                        kind.upper()),)
    return ()


def device_index(section):
    """The device this process uses: its slot's entry of --device-list (or of the rank table's devices of its
    host), or --gpu, or its local rank."""
    slot = section.local_rank or 0
    if section.device_list:
        if slot >= len(section.device_list):
            raise UsageError("local rank {} has no entry in --device-list {} ({} entries)".format(
                slot, ",".join(map(str, section.device_list)), len(section.device_list)))
        return section.device_list[slot]
    if section.device_index is not None:
        return section.device_index
    return slot


def check_devices(section, kind, environ=None):
    """Before any process starts: the device settings suit the kind, the device list exists on this machine
    (``environ``: the environment whose visible-devices variable the message names; os.environ by default)."""
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    environ = os.environ if environ is None else environ
    kind_cls = devmod.Device.of(kind)
    problem = kind_cls.settings_problem(section)
    if problem:
        raise UsageError(problem)
    ids = section.device_list
    if not ids or not kind_cls.numbered:
        return
    problem = kind_cls.visible_devices_problem()
    if problem:
        raise UsageError(problem)
    visible = kind_cls.count()
    env = kind_cls.visible_devices_env
    bad = [i for i in ids if i >= visible]
    if bad:
        table = environ.get("RANK_TABLE_FILE")
        listed = table and section.mode == "process" and bad[0] in _table_ids(environ)
        raise UsageError("{} asks for {} device {} but {} visible (ids 0-{}){}".format(
            "RANK_TABLE_FILE '{}'".format(table) if listed else "--device-list", kind, bad[0], visible, visible - 1,
            " under {}={}".format(env, environ[env]) if env and environ.get(env) else ""))


def _table_ids(environ):
    """This host's device ids in RANK_TABLE_FILE (none where it does not list this host by address)."""
    try:
        return clusters.host_devices(environ, rendezvous.is_local_address) or ()
    except UsageError:
        return ()


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
