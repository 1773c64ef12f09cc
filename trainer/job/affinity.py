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
"""
import os

from trainer.device import Device

MODES = ("auto", "on", "off")
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


def bind(section, kind, environ=None):
    """Bind this rank as ``section.cpu_binding`` says (a LaunchConfig). Returns what happened, for the log and
    ``summary.json``: mode, cpus (read back from the kernel), numa_nodes, or by / reason where nothing was bound."""
    import torch
    environ = os.environ if environ is None else environ
    mode = getattr(section, "cpu_binding", "auto")
    out = {"mode": mode, "cpus": None}
    if not hasattr(os, "sched_setaffinity"):
        return dict(out, reason="this OS has no sched_setaffinity")
    if mode == "off" or (mode == "auto" and not Device.of(kind).binds_host_cores):
        return dict(out, reason="--cpu-binding off" if mode == "off" else "a CPU run binds nothing unless asked")
    itself = Device.of(kind).runtime_binds_cores(environ)
    if itself:
        return dict(out, by=itself)
    cpus = sorted(os.sched_getaffinity(0))
    group = _cgroup_cpus()
    if mode == "auto" and group and len(cpus) < len(set(group)):
        return dict(out, cpus=cpus, reason="already bound before start (taskset or numactl): kept")
    nodes = numa_nodes(cpus)
    local = section.local_rank or 0
    mine, on_nodes = plan(cpus, nodes, local, max(1, section.procs_per_node))
    _set_all_threads(mine)
    _state["node_cpus"] = len(cpus)
    got = sorted(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    if "OMP_NUM_THREADS" not in environ and threads > len(got):
        torch.set_num_threads(len(got))  # one compute thread per core of the slice, not per core of the host
    return dict(out, cpus=got, numa_nodes=on_nodes, numa_nodes_seen=len(nodes), of=len(cpus),
                local_rank=local, ranks_per_node=max(1, section.procs_per_node), threads=torch.get_num_threads())


def node_cpus():
    """The cores the node's ranks share where this rank bound itself (the workers' count comes from them), else
    None."""
    return _state["node_cpus"]


def describe(bound):
    """The log line of ``bind``'s result."""
    if bound.get("by"):
        return "=> cpu binding: left to {}".format(bound["by"])
    if not bound.get("numa_nodes") and bound.get("reason"):
        return "=> cpu binding: none ({})".format(bound["reason"])
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
