"""Meeting the other ranks: a one-node job's master checked to be this host, the store the group starts from
(arrivals recorded, so a timeout names who did not come), every rendezvous failure as one line (``RendezvousError``,
exit 1), and a peer failure as one line naming the peer the store blames.

A fresh store per torchrun attempt: since torch 2.4 the workers share the agent's TCPStore across attempts, with no
prefix, so a restarted gloo may read a dead peer's address and give up (``Gloo connectFullMesh failed ...
Connection refused``; pytorch/pytorch#135712 for NCCL). Rank 0 opens its own store and publishes ``port:nonce`` in
the agent's; the others accept it only if it holds that nonce.
"""
import contextlib
import datetime
import ipaddress
import os
import re
import secrets
import socket
import time

from trainer.job import held_stderr
from trainer.errors import UsageError
from trainer.record.lock import proc_stat

ATTEMPT_KEY = "trainer/attempt-store"
NONCE_KEY = "trainer/nonce"
ARRIVED = "trainer/arrived/{}"  # a rank came: its process (_this_process)
CAME = "trainer/came/{}"  # counters (read without a wait): a rank came,
SAW = "trainer/saw/{}"  # caught a failure of the group,
FAILED = "trainer/failed/{}"  # ended with a failure of its own (record_failure),
GONE = "trainer/gone/{}"  # has ended, as a rank of its machine saw
STORE_ERRORS = (RuntimeError, OSError)  # what a store raises (torch 2.1: TimeoutError on a connection timeout)
PROBE_SECONDS = 3.0  # a connection to an entry of a previous attempt is given up after this long, then read again


class RendezvousError(UsageError):
    """A rendezvous or peer failure: one line, exit code 1 (nothing typed was wrong); also summary.json's error."""

    exit_code = 1


def show_traces():
    """TORCH_SHOW_CPP_STACKTRACES=1: failures raise with torch's own traceback."""
    return os.environ.get("TORCH_SHOW_CPP_STACKTRACES", "") not in ("", "0")


def is_local_address(host):
    """Whether ``host`` is this machine (loopback, or an interface's address); None if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0].split("%", 1)[0]
        try:
            if ipaddress.ip_address(ip).is_loopback:
                return True
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((ip, 0))  # fails with EADDRNOTAVAIL unless an interface of this machine holds ip
            return True
        except (ValueError, OSError):
            continue
    return False


def check_master(section):
    """A one-node job's master is this machine (`--world-size N --rank R` may be one machine: not checked)."""
    one_node = section.nodes == 1 and (section.mode == "spawn" or section.procs_per_node >= section.world_size)
    if not one_node or section.world_size == 1 or section.mode == "single" or not section.dist_url.startswith("env://"):
        return
    local = is_local_address(section.addr)
    if local is None:
        raise UsageError("the master address '{}' (--addr or MASTER_ADDR) does not resolve: on one node leave --addr "
                         "out (127.0.0.1), or give this machine's name or address".format(section.addr))
    if not local:
        raise UsageError("the master address {} (--addr or MASTER_ADDR) is not an address of this machine, and this "
                         "job has one node: every rank would wait --dist-timeout {:g} s for a master that never "
                         "starts; leave --addr out (127.0.0.1) or give this machine's address".format(
                             section.addr, section.dist_timeout))


def _tcp_store(host, port, is_master, seconds):
    import torch  # not at the top: the launch's checks answer before torch is imported
    # world_size -1: "not waited for", the one spelling every torch takes (1.11's int argument has no None)
    return torch.distributed.TCPStore(host, port, -1, is_master, datetime.timedelta(seconds=seconds),
                                      wait_for_workers=False)


