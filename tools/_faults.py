"""The processes of tools/inject_faults.py: main.py (or its launcher) in a session of its own, its log read line by
line as it comes (every wait bounded), the run's processes from /proc (what a hang leaves, what a run left behind),
the FIFO wait that holds a checkpoint's write, and the launchers: each one's command, how a signal reaches it, its
checkpoint's writer, the tracebacks that are its own way to end. A run's processes are those whose environment holds
its tag (``TAG``): they inherit it wherever they go, into sessions of their own (torchrun's workers) and to another
parent (a worker whose agent died)."""
import os
import re
import select
import signal
import subprocess
import sys
import time

from trainer.job.launch import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_DROPPED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TAG = "INJECT_FAULTS_RUN"
SPAWN = ["--multiprocessing-distributed", "--world-size", "1", "--rank", "0", "--device-list", "0,1", "--port", "0",
         "--dist-timeout", "120"]
# --standalone's own, with a port of each run's (torch 1.11's --standalone takes port 29400, which two runs at a time
# would share): PORT is filled in as the run starts
PORT = "{port}"
TORCHRUN = ["-m", "torch.distributed.run", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:" + PORT,
            "--nnodes", "1", "--nproc_per_node", "2", "--max_restarts", "0"]
DRIVER = os.path.join(ROOT, "test", "train_full_1p.sh")  # ModelZoo's driver: its rank's log in train_0.log
LAUNCHERS = ("one", "spawn", "torchrun", "driver")
# how torchrun's agent ends at a signal it handles (SIGINT, SIGTERM): it raises SignalException, with a traceback
AGENT_SIGNALLED = re.compile(r"^[\w.]*SignalException: Process \d+ got signal")


