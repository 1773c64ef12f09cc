"""Where this process sits in the job, decided once, before anything starts: ``place(Asked, env) -> Placement``.

``Asked`` holds the launch flags as the command line gave them (the spine builds it from its parse); ``place``
reads them and the environment, picks the way the process was started (the table in ``place``'s docstring, first
match wins) and asks that way's one function where the process sits. The ``Placement`` is frozen: the config's
launch section is made from it, and trainer/job/launch.py's ``settle`` finishes it for the device kind.
Launch modes and the table: docs/DISTRIBUTED.md "How processes find each other"."""
import dataclasses
from typing import Optional, Tuple

from trainer.errors import UsageError, counted
from trainer.job import clusters, rendezvous

DEFAULT_PORT = 29688


@dataclasses.dataclass(frozen=True)
class Asked:
    """The launch flags as given (argparse's dests; None / -1: not given)."""
    device: str = "auto"
    gpu: Optional[int] = None
    device_list: Optional[Tuple[int, ...]] = None
    multiprocessing_distributed: bool = False
    world_size: int = -1
    rank: int = -1
    local_rank: Optional[int] = None
    addr: Optional[str] = None
    port: Optional[int] = None
    dist_url: Optional[str] = None
    resume: Optional[str] = None

    @classmethod
    def of(cls, values):
        """From a mapping of the command line's values (dest -> value); the others keep their defaults. ModelZoo's
        --device_num N with spawn's flags and no --device-list: devices 0..N-1 (as trainer/config.py reads it)."""
        asked = cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
        if asked.device_list is None and asked.multiprocessing_distributed and values.get("device_num"):
            asked = dataclasses.replace(asked, device_list=tuple(range(values["device_num"])))
        return asked


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process's place: the launch mode (single | spawn | process), the job's processes and nodes, this
    process's ranks and slot, its node's devices by slot where its place fixes them, the rendezvous, and the notes
    on how the flags were read. A spawning process's ``world_size`` is 0 until its devices are counted."""
    mode: str = "single"
    world_size: int = 1
    rank: int = 0
    local_rank: Optional[int] = None
    nodes: int = 1
    node_rank: int = 0
    procs_per_node: int = 1
    device_list: Optional[Tuple[int, ...]] = None
    addr: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    dist_url: str = "env://"
    notes: Tuple[str, ...] = ()

    def processes(self, device):
        """How many processes the job will have (spawn without --device-list: every visible device of the kind
        ``device`` names, on each node)."""
        return self.world_size or self.nodes * max(1, _visible(device))


def _visible(device):
    from trainer import device as devmod  # the device layer imports torch: only where a kind or count is needed
    return devmod.Device.of(devmod.Device.resolve_kind(device)).count()


def _env_int(env, name):
    try:
        return int(env[name])
    except ValueError:
        raise UsageError("environment variable {}='{}' is not a whole number".format(name, env[name]))