def _attempt_store(section, deadline, where):
    """This torchrun attempt's own store (module docstring), found through the agent's."""
    agent = _tcp_store(section.addr, section.port, False, max(1.0, deadline - time.time()))
    if section.rank == 0:
        nonce = secrets.token_hex(8)
        own = _tcp_store(section.addr, 0, True, section.dist_timeout)
        own.set(NONCE_KEY, nonce)
        agent.set(ATTEMPT_KEY, "{}:{}".format(own.port, nonce))
        return own
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise RendezvousError("rank {} of {}: rank 0 did not open this attempt's store within --dist-timeout "
                                  "{:g} s at {}; see rank 0's output".format(section.rank, section.world_size,
                                                                             section.dist_timeout, where))
        agent.set_timeout(datetime.timedelta(seconds=left))
        port, nonce = agent.get(ATTEMPT_KEY).decode().split(":")
        with contextlib.suppress(*STORE_ERRORS):  # an entry of an attempt that died: its store is gone
            with quiet_stderr(replay=False):  # c10d's lines about a store that is gone are expected here
                own = _tcp_store(section.addr, int(port), False, min(PROBE_SECONDS, left))
            if own.get(NONCE_KEY).decode() == nonce:
                own.set_timeout(datetime.timedelta(seconds=section.dist_timeout))
                return own
        time.sleep(0.2)


def open_store(section, env=None):
    """The store for ``init_process_group`` once every rank arrived; None under torch_npu_run (it opens its own)."""
    env = os.environ if env is None else env
    if env.get("TORCH_NPU_USE_PARALLEL_TCPSTORE") == "True":
        return None  # torch_npu_run: torch_npu turns env:// into its agent's parallel store (per-attempt prefix)
    deadline = time.time() + section.dist_timeout
    where = "{}:{}".format(section.addr, section.port)
    try:
        if (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and env.get("MASTER_ADDR") == section.addr
                and env.get("MASTER_PORT") == str(section.port)):  # torchrun's agent serves every attempt
            store = _attempt_store(section, deadline, where)
        else:
            store = _tcp_store(section.addr, section.port, section.rank == 0, section.dist_timeout)
    except STORE_ERRORS as exc:
        if "in use" in str(exc).lower() or "EADDRINUSE" in str(exc):
            raise UsageError("port {} on {} is in use: pass --port N with a free port, or --port 0 to pick "
                             "one".format(section.port, section.addr))
        raise RendezvousError("rank {} of {} could not reach the master at {} within --dist-timeout {:g} s ({}): "
                              "start rank 0 first, or give every rank the same --addr and --port (node 0's)".format(
                                  section.rank, section.world_size, where, section.dist_timeout, _first(exc)))
    store.set(ARRIVED.format(section.rank), _this_process())
    store.add(CAME.format(section.rank), 1)
    keys = [ARRIVED.format(r) for r in range(section.world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=max(1.0, deadline - time.time())))
    except STORE_ERRORS as exc:
        raise RendezvousError(_timeout_line(store, section, where, exc))
    return store


def _timeout_line(store, section, where, exc):
    try:
        came = [r for r in range(section.world_size) if _count(store, CAME.format(r))]
    except STORE_ERRORS:  # the store went away (rank 0 ended)
        return "rank {} of {}: the rendezvous at {} ended before every rank arrived ({}): rank 0 stopped; see its " \
               "output".format(section.rank, section.world_size, where, _first(exc))
    missing = [r for r in range(section.world_size) if r not in came]
    return ("rendezvous timed out after --dist-timeout {:g} s at {}: rank(s) {} of {} arrived, rank(s) {} did not: "
            "start them (each node with the same --addr and --port), or raise --dist-timeout".format(
                section.dist_timeout, where, _ranks(came), section.world_size, _ranks(missing)))


def _ranks(ranks):
    return ",".join(map(str, ranks)) if ranks else "none"


def _first(exc):
    """The first line of torch's message, without its source reference ("[.../pair.cc:545] ") and advice."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    line = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", lines[0])
    return line.split(". This is typically", 1)[0][:200]


@contextlib.contextmanager
def quiet_stderr(replay=True):
    """torch's C++ output on fd 2 while the group starts, held back (held_stderr): written out after a success
    (``replay``), dropped after a failure reported as one line (kept with TORCH_SHOW_CPP_STACKTRACES=1)."""
    with held_stderr.hold(replay or show_traces(), watch_signals=replay) as held:
        try:
            yield
        except RendezvousError:
            held.drop = not show_traces()
            raise
        except STORE_ERRORS:
            held.drop = not replay and not show_traces()
            raise


_REFUSED = ("Connection refused", "connectFullMesh")
_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Read error", "Write error",
         "ECONNRESET", "EPIPE", "Socket Timeout", "NCCL communicator was aborted", "remote process exited",
         "HCCL", "hccl")
_TIMEOUT = ("Timed out", "timed out", "Timeout", "timeout")


def failure_kind(exc):
    """"refused", "peer" or "timeout" for an error of the process group, else None."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "out of memory" in text.lower():
        return None
    if any(p in text for p in _REFUSED):
        return "refused"
    if any(p in text for p in _PEER):
        return "peer"
    if ("gloo" in text.lower() or "ProcessGroup" in text or "c10d" in text) and any(p in text for p in _TIMEOUT):
        return "timeout"
    return None


