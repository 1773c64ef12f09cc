"""Meeting the other ranks: where the master is (a ``tcp://`` URL read as env:// at its host and port; a one-node
job's master checked to be this host before any wait), the store the process group starts from (arrivals
recorded, so that a timeout names the ranks that did not come; a fresh store for each torchrun attempt), every
rendezvous failure as one line (``RendezvousError``, exit 1), and a peer failure as one line naming the peer where
the store holds evidence against it (``peer_failure``; a rank's own error keeps its traceback).

Why a fresh store per torchrun attempt: since torch 2.4 the c10d rendezvous of torchrun shares its agent's
TCPStore with the workers (``TORCHELASTIC_USE_AGENT_STORE=True``), one store for every attempt of the job, and
torch's ``env://`` handler adds no per-attempt prefix. A restarted group then finds the keys of the attempt that
died: gloo reads a dead peer's address before the restarted peer has written its own, is refused, retries 3 times
in a second and gives up (``Gloo connectFullMesh failed ... Connection refused``), which only happens when the
peer is slow to start, that is on a loaded machine (pytorch/pytorch#135712 reports the same for NCCL's unique id).
``TORCHELASTIC_RESTART_COUNT`` cannot serve as a prefix: each agent counts its own restarts, so the nodes of one
attempt may disagree. Instead rank 0 opens a store of its own for the attempt on a free port and publishes
``port:nonce`` in the agent's store; the other ranks connect to what they read there and accept it only if that
store holds the same nonce, so that a stale entry (a dead store, or another attempt's) is read again.
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
SAW = "trainer/saw/{}"  # counters: a rank caught a failure of the group,
FAILED = "trainer/failed/{}"  # ended with a failure of its own (record_failure),
GONE = "trainer/gone/{}"  # has ended, as a rank of its machine saw
STORE_ERRORS = (RuntimeError, OSError)  # what a store raises (torch 2.1: TimeoutError on a connection timeout)
PROBE_SECONDS = 3.0  # a connection to an entry of a previous attempt is given up after this long, then read again
SHOW_TRACES = "TORCH_SHOW_CPP_STACKTRACES"  # set to 1: failures raise with torch's own traceback


class RendezvousError(UsageError):
    """A rendezvous or peer failure: one line (``error: ...``), exit code 1 (the job failed; nothing typed
    was wrong). Its ``line`` also goes into summary.json's ``error``."""

    exit_code = 1


def show_traces():
    return os.environ.get(SHOW_TRACES, "") not in ("", "0")


# ---------------------------------------------------------------- the master's address


def read_url(url, addr, port, addr_given, port_given):
    """(url, addr, port, notes): a ``tcp://HOST:PORT`` --dist-url is read as env:// with HOST:PORT as the master
    (MASTER_ADDR, MASTER_PORT), on every device: what the porting guides' commands mean by it (their NPU code
    meets through environment variables only), and the same store torch's tcp:// would open."""
    if not url.startswith("tcp://"):
        return url, addr, port, ()
    rest = url[len("tcp://"):].split("?", 1)[0].rstrip("/")
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError("--dist-url '{}' is not tcp://HOST:PORT (a port 0-65535)".format(url))
    ignored = [name for name, given, value, mine in (("--addr", addr_given, addr, host),
                                                      ("--port", port_given, port, int(port_text)))
               if given and str(value) != str(mine)]
    note = "--dist-url {}: the ranks meet at {}:{} (env://, MASTER_ADDR and MASTER_PORT){}".format(
        url, host, port_text, "; {} ignored".format(" and ".join(
            "{} {}".format(n, addr if n == "--addr" else port) for n in ignored)) if ignored else "")
    return "env://", host, int(port_text), (note,)


