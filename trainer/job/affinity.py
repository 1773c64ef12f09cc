"""CPU core binding (``--cpu-binding``): each rank of a node, and the data-loader workers it starts, on a contiguous
slice of the cores this process may use, NUMA node by NUMA node where the kernel tells them.

Called once where every rank starts (``run.worker``: spawn's ranks, torchrun's and the shell loops' processes,
the ModelZoo drivers' ranks), before the device and the loaders exist, so that every thread and child the rank
makes inherits the slice:

    auto  bind on an accelerator (the kind's ``binds_host_cores``), not on a CPU run; on; off.
    A rank whose runtime binds by itself (torch_npu with ``CPU_AFFINITY_CONF`` set) is left to it; a process
    already bound to fewer cores than its control group gives it (``taskset``/``numactl`` before main.py) keeps
    its binding.

The slice: the node's ranks are spread over the NUMA nodes in order (ranks 0..k-1 on the first, ...), and each
node's cores are split evenly among its ranks (contiguous runs of core ids); with one NUMA node, or none known,
the cores themselves are split. The result (what the kernel reports back) goes to the log and ``summary.json``.

Compute threads (``torch.set_num_threads``), bound or not: a bound rank runs one per core of its slice; on a device
whose ops run on the host's cores (a CPU: ``computes_on_host_cores``) each of a node's several unbound ranks runs
its share, ``max(1, cores // ranks on the node)`` of the cores it may use (``sched_getaffinity``), or all of them
where a launcher bound each rank before start (``taskset`` per rank, ``srun --cpu-bind``: this process on fewer
cores than the one that started it). ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) set by the user wins; torchrun's
own ``OMP_NUM_THREADS=1``, which it sets for several processes per node where the user set none, does not.
"""
import os

from trainer.device import Device
from trainer.record.lock import PARENT, proc_stat

MODES = ("auto", "on", "off")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's own thread count comes from these
NODE_ROOT = "/sys/devices/system/node"
_state = {"node_cpus": None}  # the cores the node's ranks share, once this rank bound itself


def parse_cpulist(text):
    """``0-3,8,10-11`` (the kernel's list format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out = []
    for part in text.strip().split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _read_list(path):
    try:
        with open(path) as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError):
        return None


def numa_nodes(cpus, root=NODE_ROOT):
    """The NUMA nodes' cores among ``cpus``, node by node in id order (nodes without such cores left out);
    [cpus] where the kernel tells no nodes."""
    nodes = []
    try:
        names = sorted((n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
    except OSError:
        names = []
    allowed = set(cpus)
    for name in names:
        listed = _read_list(os.path.join(root, name, "cpulist")) or []
        mine = [c for c in listed if c in allowed]
        if mine:
            nodes.append(mine)
    return nodes or [sorted(cpus)]


def _split(items, parts, index):
    """Part ``index`` of ``items`` cut into ``parts`` contiguous runs as even as can be (at least one item)."""
    lo, hi = index * len(items) // parts, (index + 1) * len(items) // parts
    return items[lo:hi] if hi > lo else [items[(index * len(items)) // parts % len(items)]]


def plan(cpus, nodes, slot, per_node):
    """The cores of the rank at ``slot`` (its local rank: 0..per_node-1 among the node's ``per_node`` ranks, never
    a device id), and the NUMA nodes (indices) they lie on."""
    per_node = max(1, per_node)
    if per_node >= len(nodes):
        node = slot * len(nodes) // per_node
        first = -(-node * per_node // len(nodes))  # the first rank of that node
        count = -(-(node + 1) * per_node // len(nodes)) - first
        return _split(nodes[node], count, slot - first), [node]
    mine = _split(list(range(len(nodes))), per_node, slot)
    return sorted(c for n in mine for c in nodes[n]), mine


def _cgroup_cpus():
    """The cores the control group gives this process (cgroup v2), else the online ones; None if unknown."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"):
        got = _read_list(path)
        if got:
            return got
    return None


def _set_all_threads(cpus):
    """The affinity of every thread of this process (``sched_setaffinity(0)`` sets the calling thread only)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def _initial_environ(pid):
    """The environment process ``pid`` started with (``/proc/PID/environ``: what it changed later is not there),
    or None where it cannot be read."""
    try:
        with open("/proc/{}/environ".format(pid), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def user_threads(environ=None):
    """The thread count the user set (``NAME=value``, the first of THREAD_VARIABLES set), else None. Under torchrun
    (``TORCHELASTIC_RUN_ID``) an ``OMP_NUM_THREADS`` that torchrun itself set (its default for several processes
    per node) is not the user's: torchrun's process (the nearest ancestor started outside torchrun) did not start
    with it. Where that cannot be read, the value counts as the user's."""
    environ = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        if environ.get(name, "").strip():
            value = "{}={}".format(name, environ[name].strip())
            if name == "OMP_NUM_THREADS" and environ.get("TORCHELASTIC_RUN_ID") and environ is os.environ:
                pid = os.getppid()
                for _ in range(16):  # torchrun -> (a --no-python wrapper) -> this process
                    start = _initial_environ(pid) if pid and pid > 1 else None
                    if start is None:
                        return value
                    if "TORCHELASTIC_RUN_ID" not in start:  # torchrun's process: what it was started with
                        return value if start.get(name, "").strip() else None
                    pid = proc_stat(pid, PARENT)
            return value
    return None


