"""What the cluster launchers users already run tell a process about its place, read where ``launch._place``
asks: torchrun's elastic restarts (a restarted attempt resumes from the last checkpoint) and Slurm's task
variables (``srun``, one task per device)."""
import re

from trainer.errors import UsageError


def elastic_resume(resume, env):
    """(resume, notes): an attempt that torchrun restarted (``TORCHELASTIC_RESTART_COUNT`` > 0) without
    --resume continues from the output folder's last checkpoint, as --resume auto does: the restart of a job
    is its continuation, never a new run (whose start would find the folder holding the first attempt's
    checkpoints and stop). The first attempt keeps --resume as given."""
    count = env.get("TORCHELASTIC_RESTART_COUNT", "")
    if resume is not None or not count.isdigit() or int(count) == 0:
        return resume, ()
    return "auto", ("torchrun restarted the workers (attempt {} of at most {}): resuming from the last "
                    "checkpoint (--resume auto)".format(int(count) + 1,
                                                        int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) + 1),)


def world_change(saved, cfg):
    """Notes for a resume whose world size differs from the checkpoint's (``saved``: its config), as after an
    elastic membership change (torchrun --nnodes MIN:MAX): the global batch -b is kept, and so the LR as given,
    so that each step sees the same images and the run continues as it would have at the old size."""
    before, now = (saved or {}).get("world_size"), cfg.launch.world_size
    if not before or not now or before == now:
        return ()
    b = cfg.run.batch_size
    return ("the world changed from {} to {} process(es) since the checkpoint: the global batch {} is kept ({} per "
            "device instead of {}), the LR {} as given".format(before, now, b, b // now, b // before, cfg.optim.lr),)


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
