"""CPU core binding (``--cpu-binding`` auto | on | off; auto: on an accelerator): each rank of a node, set before
its device and loaders exist, on a contiguous slice of its cores, NUMA node by NUMA node. Left alone: a runtime
that binds itself (torch_npu with ``CPU_AFFINITY_CONF``), a process already bound (``taskset``/``numactl``).
Compute threads: one per core of a bound rank's slice; on a CPU, each of several unbound ranks gets its share
(all its cores where a launcher bound it). The user's OMP_NUM_THREADS wins, torchrun's own =1 does not.
"""
import contextlib
import os

from trainer.device import Device
from trainer.record.lock import PARENT, proc_stat

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's own thread count comes from these
NODE_ROOT = "/sys/devices/system/node"
_state = {"node_cpus": None}  # the cores the node's ranks share, once this rank bound itself


def parse_cpulist(text):
    """``0-3,8,10-11`` (the kernel's list format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out = []
    for part in text.strip().split(","):
        if part.strip():
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
    """The NUMA nodes' cores among ``cpus`` in node order (empty nodes left out); [cpus] where none are known."""
    try:
        names = sorted((n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
    except OSError:
        names = []
    allowed = set(cpus)
    nodes = [[c for c in _read_list(os.path.join(root, n, "cpulist")) or [] if c in allowed] for n in names]
    return [n for n in nodes if n] or [sorted(cpus)]


def _split(items, parts, index):
    """Part ``index`` of ``items`` cut into ``parts`` contiguous runs as even as can be (at least one item)."""
    lo, hi = index * len(items) // parts, (index + 1) * len(items) // parts
    return items[lo:hi] if hi > lo else [items[(index * len(items)) // parts % len(items)]]


def plan(cpus, nodes, slot, per_node):
    """The cores of the rank at ``slot`` (its local rank among ``per_node``) and the NUMA nodes they lie on."""
    per_node = max(1, per_node)
    if per_node >= len(nodes):
        node = slot * len(nodes) // per_node
        first = -(-node * per_node // len(nodes))  # the first rank of that node
        count = -(-(node + 1) * per_node // len(nodes)) - first
        return _split(nodes[node], count, slot - first), [node]
    mine = _split(list(range(len(nodes))), per_node, slot)
    return sorted(c for n in mine for c in nodes[n]), mine


def _set_all_threads(cpus):
    """The affinity of every thread of this process (``sched_setaffinity(0)`` sets the calling thread only)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def _initial_environ(pid):
    """The environment process ``pid`` started with (``/proc/PID/environ``), or None where unreadable."""
    try:
        with open("/proc/{}/environ".format(pid), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def user_threads(environ=None):
    """The user's ``NAME=value`` thread count, else None (not torchrun's OMP_NUM_THREADS: one its process lacked)."""
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
    """This process runs on fewer cores than its parent: a launcher bound it alone, so its cores are its own."""
    try:
        parent = os.sched_getaffinity(os.getppid())
    except (OSError, AttributeError):
        return False
    return set(cpus) < set(parent)


def share_threads(section, kind, environ=None):
    """Sets an unbound rank's compute threads (module docstring); returns ``threads`` and ``threads_from`` (why)."""
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
    """Bind this rank as ``section.cpu_binding`` says and set its compute threads; returns what happened."""
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
    # the cores the control group gives this process (cgroup v2), else the online ones
    group = _read_list("/sys/fs/cgroup/cpuset.cpus.effective") or _read_list("/sys/devices/system/cpu/online")
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
    """The cores the node's ranks share where this rank bound itself (the workers' count comes from them)."""
    return _state["node_cpus"]


def describe(bound):
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