def is_local_address(host):
    """True if ``host`` names this machine (loopback, or an address one of its interfaces holds), False if not,
    None if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0].split("%", 1)[0]
        try:
            if ipaddress.ip_address(ip).is_loopback:
                return True
        except ValueError:
            continue
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((ip, 0))  # fails with EADDRNOTAVAIL unless an interface of this machine holds ip
            return True
        except OSError:
            pass
    return False


def check_master(section):
    """Before any wait: a one-node job's master (--addr, MASTER_ADDR or the tcp:// URL's host) is this machine.
    (Jobs of several nodes are not checked: `--world-size N --rank R` may be N processes of one machine.)"""
    if section.world_size == 1 or section.mode == "single" or not section.dist_url.startswith("env://"):
        return
    one_node = section.mode == "spawn" or section.procs_per_node >= section.world_size
    if section.nodes == 1 and one_node:
        local = is_local_address(section.addr)
        if local is None:
            raise UsageError("the master address '{}' (--addr or MASTER_ADDR) does not resolve: on one node "
                             "leave --addr out (127.0.0.1), or give this machine's name or address".format(
                                 section.addr))
        if not local:
            raise UsageError("the master address {} (--addr or MASTER_ADDR) is not an address of this machine, and "
                             "this job has one node: every rank would wait --dist-timeout {:g} s for a master that "
                             "never starts; leave --addr out (127.0.0.1) or give this machine's address".format(
                                 section.addr, section.dist_timeout))


# ---------------------------------------------------------------- the store the group starts from


def _tcp_store(host, port, is_master, seconds):
    import torch  # here, not at the top: the launch's checks (trainer/job/launch.py) answer before torch is imported
    return torch.distributed.TCPStore(host, port, None, is_master, datetime.timedelta(seconds=seconds),
                                      wait_for_workers=False)


def _agent_serves(section, env):
    """torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT, for every attempt of the job."""
    return (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and env.get("MASTER_ADDR") == section.addr
            and env.get("MASTER_PORT") == str(section.port))


def _attempt_store(section, deadline):
    """A store of this torchrun attempt's own (see the module's docstring), found through the agent's."""
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
            raise _Timeout("rank 0 did not open this attempt's store")
        agent.set_timeout(datetime.timedelta(seconds=left))
        port, nonce = agent.get(ATTEMPT_KEY).decode().split(":")
        try:
            with quiet_stderr(replay=False):  # c10d's lines about a store that is gone are expected here
                own = _tcp_store(section.addr, int(port), False, min(PROBE_SECONDS, left))
            if own.get(NONCE_KEY).decode() == nonce:
                own.set_timeout(datetime.timedelta(seconds=section.dist_timeout))
                return own
        except STORE_ERRORS:
            pass  # an entry of an attempt that died: its store is gone
        time.sleep(0.2)


class _Timeout(Exception):
    pass


def open_store(section, env=None):
    """The store for ``init_process_group`` (env://), with every rank's arrival recorded and awaited until
    --dist-timeout; a rendezvous failure is a RendezvousError naming who came and who did not. None under
    torch_npu_run, whose workers meet through the store torch_npu opens itself from env://."""
    env = os.environ if env is None else env
    if env.get("TORCH_NPU_USE_PARALLEL_TCPSTORE") == "True":
        return None  # torch_npu_run: torch_npu turns env:// into its agent's parallel store (per-attempt prefix)
    deadline = time.time() + section.dist_timeout
    where = "{}:{}".format(section.addr, section.port)
    try:
        if _agent_serves(section, env):
            store = _attempt_store(section, deadline)
        else:
            store = _tcp_store(section.addr, section.port, section.rank == 0, section.dist_timeout)
    except _Timeout as exc:
        raise RendezvousError("rank {} of {}: {} within --dist-timeout {:g} s at {}; see rank 0's output".format(
            section.rank, section.world_size, exc, section.dist_timeout, where))
    except STORE_ERRORS as exc:
        if _in_use(str(exc)):
            raise UsageError("port {} on {} is in use: pass --port N with a free port, or --port 0 to pick "
                             "one".format(section.port, section.addr))
        raise RendezvousError("rank {} of {} could not reach the master at {} within --dist-timeout {:g} s ({}): "
                              "start rank 0 first, or give every rank the same --addr and --port (node 0's)".format(
                                  section.rank, section.world_size, where, section.dist_timeout, _first(exc)))
    store.set(ARRIVED.format(section.rank), _this_process())
    keys = [ARRIVED.format(r) for r in range(section.world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=max(1.0, deadline - time.time())))
    except STORE_ERRORS as exc:
        raise RendezvousError(_timeout_line(store, section, where, exc))
    return store


def _timeout_line(store, section, where, exc):
    came, missing = [], []
    try:
        for r in range(section.world_size):
            (came if _has(store, ARRIVED.format(r)) else missing).append(r)
    except STORE_ERRORS:  # the store went away (rank 0 ended)
        return "rank {} of {}: the rendezvous at {} ended before every rank arrived ({}): rank 0 stopped; see its " \
               "output".format(section.rank, section.world_size, where, _first(exc))
    return ("rendezvous timed out after --dist-timeout {:g} s at {}: rank(s) {} of {} arrived, rank(s) {} did not: "
            "start them (each node with the same --addr and --port), or raise --dist-timeout".format(
                section.dist_timeout, where, _ranks(came), section.world_size, _ranks(missing)))


