"""Where this process sits in the job, decided once before anything starts: ``place(Asked, env) -> Placement``
from the launch flags as given and the environment (the config's launch section is made from it; launch.settle
finishes it for the device kind). Launch modes: docs/DISTRIBUTED.md "How processes find each other"."""
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
        """From dest -> value; ModelZoo's --device_num N with spawn's flags and no --device-list: devices 0..N-1."""
        asked = cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
        if asked.device_list is None and asked.multiprocessing_distributed and values.get("device_num"):
            asked = dataclasses.replace(asked, device_list=tuple(range(values["device_num"])))
        return asked


@dataclasses.dataclass(frozen=True)
class Placement:
    """This process's place. A spawning process's ``world_size`` is 0 until its devices are counted."""
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
        """The job's processes (spawn without --device-list: every visible device of ``device``'s kind per node)."""
        return self.world_size or self.nodes * max(1, _visible(device))


def _visible(device):
    from trainer import device as devmod  # imports torch: only where a count is needed
    return devmod.Device.of(devmod.Device.resolve_kind(device)).count()


def _env_int(env, name):
    try:
        return int(env[name])
    except ValueError:
        raise UsageError("environment variable {}='{}' is not a whole number".format(name, env[name]))


def place(asked, env):
    """The first way to start whose variables or flags are given (docs/DISTRIBUTED.md's table, in its order)."""
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
        way = _torchrun(env, local_rank)
    elif shell_loop:
        way = _rank_id_loop(asked, env, local_rank, table)
    elif placed is not None:
        way = _slurm(placed, local_rank) if placed is slurm else _rank_table(asked, table)
    elif env_world is not None and env_world > 1 and asked.rank < 0:
        way = _one_node(asked, env_world, local_rank)
    elif asked.world_size > 1 or asked.rank >= 0:
        way = _flags(asked, local_rank)
    else:
        way = dict(mode="single", world_size=1, rank=0, local_rank=local_rank or 0)
    out = dataclasses.replace(base, notes=notes, **way)
    if torchrun or shell_loop:
        _check_gpu(asked, out)
    elif out.mode != "single" and asked.gpu is not None:
        raise UsageError("--gpu picks the device of a single-process run; with several processes use --device-list")
    return _slot(asked, out)


def _rendezvous(asked, env):
    addr = asked.addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = asked.port if asked.port is not None else (
        _env_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else DEFAULT_PORT)
    if not 0 <= port <= 65535:
        raise UsageError("--port must be 0-65535, got {}".format(port))
    url = asked.dist_url or "env://"
    if not url.startswith(("env://", "tcp://", "file://")):
        raise UsageError("--dist-url must be env://, tcp://HOST:PORT or file://PATH, got '{}'".format(url))
    if not url.startswith("tcp://"):
        return Placement(addr=addr, port=port, dist_url=url)
    # tcp://HOST:PORT is read as env:// with that master (what the guides mean)
    rest = url[len("tcp://"):].split("?", 1)[0].rstrip("/")
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError("--dist-url '{}' is not tcp://HOST:PORT (a port 0-65535)".format(url))
    pairs = (("--addr", asked.addr is not None, addr, host), ("--port", asked.port is not None, port, int(port_text)))
    ignored = ["{} {}".format(name, value) for name, given, value, mine in pairs if given and str(value) != str(mine)]
    note = "--dist-url {}: the ranks meet at {}:{} (env://, MASTER_ADDR and MASTER_PORT){}".format(
        url, host, port_text, "; {} ignored".format(" and ".join(ignored)) if ignored else "")
    return Placement(addr=host, port=int(port_text), dist_url="env://", notes=(note,))


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
    """(nodes, node rank) from --world-size and --rank counting nodes."""
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
    """One rank of a shell loop with spawn's flags (LOCAL_RANK per process): nothing is spawned."""
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


