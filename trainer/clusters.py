"""What the cluster launchers users already run tell a process about its place, read where ``launch._place``
asks: torchrun's elastic restarts (--resume auto required with --max-restarts), Slurm's task
variables (``srun``, one task per device) and Ascend's rank table (RANK_TABLE_FILE)."""
import ipaddress
import json
import re

from trainer.errors import UsageError


def elastic_resume(resume, env):
    """(resume, notes): under ``torchrun --max-restarts N`` (N > 0) --resume is required (``--resume auto``: a
    restarted attempt continues from the last checkpoint). Not implied: an attempt that stopped because the
    folder holds another run would be restarted, and an implied resume would then continue that other run."""
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "")
    if resume is not None or not restarts.isdigit() or int(restarts) == 0:
        return resume, ()
    raise UsageError("torchrun --max-restarts {} restarts the workers after a failure: add --resume auto, so that "
                     "a restart continues from the last checkpoint (a new run starts in a folder without one)".format(
                         restarts))


def world_change(saved, plan):
    """Notes for a resume whose world size differs from the checkpoint's (``saved``: its config), as after an
    elastic membership change (torchrun --nnodes MIN:MAX): the global batch -b is kept, and so the LR as given,
    so that each step sees the same images and the run continues as it would have at the old size."""
    before, now = (saved or {}).get("world_size"), plan.launch.world_size
    if not before or not now or before == now:
        return ()
    b = plan.run.batch_size
    return ("the world changed from {} to {} process(es) since the checkpoint: the global batch {} is kept ({} per "
            "device instead of {}), the LR {} as given".format(before, now, b, b // now, b // before, plan.optim.lr),)


# ---------------------------------------------------------------- Slurm


def _int(env, name):
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise UsageError("Slurm's {}='{}' is not a whole number (srun sets it for each task)".format(
            name, env.get(name, "")))


def expand_hostlist(text):
    """Slurm's compressed host list ("node[01-03,07],gpu5") as names, as ``scontrol show hostnames`` lists them."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text or ""):
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append("{}{}{}".format(prefix, str(i).zfill(width), suffix))
    return hosts


def _tasks_per_node(text, nodes):
    """SLURM_TASKS_PER_NODE ("2(x3),1") as one count per node."""
    counts = []
    for part in (text or "").split(","):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if m:
            counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts if len(counts) == nodes else None


def slurm_tasks(env):
    """This process's place from ``srun``'s variables (torchvision's init_distributed_mode reads the same), or
    None when this is not a task of a Slurm step of several tasks: {rank, world_size, local_rank, nodes,
    node_rank, procs_per_node, addr (the first host of SLURM_JOB_NODELIST, where rank 0 runs)}."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env or _int(env, "SLURM_NTASKS") < 2:
        return None  # an sbatch script itself (no step) or a step of one task: not a rank of a job
    world, rank = _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID")
    nodes = _int(env, "SLURM_NNODES") if env.get("SLURM_NNODES") else 1
    node_rank = _int(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    local = _int(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID") else 0
    per_node = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"), nodes)
    hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                            or env.get("SLURM_NODELIST", ""))
    if not hosts:
        raise UsageError("Slurm task {} of {}: SLURM_JOB_NODELIST is empty, so rank 0's host is unknown: run the "
                         "job with srun inside sbatch or salloc, or export MASTER_ADDR".format(rank, world))
    if not 0 <= rank < world:
        raise UsageError("Slurm's SLURM_PROCID {} is outside SLURM_NTASKS {}".format(rank, world))
    return {"rank": rank, "world_size": world, "local_rank": local, "nodes": nodes, "node_rank": node_rank,
            "procs_per_node": per_node[node_rank] if per_node and node_rank < len(per_node) else world // nodes,
            "addr": hosts[0]}


# ---------------------------------------------------------------- Ascend's rank table

HCCL_TIMEOUT = 1200  # s: what env_npu.sh and ModelZoo's scripts export; CANN's own default is 120 s


def _address(text):
    try:
        ipaddress.ip_address(str(text))
        return True
    except ValueError:
        return False


def read_rank_table(path):
    """RANK_TABLE_FILE (versions 1.0 and 1.2; a MindCluster global table's server_group_list too) as
    [(server address or id, [(device id, rank id), ...]), ...] in file order, checked: one line per problem."""
    where = "RANK_TABLE_FILE '{}'".format(path)
    try:
        with open(path) as f:
            table = json.load(f)
    except OSError as exc:
        raise UsageError("{} cannot be read ({}): export the path of the job's rank table".format(
            where, exc.strerror or exc))
    except ValueError as exc:
        raise UsageError("{} is not JSON ({}): fix the file (comments as in the docs' examples must go)".format(
            where, exc))
    if not isinstance(table, dict) or str(table.get("version")) not in ("1.0", "1.2"):
        raise UsageError("{} has version {!r}: versions 1.0 and 1.2 are read".format(
            where, table.get("version") if isinstance(table, dict) else None))
    if table.get("status", "completed") != "completed":
        raise UsageError("{} has status '{}': the scheduler has not completed it yet; start the job once it "
                         "says 'completed'".format(where, table.get("status")))
    groups = table.get("server_group_list") or [table]
    servers, seen_ranks = [], {}
    for group in groups:
        for server in group.get("server_list") or []:
            name = server.get("host_ip") or server.get("server_ip") or server.get("server_id")
            devices, ids = [], set()
            for dev in server.get("device") or []:
                try:
                    device, rank = int(dev["device_id"]), int(dev["rank_id"])
                except (KeyError, TypeError, ValueError):
                    raise UsageError("{}: server {} has a device without a whole device_id and rank_id: {}".format(
                        where, name, json.dumps(dev)))
                if device in ids:
                    raise UsageError("{}: server {} lists device {} twice: each device once".format(
                        where, name, device))
                if rank in seen_ranks:
                    raise UsageError("{}: rank_id {} is given to two devices ({} and server {} device {}): rank ids "
                                     "must be unique".format(where, rank, seen_ranks[rank], name, device))
                ids.add(device)
                seen_ranks[rank] = "server {} device {}".format(name, device)
                devices.append((device, rank))
            servers.append((str(name), devices))
    world = len(seen_ranks)
    if not world or sorted(seen_ranks) != list(range(world)):
        raise UsageError("{}: the rank ids are {}, not 0..{}: number the devices' rank_id from 0 without "
                         "gaps".format(where, sorted(seen_ranks) or "none", max(world - 1, 0)))
    return servers


def rank_table_place(env, is_local):
    """This process's place from RANK_TABLE_FILE, or None without one: the rank from RANK_ID (or RANK) where the
    launch script exports it, else this host's server (an address in the table that ``is_local``) and its
    device (DEVICE_ID, ASCEND_DEVICE_ID or LOCAL_RANK). Checked before any wait: this host must be in the table."""
    path = env.get("RANK_TABLE_FILE")
    if not path:
        return None
    servers = read_rank_table(path)
    ranks = {rank: (s, device) for s, (_, devices) in enumerate(servers) for device, rank in devices}
    given = env.get("RANK_ID") or env.get("RANK")
    if given is not None and given.isdigit():
        if int(given) not in ranks:
            raise UsageError("RANK_ID {} is not in RANK_TABLE_FILE '{}' (ranks 0..{})".format(
                given, path, len(ranks) - 1))
        server, device = ranks[int(given)]
    else:
        local = [s for s, (name, _) in enumerate(servers) if _address(name) and is_local(name)]
        if not local:
            raise UsageError("this host is not in RANK_TABLE_FILE '{}' (servers {}): run on one of them, or export "
                             "RANK_ID per process".format(path, ", ".join(name for name, _ in servers)))
        server = local[0]
        wanted = env.get("DEVICE_ID") or env.get("ASCEND_DEVICE_ID") or env.get("LOCAL_RANK") or "0"
        device = int(wanted) if wanted.isdigit() else -1
        if device not in [d for d, _ in servers[server][1]]:
            raise UsageError("device {} is not listed for this host ({}) in RANK_TABLE_FILE '{}'".format(
                wanted, servers[server][0], path))
    name, devices = servers[server]
    if _address(name) and is_local(name) is False:
        raise UsageError("RANK_TABLE_FILE '{}' puts rank {} on server {}, which is not this host: export the rank "
                         "ids of this host's devices".format(path, dict((d, r) for d, r in devices)[device], name))
    rank = dict(devices)[device]
    master = servers[ranks[0][0]][0]
    return {"rank": rank, "world_size": len(ranks), "local_rank": device, "procs_per_node": len(devices),
            "nodes": len(servers), "node_rank": server, "addr": master if _address(master) else None}


def hccl_timeout(env):
    """{HCCL_CONNECT_TIMEOUT: ...} to export with a rank table (Ascend's docs: raise it with one; HCCL waits 120 s
    by default), or {} when no rank table is used or the value is already at least HCCL_TIMEOUT."""
    if not env.get("RANK_TABLE_FILE"):
        return {}
    now = env.get("HCCL_CONNECT_TIMEOUT", "")
    if now.isdigit() and int(now) >= HCCL_TIMEOUT:
        return {}
    return {"HCCL_CONNECT_TIMEOUT": str(HCCL_TIMEOUT)}