def _bound_before_start(cpus):
    """This process runs on fewer cores than the one that started it: a launcher bound it alone (``taskset`` in a
    per-rank loop, ``srun --cpu-bind``), so its cores are its own."""
    try:
        parent = os.sched_getaffinity(os.getppid())
    except (OSError, AttributeError):
        return False
    return set(cpus) < set(parent)


def share_threads(section, kind, environ=None):
    """On a device whose ops run on the host's cores, the compute threads of one of a node's several unbound ranks:
    its share of the cores (module docstring). Sets them (``torch.set_num_threads``) and returns ``threads`` and
    ``threads_from`` (why that many) for the log and ``summary.json``."""
    import torch
    user = user_threads(environ)
    per_node = max(1, section.procs_per_node or 1)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if user:
        why = "{} (set before start)".format(user)
    elif not Device.of(kind).computes_on_host_cores:
        why = "as the process started (its device computes off the host)"
    elif per_node == 1:
        why = "torch's default: the one rank on this node"
    elif _bound_before_start(cpus):
        torch.set_num_threads(len(cpus))
        why = "this rank's {} core(s), bound before start".format(len(cpus))
    else:
        torch.set_num_threads(max(1, len(cpus) // per_node))
        why = "its share of {} core(s) among {} ranks on this node".format(len(cpus), per_node)
    return {"threads": torch.get_num_threads(), "threads_from": why}


def bind(section, kind, environ=None):
    """Bind this rank as ``section.cpu_binding`` says (a LaunchConfig), and set its compute threads. Returns what
    happened, for the log and ``summary.json``: mode, cpus (read back from the kernel), numa_nodes, or by / reason
    where nothing was bound; threads and threads_from."""
    import torch
    mode = getattr(section, "cpu_binding", "auto")
    out = {"mode": mode, "cpus": None}
    if not hasattr(os, "sched_setaffinity"):
        return dict(out, reason="this OS has no sched_setaffinity", **share_threads(section, kind, environ))
    if mode == "off" or (mode == "auto" and not Device.of(kind).binds_host_cores):
        return dict(out, reason="--cpu-binding off" if mode == "off" else "a CPU run binds nothing unless asked",
                    **share_threads(section, kind, environ))
    environ = os.environ if environ is None else environ
    itself = Device.of(kind).runtime_binds_cores(environ)
    if itself:
        return dict(out, by=itself, **share_threads(section, kind, environ))
    cpus = sorted(os.sched_getaffinity(0))
    group = _cgroup_cpus()
    if mode == "auto" and group and len(cpus) < len(set(group)):
        return dict(out, cpus=cpus, reason="already bound before start (taskset or numactl): kept",
                    **share_threads(section, kind, environ))
    nodes = numa_nodes(cpus)
    local = section.local_rank or 0
    mine, on_nodes = plan(cpus, nodes, local, max(1, section.procs_per_node))
    _set_all_threads(mine)
    _state["node_cpus"] = len(cpus)
    got = sorted(os.sched_getaffinity(0))
    user = user_threads(environ)
    if not user and (torch.get_num_threads() > len(got) or environ.get("OMP_NUM_THREADS")):  # (torchrun's 1)
        torch.set_num_threads(len(got))  # one compute thread per core of the slice, not per core of the host
    return dict(out, cpus=got, numa_nodes=on_nodes, numa_nodes_seen=len(nodes), of=len(cpus),
                local_rank=local, ranks_per_node=max(1, section.procs_per_node), threads=torch.get_num_threads(),
                threads_from="{} (set before start)".format(user) if user else "one per core of the slice")


def node_cpus():
    """The cores the node's ranks share where this rank bound itself (the workers' count comes from them), else
    None."""
    return _state["node_cpus"]


def describe(bound):
    """The log line of ``bind``'s result."""
    threads = "; {} compute thread(s): {}".format(bound["threads"], bound["threads_from"]) \
        if "threads_from" in bound else ""
    if bound.get("by"):
        return "=> cpu binding: left to {}{}".format(bound["by"], threads)
    if not bound.get("numa_nodes") and bound.get("reason"):
        return "=> cpu binding: none ({}){}".format(bound["reason"], threads)
    return "=> cpu binding: local rank {} of {} on cores {} ({} of {}; NUMA node {} of {}; {} threads)".format(
        bound["local_rank"], bound["ranks_per_node"], format_cpulist(bound["cpus"]), len(bound["cpus"]),
        bound["of"], ",".join(str(n) for n in bound["numa_nodes"]), bound["numa_nodes_seen"], bound["threads"])


def format_cpulist(cpus):
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    runs, cpus = [], sorted(cpus)
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else "{}-{}".format(a, b) for a, b in runs)