def _torchrun(env, local_rank):
    """torchrun / torch.distributed.launch: RANK, WORLD_SIZE (and LOCAL_WORLD_SIZE) exported."""
    world, rank = _env_int(env, "WORLD_SIZE"), _env_int(env, "RANK")
    per_node = _env_int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world
    return _exported(env, world, rank, local_rank, per_node)


def _slurm(tasks, local_rank):
    """A task of a Slurm step (srun): its place as Slurm gives it (trainer/job/clusters.py)."""
    return dict(mode="process", world_size=tasks["world_size"], rank=tasks["rank"],
                local_rank=local_rank if local_rank is not None else tasks["local_rank"],
                procs_per_node=tasks["procs_per_node"], nodes=tasks["nodes"], node_rank=tasks["node_rank"])


def _rank_table(asked, table):
    """A process of Ascend's rank table: its place and its node's devices as the table lists them."""
    return dict(_slurm(table, None), device_list=_table_devices(asked, table))


def _rank_id_loop(asked, env, local_rank, table):
    """One process of a ModelZoo loop: RANK_SIZE per node, index RANK_ID (else local rank, else ResNet50_ID4149's
    --gpu); with --multiprocessing-distributed, --world-size and --rank count nodes (as their main.py)."""
    per_node = _env_int(env, "RANK_SIZE")
    index = _env_int(env, "RANK_ID") if env.get("RANK_ID") else local_rank if local_rank is not None else (
        asked.gpu if asked.gpu is not None else 0)
    nodes, node = _nodes(asked) if asked.multiprocessing_distributed else (1, 0)
    if not env.get("RANK") and not 0 <= index < max(per_node, 1):
        raise UsageError("RANK_ID {} is outside a world of {} per node (RANK_SIZE={}: RANK_ID "
                         "0..{})".format(index, counted(per_node, "process"), per_node, per_node - 1))
    rank = _env_int(env, "RANK") if env.get("RANK") else node * per_node + index
    world, local_rank = per_node * nodes, local_rank if local_rank is not None else index
    way = _exported(env, world, rank, local_rank, per_node)
    if table is None:
        return way
    if table["world_size"] != world or table["rank"] != rank:
        raise UsageError("RANK_SIZE {} / RANK_ID {} do not match RANK_TABLE_FILE (rank {} of {}): export the "
                         "table's rank ids".format(world, rank, table["rank"], table["world_size"]))
    return dict(_rank_table(asked, table), mode=way["mode"])


def _exported(env, world, rank, local_rank, per_node):
    """The place of a process its launcher numbered."""
    if local_rank is None:
        local_rank = _env_int(env, "RANK_ID") if env.get("RANK_ID") else rank % per_node
    if world < 1 or not 0 <= rank < world:
        raise UsageError("rank {} is outside a world of {} (check RANK/WORLD_SIZE or "
                         "RANK_ID/RANK_SIZE)".format(rank, counted(world, "process")))
    return dict(mode="process" if world > 1 else "single", world_size=world, rank=rank, local_rank=local_rank,
                procs_per_node=per_node, nodes=max(1, world // per_node), node_rank=rank // per_node)


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
    """A local rank is a slot among the node's processes, never a device id; where the node has one process, a
    local rank given names its device instead (its --device-list entry; --gpu still wins), at slot 0."""
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
    """This host's devices by slot under a rank table: the table's, or --device-list agreeing with it."""
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


def _check_gpu(asked, out):
    """--gpu N in a ModelZoo loop or torchrun (ResNet50_ID4149: --gpu ${RANK_ID}) must be this place's device."""
    if asked.gpu is None or out.mode == "single":
        return
    slot = out.local_rank or 0
    ids = out.device_list or asked.device_list
    own = ids[slot] if ids and slot < len(ids) else slot
    if asked.gpu != own:
        where = " of --device-list" if asked.device_list else " of RANK_TABLE_FILE" if ids else ""
        raise UsageError("--gpu {} contradicts this process's place: local rank {} uses device {}{} (drop --gpu, "
                         "or pass the rank's own index)".format(asked.gpu, slot, own, where))
