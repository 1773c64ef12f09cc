"""What cluster launchers tell a process about its place: torchrun's restarts, Slurm's tasks, Ascend's rank table."""
import ipaddress
import json
import re

from trainer.errors import UsageError


def elastic_resume(resume, env):
    """--resume is required under ``torchrun --max-restarts N`` (not implied: it could continue another run)."""
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "")
    if resume is not None or not restarts.isdigit() or int(restarts) == 0:
        return
    raise UsageError("torchrun --max-restarts {} restarts the workers after a failure: add --resume auto, so that "
                     "a restart continues from the last checkpoint (a new run starts in a folder without one)".format(
                         restarts))


def world_change(saved, plan):
    """Notes for a resume at another world size than the checkpoint's config ``saved`` (torchrun --nnodes MIN:MAX)."""
    before, now = (saved or {}).get("world_size"), plan.launch.world_size
    if not before or not now or before == now:
        return ()
    b = plan.run.batch_size
    return ("the world changed from {} to {} process(es) since the checkpoint: the global batch {} is kept ({} per "
            "device instead of {}), the LR {} as given".format(before, now, b, b // now, b // before, plan.optim.lr),)


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
            hosts += ["{}{}{}".format(prefix, str(i).zfill(len(lo)), suffix) for i in range(int(lo), int(hi or lo) + 1)]
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
    """This process's place from ``srun``'s variables, or None outside a Slurm step of several tasks."""
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


HCCL_TIMEOUT = 1200  # s: what env_npu.sh and ModelZoo's scripts export; CANN's own default is 120 s
# the shape of each list's entries, for the messages
_ENTRY = {"server_group_list": '{"server_count": ..., "server_list": [...]}',
          "server_list": '{"server_id": "10.0.0.1", "device": [...]}',
          "device": '{"device_id": "0", "device_ip": ..., "rank_id": "0"}'}


def _address(text):
    try:
        ipaddress.ip_address(str(text))
        return True
    except ValueError:
        return False


def _json_kind(value):
    if value is None:
        return "null"
    for types, name in ((bool, "true/false"), (str, "a string"), ((int, float), "a number"), (list, "a list"),
                        (dict, "an object")):
        if isinstance(value, types):
            return "{} ({})".format(name, json.dumps(value)[:40]) if name != "an object" else name
    return type(value).__name__


def _whole(value):
    """A JSON whole number from 0 ("3" or 3) as an int, else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _objects(value, what, kind, where):
    """``value`` (a table's ``what``) checked as a non-empty list of objects (of ``kind``: a key of _ENTRY)."""
    entry = _ENTRY[kind]
    if not isinstance(value, list):
        raise UsageError("{}: {} is {}, not a list: write it as [{}, ...]".format(
            where, what, _json_kind(value), entry))
    if not value:
        raise UsageError("{}: {} is empty: list each entry as {}".format(where, what, entry))
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise UsageError("{}: entry {} of {} is {}, not an object: each entry is {}".format(
                where, i, what, _json_kind(item), entry))
    return value


def _count(holder, key, listed, what, where):
    """A count the table states (``server_count``, ``group_count``), where present, against what it lists."""
    if key not in holder:
        return
    n = _whole(holder[key])
    if n is None:
        raise UsageError("{}: {} is {}, not a whole number: give the number of {}".format(
            where, key, _json_kind(holder[key]), what))
    if n != listed:
        raise UsageError("{}: {} is {} but {} {} listed: make them agree".format(
            where, key, n, listed, what + " are" if listed != 1 else what[:-1] + " is"))


def read_rank_table(path):
    """RANK_TABLE_FILE (versions 1.0, 1.2, MindCluster's groups) checked, as [(server, [(device, rank), ...]), ...]."""
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
    if not isinstance(table, dict):
        raise UsageError("{} holds {}, not an object: a rank table is {{\"version\": \"1.0\", \"server_list\": "
                         "[...], ...}}".format(where, _json_kind(table)))
    if str(table.get("version")) not in ("1.0", "1.2"):
        raise UsageError("{} has version {!r}: versions 1.0 and 1.2 are read".format(where, table.get("version")))
    if table.get("status", "completed") != "completed":
        raise UsageError("{} has status '{}': the scheduler has not completed it yet; start the job once it "
                         "says 'completed'".format(where, table.get("status")))
    if "server_group_list" in table:
        groups = _objects(table["server_group_list"], "server_group_list", "server_group_list", where)
        _count(table, "group_count", len(groups), "groups", where)
    else:
        groups = [table]
    servers, seen_ranks = [], {}
    for g, group in enumerate(groups):
        what = "server_list" if group is table else "server_group_list entry {}'s server_list".format(g)
        if "server_list" not in group:
            raise UsageError("{}: no server_list{}: list the job's servers as [{}, ...]".format(
                where, "" if group is table else " in entry {} of server_group_list".format(g), _ENTRY["server_list"]))
        listed = _objects(group["server_list"], what, "server_list", where)
        _count(group, "server_count", len(listed), "servers", where)
        for i, server in enumerate(listed):
            keys = [k for k in ("host_ip", "server_ip", "server_id") if k in server]
            name = server[keys[0]] if keys else None
            if not isinstance(name, str) or not name.strip():
                got = "its {} is {}".format(keys[0], _json_kind(name)) if keys else "it has no server_id"
                raise UsageError("{}: entry {} of {}: {}; name each server by its address as a string (server_id, "
                                 "or host_ip in version 1.2)".format(where, i, what, got))
            label = "server {}".format(name)
            if "device" not in server:
                raise UsageError("{}: {} has no device list: list its devices as \"device\": [{}, ...]".format(
                    where, label, _ENTRY["device"]))
            devices = {}  # device id: rank
            for dev in _objects(server["device"], "{}'s device".format(label), "device", where):
                device, rank = _whole(dev.get("device_id")), _whole(dev.get("rank_id"))
                if device is None or rank is None:
                    key = "device_id" if device is None else "rank_id"
                    got = "whose {} is {}".format(key, _json_kind(dev[key])) if key in dev else "without a " + key
                    raise UsageError("{}: {} has a device {}: give each device its device_id and rank_id as whole "
                                     "numbers from 0: fix {}".format(where, label, got, json.dumps(dev)))
                if device in devices:
                    raise UsageError("{}: {} lists device {} twice: each device once".format(where, label, device))
                if rank in seen_ranks:
                    raise UsageError("{}: rank_id {} is given to two devices ({} and {} device {}): rank ids "
                                     "must be unique".format(where, rank, seen_ranks[rank], label, device))
                seen_ranks[rank] = "{} device {}".format(label, device)
                devices[device] = rank
            servers.append((name, list(devices.items())))
    world = len(seen_ranks)
    if sorted(seen_ranks) != list(range(world)):
        raise UsageError("{}: the rank ids are {}, not 0..{}: number the devices' rank_id from 0 without "
                         "gaps".format(where, sorted(seen_ranks), world - 1))
    return servers


def host_ranks(env, is_local):
    """This host's part of RANK_TABLE_FILE's job, or None without one ("master": rank 0's address, or None)."""
    place = rank_table_place({"RANK_TABLE_FILE": env.get("RANK_TABLE_FILE")}, is_local)
    if place is None:
        return None
    return {"devices": place["devices"], "ranks": place["ranks"], "world_size": place["world_size"],
            "servers": place["nodes"], "server": place["node_rank"], "master": place["addr"]}


def rank_table_place(env, is_local, local_rank=None):
    """This process's place from RANK_TABLE_FILE, or None: the rank from RANK_ID (or RANK), else on this host the
    device DEVICE_ID or ASCEND_DEVICE_ID names, else slot ``local_rank``. A slot (local rank) is the device's
    position among its server's in the table; ``devices`` maps slots to device ids, as --device-list does."""
    path = env.get("RANK_TABLE_FILE")
    if not path:
        return None
    servers = read_rank_table(path)
    ranks = {rank: (s, slot) for s, (_, devices) in enumerate(servers) for slot, (_, rank) in enumerate(devices)}
    given = env.get("RANK_ID") or env.get("RANK")
    if given is not None and given.isdigit():
        if int(given) not in ranks:
            raise UsageError("RANK_ID {} is not in RANK_TABLE_FILE '{}' (ranks 0..{})".format(
                given, path, len(ranks) - 1))
        server, slot = ranks[int(given)]
    else:
        here = [s for s, (name, _) in enumerate(servers) if _address(name) and is_local(name)]
        if not here:
            raise UsageError("this host is not in RANK_TABLE_FILE '{}' (servers {}): run on one of them, or export "
                             "RANK_ID per process".format(path, ", ".join(name for name, _ in servers)))
        server, slot = here[0], None
    name, devices = servers[server]
    ids = tuple(d for d, _ in devices)
    listed = ",".join(map(str, ids))
    var = "DEVICE_ID" if env.get("DEVICE_ID") else "ASCEND_DEVICE_ID" if env.get("ASCEND_DEVICE_ID") else None
    if slot is None and var is not None:
        wanted = env[var].strip()
        if not wanted.isdigit() or int(wanted) not in ids:
            raise UsageError("{}={} is not a device of this host ({}) in RANK_TABLE_FILE '{}': its devices are "
                             "{}".format(var, env[var], name, path, listed))
        slot = ids.index(int(wanted))
    elif slot is None:
        slot = local_rank or 0
        if slot >= len(ids):
            raise UsageError("local rank {} (LOCAL_RANK or --local_rank) has no device in RANK_TABLE_FILE '{}': "
                             "this host ({}) has {} device(s) there ({}), local ranks 0..{}; or export DEVICE_ID "
                             "(the device id)".format(slot, path, name, len(ids), listed, len(ids) - 1))
    device, rank = devices[slot]
    if _address(name) and is_local(name) is False:
        raise UsageError("RANK_TABLE_FILE '{}' puts rank {} on server {}, which is not this host: export the rank "
                         "ids of this host's devices".format(path, rank, name))
    if local_rank is not None and local_rank != slot:
        raise UsageError("local rank {} (LOCAL_RANK or --local_rank) contradicts RANK_TABLE_FILE '{}': rank {} uses "
                         "device {}, at slot {} of this host's devices {} (a local rank counts the host's processes "
                         "in the table's order; it is not a device id): export LOCAL_RANK={}, or leave it out".format(
                             local_rank, path, rank, device, slot, listed, slot))
    master = servers[ranks[0][0]][0]
    return {"rank": rank, "world_size": len(ranks), "local_rank": slot, "device": device, "devices": ids,
            "ranks": tuple(r for _, r in devices), "procs_per_node": len(devices), "nodes": len(servers),
            "node_rank": server, "addr": master if _address(master) else None}


def hccl_timeout(env):
    """{HCCL_CONNECT_TIMEOUT: ...} to export with a rank table (Ascend's docs: raise it with one), else {}."""
    now = env.get("HCCL_CONNECT_TIMEOUT", "")
    if not env.get("RANK_TABLE_FILE") or (now.isdigit() and int(now) >= HCCL_TIMEOUT):
        return {}
    return {"HCCL_CONNECT_TIMEOUT": str(HCCL_TIMEOUT)}