def place(asked, env):
    """The launch table, first match wins:

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
    base, local_rank = _rendezvous(asked, env), _local_rank(asked, env)
    torchrun, shell_loop = "RANK" in env and "WORLD_SIZE" in env, "RANK_SIZE" in env
    slurm = None if torchrun or shell_loop else clusters.slurm_tasks(env)
    table = None if torchrun else clusters.rank_table_place(env, rendezvous.is_local_address, local_rank)
    if table is not None and asked.multiprocessing_distributed and local_rank is None and not any(
            env.get(k) for k in ("RANK_ID", "RANK", "DEVICE_ID", "ASCEND_DEVICE_ID")):
        table = None  # spawn's one process per node: the table was checked, spawn places the ranks
    placed = slurm or table
    if placed and placed["addr"] and not asked.addr and not env.get("MASTER_ADDR") and not base.notes:
        base = dataclasses.replace(base, addr=placed["addr"])  # rank 0's host: Slurm's first node, the table's
    env_world = _env_int(env, "WORLD_SIZE") if env.get("WORLD_SIZE") and not torchrun else None
    clusters.elastic_resume(asked.resume, env if torchrun else {})
    notes = base.notes + tuple("RANK_TABLE_FILE: {}={} s (HCCL's link set-up waits 120 s by default)".format(k, v)
                               for k, v in clusters.hccl_timeout(env).items())
    spawn = asked.multiprocessing_distributed
    if spawn and (torchrun or shell_loop or placed):  # the guide's launch.py line passes it: the launcher's job
        spawn = False  # (in a ModelZoo loop it still says that --world-size / --rank count nodes: _rank_id_loop)
        if not shell_loop:
            launcher = "torchrun / torch.distributed.launch" if torchrun else "srun" if slurm else "RANK_TABLE_FILE"
            notes += ("--multiprocessing-distributed is ignored under {}: the launcher already started one "
                      "process per device".format(launcher),)
    if spawn:
        way = _spawn(asked, base.port) if local_rank is None else _spawn_loop(asked, env_world, local_rank)
    elif torchrun:
        way = _torchrun(asked, env, local_rank)
    elif shell_loop:
        way = _rank_id_loop(asked, env, local_rank, table)
    elif placed is not None:
        way = _slurm(placed, local_rank) if placed is slurm else _rank_table(asked, table, local_rank)
    elif env_world is not None and env_world > 1 and asked.rank < 0:
        way = _one_node(asked, env_world, local_rank)
    elif asked.world_size > 1 or asked.rank >= 0:
        way = _flags(asked, local_rank)
    else:
        way = dict(mode="single", world_size=1, rank=0, local_rank=local_rank or 0)
    out = dataclasses.replace(base, notes=notes, **way)
    if out.mode != "single" and asked.gpu is not None and not (torchrun or shell_loop):
        raise UsageError("--gpu picks the device of a single-process run; with several processes use --device-list")
    return _slot(asked, out)


def _rendezvous(asked, env):
    """The master and the rendezvous URL from --addr/--port/--dist-url and MASTER_ADDR/MASTER_PORT."""
    addr = asked.addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = asked.port if asked.port is not None else (
        _env_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise UsageError("--port must be 0-65535, got {}".format(port))
    url = asked.dist_url or "env://"
    if not url.startswith(("env://", "tcp://", "file://")):
        raise UsageError("--dist-url must be env://, tcp://HOST:PORT or file://PATH, got '{}'".format(url))
    url, addr, port, notes = rendezvous.read_url(url, addr, port, asked.addr is not None, asked.port is not None)
    return Placement(addr=addr, port=port, dist_url=url, notes=notes)


def _local_rank(asked, env):
    """--local_rank or LOCAL_RANK (which must agree); None where neither is given (or -1, torch's "not set")."""
    local_rank = asked.local_rank
    if env.get("LOCAL_RANK"):
        from_env = _env_int(env, "LOCAL_RANK")
        if local_rank is not None and local_rank != from_env:
            raise UsageError("--local_rank {} and LOCAL_RANK={} disagree: set one of them".format(local_rank, from_env))
        local_rank = from_env
    return None if local_rank is not None and local_rank < 0 else local_rank


def _nodes(asked):
    """(nodes, node rank) where --world-size and --rank count nodes (spawn's flags)."""
    nodes, node_rank = max(asked.world_size, 0) or 1, max(asked.rank, 0)
    if node_rank >= nodes:
        raise UsageError("--rank {} (node rank) must be below --world-size {} (nodes)".format(node_rank, nodes))
    return nodes, node_rank


def _spawn(asked, port):
    """--multiprocessing-distributed: this process starts one rank per device of its node."""
    nodes, node_rank = _nodes(asked)
    if nodes > 1 and port == 0:
        raise UsageError("--port 0 (pick a free port) works on one node only; give all nodes the same --port")
    procs = len(asked.device_list) if asked.device_list else 0
    return dict(mode="spawn", nodes=nodes, node_rank=node_rank, procs_per_node=procs, world_size=nodes * procs,
                rank=node_rank * procs)


def _spawn_loop(asked, env_world, local_rank):
    """One rank of a shell loop that passes spawn's flags (LOCAL_RANK per process): the node's processes are
    counted, nothing is spawned."""
    nodes, node_rank = _nodes(asked)
    per_node = len(asked.device_list) if asked.device_list else _visible(asked.device)
    world = env_world if env_world else nodes * per_node
    if not 0 <= local_rank < per_node:
        raise UsageError("LOCAL_RANK {} with --multiprocessing-distributed: this node has {} process slot(s) "
                         "(--device-list or its visible devices); start local ranks 0..{}".format(
                             local_rank, per_node, per_node - 1))
    rank = node_rank * per_node + local_rank
    if world != nodes * per_node or rank >= world:
        raise UsageError("WORLD_SIZE={} does not match {} node(s) x {} device(s): export the total number "
                         "of processes, or unset it".format(world, nodes, per_node))
    return dict(mode="process" if world > 1 else "single", world_size=world, rank=rank, local_rank=local_rank,
                nodes=nodes, node_rank=node_rank, procs_per_node=per_node)


def _torchrun(asked, env, local_rank):
    """torchrun / torch.distributed.launch: RANK, WORLD_SIZE (and LOCAL_WORLD_SIZE) exported."""
    world, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
    per_node = _env_int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
    return _exported(asked, env, world, rank, local_rank, per_node)


def _rank_id_loop(asked, env, local_rank, table):
    """One process of a ModelZoo shell loop: RANK_SIZE processes per node, this one's index RANK_ID (else
    --local_rank / LOCAL_RANK, else ResNet50_ID4149's --gpu). With --multiprocessing-distributed, --world-size
    counts nodes and --rank is this node's (ModelZoo's cluster script: rank = node rank x RANK_SIZE + index), as in
    their main.py. With a rank table, the table says where each rank sits."""
    per_node = _env_int(env, "RANK_SIZE")
    if env.get("RANK_ID"):
        index = _env_int(env, "RANK_ID")
    else:
        index = local_rank if local_rank is not None else asked.gpu if asked.gpu is not None else 0
    nodes, node = _nodes(asked) if asked.multiprocessing_distributed else (1, 0)
    if env.get("RANK"):
        rank = _env_int(env, "RANK")
    else:
        if not 0 <= index < max(per_node, 1):
            raise UsageError("RANK_ID {} is outside a world of {} per node (RANK_SIZE={}: RANK_ID "
                             "0..{})".format(index, counted(per_node, "process"), per_node, per_node - 1))
        rank = node * per_node + index
    world, local_rank = per_node * nodes, local_rank if local_rank is not None else index
    if table is None:
        return _exported(asked, env, world, rank, local_rank, per_node)
    way = _exported(asked, env, world, rank, local_rank, per_node, check=False)
    if table["world_size"] != world or table["rank"] != rank:
        raise UsageError("RANK_SIZE {} / RANK_ID {} do not match RANK_TABLE_FILE (rank {} of {}): export the "
                         "table's rank ids".format(world, rank, table["rank"], table["world_size"]))
    way.update(nodes=table["nodes"], node_rank=table["node_rank"], procs_per_node=table["procs_per_node"],
               local_rank=table["local_rank"], device_list=_table_devices(asked, table))
    _check_gpu(asked, way["mode"], way["local_rank"], way["device_list"])
    return way


def _exported(asked, env, world, rank, local_rank, per_node, check=True):
    """The place of a process its launcher numbered (torchrun, a shell loop); ``check``: --gpu against it."""
    if local_rank is None:
        local_rank = _env_int(env, "RANK_ID") if env.get("RANK_ID") else rank % per_node
    if world < 1 or not 0 <= rank < world:
        raise UsageError("rank {} is outside a world of {} (check RANK/WORLD_SIZE or "
                         "RANK_ID/RANK_SIZE)".format(rank, counted(world, "process")))
    way = dict(mode="process" if world > 1 else "single", world_size=world, rank=rank, local_rank=local_rank,
               procs_per_node=per_node, nodes=max(1, world // per_node), node_rank=rank // per_node)
    if check:
        _check_gpu(asked, way["mode"], local_rank, None)
    return way


def _slurm(tasks, local_rank):
    """A task of a Slurm job step (srun): Slurm numbers the tasks and their nodes."""
    return dict(mode="process", world_size=tasks["world_size"], rank=tasks["rank"],
                local_rank=local_rank if local_rank is not None else tasks["local_rank"],
                procs_per_node=tasks["procs_per_node"], nodes=tasks["nodes"], node_rank=tasks["node_rank"])


def _rank_table(asked, table, local_rank):
    """A process of Ascend's rank table: its slot (a local rank given was checked against it) and device."""
    return dict(_slurm(table, local_rank), local_rank=table["local_rank"], device_list=_table_devices(asked, table))


def _one_node(asked, env_world, local_rank):
    """WORLD_SIZE and a local rank, no RANK (the 910B guide's train.sh): one node, rank = local rank."""
    if local_rank is None:
        raise UsageError("WORLD_SIZE={} is set but nothing says which process this is: export RANK (and "
                         "LOCAL_RANK) per process, LOCAL_RANK alone on one node, or use torchrun; unset "
                         "WORLD_SIZE for a single-process run".format(env_world))
    if not 0 <= local_rank < env_world:
        raise UsageError("LOCAL_RANK {} is outside WORLD_SIZE={} (one node: local ranks 0..{})".format(
            local_rank, env_world, env_world - 1))
    if asked.world_size > 0 and asked.world_size != env_world:
        raise UsageError("--world-size {} and WORLD_SIZE={} disagree: set one of them".format(
            asked.world_size, env_world))
    return dict(mode="process", world_size=env_world, rank=local_rank, local_rank=local_rank,
                procs_per_node=env_world, nodes=1, node_rank=0)


def _flags(asked, local_rank):
    """--world-size N --rank R without spawn: they count processes, one per node."""
    world, rank = asked.world_size, asked.rank
    if world < 1 or not 0 <= rank < world:
        raise UsageError("--world-size {} with --rank {}: the rank must be 0..world-1 (without "
                         "--multiprocessing-distributed these count processes)".format(world, rank))
    return dict(mode="process" if world > 1 else "single", world_size=world, rank=rank, local_rank=local_rank or 0,
                procs_per_node=1, nodes=world, node_rank=rank)


def _slot(asked, out):
    """This process's local rank is its slot among its node's processes (0..procs_per_node-1), never a device id.
    Where the node has one process (a single run, --world-size/--rank alone), a local rank given (LOCAL_RANK,
    --local_rank) names its device instead: slot 0, that device (its --device-list entry where one is given;
    --gpu, where given, picks the device as before)."""
    slot, per_node = out.local_rank, out.procs_per_node
    if not slot or not per_node or out.device_list is not None:
        return out
    if per_node == 1:
        if asked.gpu is None:
            ids = asked.device_list
            if ids and slot >= len(ids):
                raise UsageError("local rank {} has no entry in --device-list {} ({} entries)".format(
                    slot, ",".join(map(str, ids)), len(ids)))
            out = dataclasses.replace(out, device_list=(ids[slot] if ids else slot,))
        return dataclasses.replace(out, local_rank=0)
    if slot >= per_node:
        raise UsageError("local rank {} is outside this node's {} (local ranks 0..{}): export LOCAL_RANK "
                         "as the process's index on its node (LOCAL_WORLD_SIZE or RANK_SIZE processes per node), and "
                         "its device with --device-list".format(slot, counted(per_node, "process"), per_node - 1))
    return out


def _table_devices(asked, table):
    """The devices of this host's processes by slot under a rank table: the table's (in its order), or
    --device-list where given, whose entry for this process's slot must be the table's device."""
    if not asked.device_list:
        return table["devices"]
    slot, ids = table["local_rank"], ",".join(map(str, table["devices"]))
    own = asked.device_list[slot] if slot < len(asked.device_list) else None
    if own != table["device"]:
        raise UsageError("--device-list {} gives local rank {} {}, but RANK_TABLE_FILE gives rank {} device {} (this "
                         "host's devices there: {}): pass --device-list {}, or leave it out".format(
                             ",".join(map(str, asked.device_list)), slot,
                             "no device" if own is None else "device {}".format(own), table["rank"], table["device"],
                             ids, ids))
    return tuple(asked.device_list)


def _check_gpu(asked, mode, local_rank, device_list):
    """--gpu N in a ModelZoo loop or under torchrun (ResNet50_ID4149's scripts pass --gpu ${RANK_ID}) names this
    process's device: it must be the one its place gives (its --device-list or rank table slot, or its local
    rank)."""
    if asked.gpu is None or mode == "single":
        return
    slot = local_rank or 0
    ids = device_list or asked.device_list
    own = ids[slot] if ids and slot < len(ids) else slot
    if asked.gpu != own:
        raise UsageError("--gpu {} contradicts this process's place: local rank {} uses device {}{} (drop --gpu, "
                         "or pass the rank's own index)".format(asked.gpu, slot, own, " of --device-list"
                                                                if asked.device_list else " of RANK_TABLE_FILE"
                                                                if ids else ""))