def _has(store, key):
    """Whether ``store`` holds ``key`` (torch before 2.2 binds no ``Store.check``: a wait of a moment instead)."""
    if hasattr(store, "check"):
        return store.check([key])
    try:
        with quiet_stderr(replay=False):
            store.wait([key], datetime.timedelta(milliseconds=20))
        return True
    except STORE_ERRORS as exc:
        if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
            return False
        raise


def _ranks(ranks):
    return ",".join(map(str, ranks)) if ranks else "none"


def _in_use(text):
    return "in use" in text.lower() or "EADDRINUSE" in text


def _first(exc):
    """The first line of torch's message, without its source reference ("[.../pair.cc:545] ") and its advice."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    line = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", lines[0])
    return line.split(". This is typically", 1)[0][:200]


@contextlib.contextmanager
def quiet_stderr(replay=True):
    """What torch's C++ side writes on file descriptor 2 while the group starts (c10d's socket warnings, gloo's
    retries) is held back (trainer/job/held_stderr.py): written out after a start that succeeded (``replay``), dropped
    after a failure that is reported as one line (kept with TORCH_SHOW_CPP_STACKTRACES=1). Written out, once,
    however else the hold ends: an exception, the process's exit, SIGINT or SIGTERM (a rank stopped by its
    supervisor, a driver or torchrun while it waits keeps its diagnostics)."""
    with held_stderr.hold(replay or show_traces(), watch_signals=replay) as held:
        try:
            yield
        except RendezvousError:
            held.drop = not show_traces()
            raise
        except STORE_ERRORS:
            held.drop = not replay and not show_traces()
            raise


# ---------------------------------------------------------------- failures of the group once it runs

_REFUSED = ("Connection refused", "connectFullMesh")
_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Read error", "Write error",
         "ECONNRESET", "EPIPE", "Socket Timeout", "NCCL communicator was aborted", "remote process exited",
         "HCCL", "hccl")
_TIMEOUT = ("Timed out", "timed out", "Timeout", "timeout")


def failure_kind(exc):
    """"refused", "peer" or "timeout" for an error of the process group, else None."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if "out of memory" in text.lower():
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
    kind = failure_kind(exc)
    if kind is None:
        return None
    return RendezvousError("rank {} of {} could not connect to its peers ({}): each rank must reach every other "
                           "on the address its hostname resolves to; on several interfaces set GLOO_SOCKET_IFNAME "
                           "(gloo) or HCCL_IF_IP (hccl)".format(section.rank, section.world_size, _first(exc)))


def peer_failure(exc, section, store, wait=2.0):
    """The one line for a collective that failed mid-run because of a peer, or None: not an error of the group,
    a job of one process, or nothing that blames a peer (``_blamed``); then the error is this rank's own and keeps
    its traceback (the caller records it: ``record_failure``)."""
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
    """Say in the store that ``rank`` ends with a failure of its own (an error it raised, a user error, a
    divergence, an interruption), so that the ranks its end cuts off blame it."""
    if store is None:
        return
    try:
        with quiet_stderr(replay=False):
            store.set_timeout(datetime.timedelta(seconds=wait))
            store.add(FAILED.format(rank), 1)
    except STORE_ERRORS:
        pass


def _blamed(section, store, wait):
    """The ranks the store's evidence blames for this rank's failure, looked for during ``wait`` s: those that
    recorded a failure of their own before it (``record_failure``); those whose process has ended (seen on this
    machine through the pid they arrived with, or recorded by a rank of theirs); rank 0 if the store, which it
    holds, is gone; the ranks that did not report the failure when more than half of the job did (a rank that
    hangs). [] if nothing blames a peer."""
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
    """``host:pid:start:machine``, what a rank records on arrival: enough for a rank of the same machine to tell
    whether this process has ended."""
    return "{}:{}:{}:{}".format(socket.gethostname(), os.getpid(), proc_stat(os.getpid()), _machine())


def _machine():
    """This boot of this machine and its pid namespace ("" where /proc does not say): processes of the same
    value see each other's pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return "{}/{}".format(f.read().strip(), os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _ended_here(process, here):
    """Whether the process recorded as ``process`` (``_this_process``) ran on machine ``here`` and has ended
    (gone, a zombie, or its pid taken by another process)."""
    _, pid, start, machine = process.rsplit(":", 3)
    if machine != here:
        return False
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or (start != "None" and fields[19] != start)