def init_failure(exc, section):
    """The one line for ``init_process_group`` failing after every rank had arrived (None: not ours)."""
    if failure_kind(exc) is None:
        return None
    return RendezvousError("rank {} of {} could not connect to its peers ({}): each rank must reach every other "
                           "on the address its hostname resolves to; on several interfaces set GLOO_SOCKET_IFNAME "
                           "(gloo) or HCCL_IF_IP (hccl)".format(section.rank, section.world_size, _first(exc)))


def peer_failure(exc, section, store, wait=2.0):
    """The one line for a collective that failed mid-run because of a peer, or None (this rank's own error)."""
    kind = failure_kind(exc)
    if kind is None or store is None or section.world_size <= 1:
        return None
    blamed = _blamed(section, store, wait)
    if not blamed:
        return None
    where = ("its log: torchrun --log-dir's attempt folder, or that node's console" if os.environ.get(
        "TORCHELASTIC_RUN_ID") else "that process's own output")
    return ("rank {} of {} stopped: rank(s) {} {} ({}); see {}; continue with --resume auto".format(
        section.rank, section.world_size, _ranks(blamed), "stopped answering" if kind == "timeout" else "failed",
        _first(exc), where))


def record_failure(store, rank, wait=2.0):
    """Say in the store that ``rank`` ends with a failure of its own, so that the ranks it cuts off blame it."""
    if store is None:
        return
    with contextlib.suppress(*STORE_ERRORS), quiet_stderr(replay=False):
        store.set_timeout(datetime.timedelta(seconds=wait))
        store.add(FAILED.format(rank), 1)


def _blamed(section, store, wait):
    """The ranks to blame, looked for during ``wait`` s: those that recorded a failure, else those that ended, rank 0
    if its store is gone, else the silent ones when most of the job reported the failure (a hang)."""
    me, peers = section.rank, [r for r in range(section.world_size) if r != section.rank]
    try:
        with quiet_stderr(replay=False):  # c10d's lines about a store that is gone are expected here
            store.set_timeout(datetime.timedelta(seconds=max(1.0, wait)))
            store.add(SAW.format(me), 1)
            failed = [r for r in peers if _count(store, FAILED.format(r))]
            if failed:
                return failed
            here, processes = _machine(), {r: store.get(ARRIVED.format(r)).decode() for r in peers}
            deadline = time.time() + wait
            while True:
                gone = [r for r in peers if _count(store, GONE.format(r))]
                for r in peers:
                    if r not in gone and here and _ended_here(processes[r], here):
                        store.add(GONE.format(r), 1)  # for the ranks of other machines
                        gone.append(r)
                if gone:
                    return sorted(gone)
                if time.time() >= deadline:
                    break
                time.sleep(0.1)
            silent = [r for r in peers if not _count(store, SAW.format(r))]
            return silent if section.world_size - len(silent) > len(silent) else []
    except STORE_ERRORS:
        return [0] if me != 0 else []


def _count(store, key):
    return int(store.add(key, 0))


def _this_process():
    """``host:pid:start:machine``, recorded on arrival: a rank of the same machine can tell when this one ended."""
    return "{}:{}:{}:{}".format(socket.gethostname(), os.getpid(), proc_stat(os.getpid()), _machine())


def _machine():
    """This boot and pid namespace ("" where /proc does not say): processes of one value see each other's pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return "{}/{}".format(f.read().strip(), os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _ended_here(process, here):
    """Whether ``process`` (``_this_process``) ran on machine ``here`` and has ended (gone, zombie, pid reused)."""
    _, pid, start, machine = process.rsplit(":", 3)
    if machine != here:
        return False
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or (start != "None" and fields[19] != start)