def child_env(threads):
    """This environment without a cluster's or a launcher's variables; unbuffered, stacks dumped on SIGABRT."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_")) and k not in ENV_DROPPED}
    env.update(PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", OMP_NUM_THREADS=str(threads))
    return env


def tagged(tag):
    """[(pid, state, wchan, command)] of the processes whose environment holds ``TAG=tag`` (zombies included)."""
    mark, out = "{}={}".format(TAG, tag).encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/{}/environ".format(entry), "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            with open("/proc/{}/stat".format(entry)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/{}/wchan".format(entry)) as f:
                wchan = f.read().strip()
            with open("/proc/{}/cmdline".format(entry), "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120]
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(entry), fields[0], wchan, cmd))
    return out


class Child:
    """main.py (or its launcher) in a session of its own, tagged: its stdout read line by line as it comes, its
    stderr into a file. ``follow``: the file its log goes to instead (a ModelZoo driver's rank log, followed from
    its size now: a resumed run appends), its own output then beside its stderr."""

    def __init__(self, cmd, err_path, env, follow=None):
        self.err_path, self.lines, self._pending, self._buf, self.eof = err_path, [], [], b"", False
        self.tag, self.follow = "{}-{}".format(os.getpid(), os.path.abspath(err_path)), follow
        self._offset = os.path.getsize(follow) if follow and os.path.exists(follow) else 0
        with open(err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=err if follow else subprocess.PIPE, stderr=err, cwd=ROOT,
                                         env=dict(env, **{TAG: self.tag}), start_new_session=True)
        self.started = time.monotonic()

    def _chunk(self, left):
        """The output that came: bytes, b"" at its end, None where none came within ``left`` s."""
        if self.follow is None:
            fd = self.proc.stdout.fileno()
            return os.read(fd, 65536) if select.select([fd], [], [], min(left, 1.0))[0] else None
        ended = self.proc.poll() is not None  # before the read: what it wrote before it ended is read now
        try:
            with open(self.follow, "rb") as f:
                f.seek(self._offset)
                data = f.read(65536)
        except OSError:  # not there yet
            data = b""
        self._offset += len(data)
        if data or ended:
            return data
        time.sleep(min(left, 0.05))
        return None

    def processes(self):
        """The run's processes still there (its tag's)."""
        return tagged(self.tag)

    def read(self, until, deadline):
        """Lines until ``until(line)`` holds for one (True), the output ends (False) or ``deadline`` (None)."""
        while True:
            while self._pending:
                line = self._pending.pop(0)
                self.lines.append(line)
                if until is not None and until(line):
                    return True
            if self.eof:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            chunk = self._chunk(left)
            if chunk is None:
                continue
            if not chunk:
                self.eof, chunk = True, b"\n" if self._buf else b""
            parts = (self._buf + chunk).split(b"\n")
            self._buf = parts.pop()
            self._pending = [raw.decode("utf-8", "replace") for raw in parts]

    def finish(self, deadline):
        """Its output to the end and its exit code, or None past ``deadline``: then the run's processes are
        described (``hung``), made to print their Python stacks (SIGABRT) and killed."""
        done = self.read(None, deadline) is False
        try:
            code = self.proc.wait(max(0.0, deadline - time.monotonic())) if done else None
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            self.hung = self.processes()
            self.kill_all(signal.SIGABRT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            self.kill_all(signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        with open(self.err_path[:-len(".err")] + ".log", "w") as f:  # its stdout beside its stderr
            f.write("".join(line + "\n" for line in self.lines))
        return code

    def kill_all(self, sig):
        """``sig`` to every process of the run (as Slurm signals every process of a job step)."""
        for pid in [p[0] for p in self.processes() if p[1] != "Z"]:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def left(self, within=30.0):
        """The processes of the run left once it ended (waited for up to ``within`` s), then killed."""
        deadline = time.monotonic() + within
        while True:
            rest = [p for p in self.processes() if p[1] != "Z"]
            if not rest or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if rest:
            self.kill_all(signal.SIGKILL)
        return rest

    def stderr_tail(self, n=5):
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read().strip().splitlines()[-n:]
        except OSError:
            return []


def waits_in_open(pid):
    """Whether ``pid``'s main thread waits in open(2) for a FIFO's reader (the kernel's wait_for_partner; where
    /proc/PID/wchan names no function, its syscall is open or openat)."""
    try:
        with open("/proc/{}/wchan".format(pid)) as f:
            wchan = f.read().strip()
        if wchan not in ("", "0"):
            return wchan == "wait_for_partner"
        with open("/proc/{}/syscall".format(pid)) as f:
            return f.read().split()[0] in ("2", "56", "257")  # open (x86_64), openat (aarch64, x86_64)
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- the launchers


def run_args(a, launcher, workers):
    """The command of a configuration, without its output folder (``into`` adds it)."""
    sizes = ["--seed", "5", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-p", "1"]
    if launcher == "driver":  # its keys, then main.py's flags it passes on: the same main.py command as ``one``
        return ["bash", DRIVER, "--data_path=" + a.data, "--arch=" + a.arch, "--batch_size={}".format(a.batch_size),
                "--lr=0.1", "--epochs={}".format(a.epochs), "--device=cpu", "--workers={}".format(workers),
                "--precision=fp32", "--"] + sizes
    args = [a.data, "-a", a.arch, "-b", str(a.batch_size), "--lr", "0.1", "--epochs", str(a.epochs), "--device",
            "cpu", "-j", str(workers)] + sizes
    main = [os.path.join(ROOT, "main.py")] + args
    if launcher == "torchrun":
        return [sys.executable] + TORCHRUN + main
    return [sys.executable] + main + (SPAWN if launcher == "spawn" else [])


def into(cmd, out, resume=False):
    """``cmd`` writing into ``out`` (and continuing the run there): main.py's flags, or the driver's keys."""
    if cmd[0] == "bash":
        at = cmd.index("--")
        return cmd[:at] + ["--output_dir=" + out] + (["--resume=auto"] if resume else []) + cmd[at:]
    return cmd + ["--output-dir", out] + (["--resume", "auto"] if resume else [])


def start(cmd, out, err_path, env):
    """The run's process; for the driver (on this Python), its log is its rank's (train_0.log), its own output
    beside its stderr."""
    if cmd[0] != "bash":
        return Child([c.replace(PORT, str(free_port())) for c in cmd], err_path, env)
    return Child(cmd, err_path, dict(env, PYTHON=sys.executable), follow=os.path.join(out, "train_0.log"))


def writer(child, launcher):
    """The pid that writes the checkpoint: the process itself, or rank 0 of spawn, torchrun or the driver (its first
    rank started)."""
    if launcher == "one":
        return child.proc.pid
    ranks = []
    for pid, _, _, cmd in child.processes():
        if pid != child.proc.pid and ("spawn_main" in cmd if launcher == "spawn" else "main.py" in cmd):
            ranks.append(pid)
    return min(ranks) if ranks else None


def send(child, launcher, signum):
    """A stop signal as a launcher's users send it: to the process, or to torchrun's agent and every process it
    started (Slurm signals every process of a job step; a terminal's Ctrl-C and Kubernetes reach the agent, which
    passes SIGINT and SIGTERM on)."""
    if launcher == "torchrun":
        child.kill_all(signum)
    else:
        child.proc.send_signal(signum)


def tracebacks(text, launcher):
    """The last lines (the exception) of the tracebacks in ``text``, but torchrun's agent's at a signal: its way of
    ending there (KeyboardInterrupt where SIGINT came before it installed its handler, not in main.py's frames)."""
    out = []
    for block in re.split(r"^Traceback \(most recent call last\):$", text, flags=re.M)[1:]:  # a line of its own
        last = next((line for line in block.splitlines()[1:] if line and not line[0].isspace()), "")
        if launcher == "torchrun" and (AGENT_SIGNALLED.match(last) or  # raised by the agent's handler only
                                       last == "KeyboardInterrupt" and "main.py" not in block):
            continue  # the agent's own way to end at a signal (a second one while it stops the workers: chained;
            # SIGINT before its handler, while it imports: Python's KeyboardInterrupt, not a worker's, in main.py)
        out.append(last or "(no exception line)")
    return out
