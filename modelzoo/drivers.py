"""The ModelZoo-style drivers behind test/train_{full,performance}_{1p,8p,16p}.sh and test/train_cluster.sh: the plan
of the run (modelzoo/plan.py: arguments, recipe, output folder, command line), one main.py process per device started
the Ascend guides' way (RANK_ID / RANK_SIZE / LOCAL_RANK: the rank's slot on the node, DEVICE_ID: its device; a
log per rank; each rank binds its own cores; with RANK_TABLE_FILE the devices are this host's in the table),
supervision of those processes, and the ModelZoo report (modelzoo/acceptance.py). Several nodes (16p, cluster): one
driver per node, its processes started as the guide's loop on a node (LOCAL_RANK, --multiprocessing-distributed
--world-size NODES --rank NODE), rank = node rank x processes per node + local rank; node 0 writes the results.

    python3 -m modelzoo.drivers full|performance 1p|8p|16p|cluster [--key=value ...] [-- main.py flags]

Exit codes: 0 done, 1 the run failed, 2 bad input (one line on stderr), 3 a baseline check failed,
4 the run diverged, 130 / 143 interrupted.
"""
from trainer.job.stop import hold_stops, stops_blocked

if __name__ == "__main__":
    hold_stops()  # first, as main.py does: a stop signal while the driver imports is kept, never a traceback
import functools  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from modelzoo.plan import SCALES, command, parse, resolve, run_acceptance, tolerances, usage  # noqa: E402
from trainer import interpreter  # noqa: E402
from trainer.errors import UsageError, counted  # noqa: E402
from trainer.job.lifeline import die_with_parent  # noqa: E402

# ---------------------------------------------------------------- launch and supervise


def rank_env(p, r, port, env):
    e = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                                     "ROLE_RANK")}  # torchrun's would take precedence
    e["PYTHONUNBUFFERED"] = "1"
    for k, v in p.env.items():  # ModelZoo's ALLOW_HF32 / ALLOW_FP32 (None: removed)
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    if p.nodes > 1:  # one node of several: main.py works out the global rank from --rank (node) and LOCAL_RANK
        for k in ("RANK_ID", "RANK_SIZE"):
            e.pop(k, None)
        e.update(LOCAL_RANK=str(r), MASTER_ADDR=p.master_addr, MASTER_PORT=str(port))
    elif p.scale == "1p":
        for k in ("RANK_ID", "RANK_SIZE", "LOCAL_RANK"):
            e.pop(k, None)
        e["ASCEND_DEVICE_ID"] = str(p.device_id)
    else:  # the guides' shell loop, one process per device
        e.update(RANK_ID=str(p.rank_ids[r]), LOCAL_RANK=str(r), RANK_SIZE=str(p.world), MASTER_PORT=str(port))
        if p.table is None or p.master_addr:  # a rank table's server of rank 0 (named otherwise: main.py decides)
            e["MASTER_ADDR"] = p.master_addr or "127.0.0.1"
    if p.scale != "1p":  # LOCAL_RANK is the rank's slot on this node, DEVICE_ID its device (a rank table's device_id)
        e["DEVICE_ID"] = str(p.devices[r])
    return e


def _child_setup(driver_pid):
    os.setsid()  # each rank in its own process group: stopped as a whole, data loader workers included
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a rank must see Ctrl-C even if we started with it ignored
    die_with_parent(signal.SIGTERM, driver_pid)  # a driver killed (kill -9) stops nothing: the kernel does


def start_ranks(p, cmd, env, ranks):
    """One main.py process per device, each with its log file and its own process group, added to ``ranks``;
    returns the logs."""
    from trainer.job.launch import free_port
    port = int(p.port) if p.port else (free_port() if p.scale != "1p" else None)
    logs = []
    for r in range(p.ranks):
        log = os.path.join(p.output_dir, "train_{}.log".format(r))
        with open(log, "ab" if p.output_action == "keep" else "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=rank_env(p, r, port, env),
                                    preexec_fn=functools.partial(_child_setup, os.getpid()))
        ranks.procs.append(proc)
        logs.append(log)
        if p.scale == "1p":
            print("started: pid {}, log {}".format(proc.pid, log), flush=True)
        else:
            # each rank binds its own cores (main.py --cpu-binding, trainer/job/affinity.py): no taskset here
            print("rank {}: pid {}, device {}, log {}".format(p.rank_ids[r], proc.pid, p.devices[r], log), flush=True)
    return logs


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def report_stop(p, ranks, signum, since):
    """The line of a job a stop signal ended: what each rank did, where rank 0 saved; returns the exit code."""
    from trainer.job.ranks import stop_report
    code, line = stop_report(ranks, signum, os.path.join(p.output_dir, "summary.json"), since, p.rank_ids,
                             0 in p.rank_ids)
    sys.stderr.write(line + "\n")
    return code


def report_failure(p, ranks, logs, r, since):
    """The one line that names the failed rank (its last log line, its log); returns the exit code."""
    rc = ranks.procs[r].returncode
    from trainer.job.ranks import STOPPED
    if rc in STOPPED:  # the signal reached the ranks alone
        return report_stop(p, ranks, rc - 128, since)
    why = "was killed by signal {}".format(-rc) if rc < 0 else "failed with exit code {}".format(rc)
    last = last_line(logs[r])
    last = " (last log line: {})".format(last) if last else ""
    if p.scale == "1p":
        sys.stderr.write("error: the run (pid {}) {}{}; log: {}\n".format(ranks.procs[r].pid, why, last, logs[r]))
    else:
        sys.stderr.write("error: rank {} (pid {}) {}{}; the other ranks were stopped; log: {}\n".format(
            r, ranks.procs[r].pid, why, last, logs[r]))
    from trainer.guard import EXIT_DIVERGED
    return rc if rc in (2, EXIT_DIVERGED) else 1


def _inputs(p):
    """[what, the command-line token, the path] of each file the run reads that the driver passes on: the
    weights (--ckpt_path, or main.py's --pretrained after --) and the baseline table."""
    out = []
    for what, seq in (("--ckpt_path", p.extra), ("--pretrained (after --)", p.args.passthrough)):
        for i, tok in enumerate(seq):
            if tok == "--pretrained" and i + 1 < len(seq):
                out.append([what, seq[i + 1], seq[i + 1]])
            elif tok.startswith("--pretrained="):
                out.append([what, tok, tok[len("--pretrained="):]])
    if p.baseline and os.path.isfile(p.baseline):
        out.append(["--baseline", None, p.baseline])
    return [i for i in out if os.path.exists(i[2])]


def move_aside(p):
    """The output folder's earlier contents go to ``<dir>.prev-STAMP`` (trainer/record/earlier.py); returns the
    command-line tokens to replace ({old: new}). The inputs of this run the folder holds stay in place, except the
    earlier run's own files (its checkpoint as --ckpt_path): those go with that run, and the run reads them there (a
    note says so)."""
    from trainer.record import earlier
    inputs = _inputs(p)
    dest, now = earlier.move_folder_aside(p.output_dir, [path for _, _, path in inputs])
    replace = {}
    for what, token, path in inputs:
        if path not in now:
            continue
        if now[path] != path:
            if token:
                replace[token] = token.replace(path, now[path])
            else:
                p.baseline = now[path]
            p.notes.append("{} {} is the earlier run's {}: it went with that run to {}, where this run "
                           "reads it".format(what, path, os.path.relpath(now[path], dest), now[path]))
        else:
            p.notes.append("{} {} stays in {} (the folder's other contents were moved to {})".format(
                what, path, p.output_dir, dest))
    print("output: the earlier contents of {} were moved to {}".format(p.output_dir, dest))
    return replace


def check_inputs(cmd):
    """main.py's checks of its inputs (the data set, the files named, the output folder: trainer/inputs.py) on the
    command ``cmd`` the ranks will run, before the output folder's earlier contents move: a run that cannot start
    moves nothing. A command main.py's parsing refuses is left to main.py, which says why in each rank's setting."""
    from trainer import inputs
    from trainer.config import parse_config
    try:
        cfg = parse_config(cmd[3:], env={}).cfg
    except UsageError:
        return
    inputs.check(cfg)


def prepare_output(p):
    """The output folder made ready; returns the command-line tokens to replace ({old: new}: inputs the folder held,
    read where they went)."""
    replace = {}
    if p.output_action == "move":
        replace = move_aside(p)
    elif p.output_action == "keep":
        print("output: continuing the run in {} (--resume={})".format(p.output_dir, p.args.resume))
    try:
        os.makedirs(p.output_dir, exist_ok=True)
    except OSError:
        raise UsageError("cannot create --output_dir '{}'".format(p.output_dir))
    return replace


def script_name(mode, scale):
    return "train_cluster.sh" if scale == "cluster" else "train_{}_{}.sh".format(mode, scale)


def run(mode, scale, argv, env=None):
    env = dict(os.environ if env is None else env)
    script = script_name(mode, scale)
    if any(a in ("-h", "--help") for a in argv[:argv.index("--") if "--" in argv else len(argv)]):
        print(usage(mode, scale))
        return 0
    p = resolve(parse(argv, mode, scale, script), mode, scale, script, env)
    cmd = command(p)
    check_inputs(cmd)
    replace = prepare_output(p)
    cmd = [replace.get(c, c) for c in cmd]
    for note in p.notes:
        print("note: " + note)
    from trainer.device import Device
    numbered = Device.of(p.device).numbered
    where = ("1 process on {}{}".format(p.device, " device {}".format(p.device_id) if numbered else "")
             if scale == "1p" else "{} processes on {} devices {}{}".format(
                 p.ranks, p.device, ",".join(str(d) for d in p.devices),
                 " (node {} of {}, {} ranks in all, master {}:{})".format(p.node_rank, p.nodes, p.world,
                                                                          p.master_addr, p.port)
                 if p.nodes > 1 else " (server {} of {} in RANK_TABLE_FILE, {} ranks in all, master {}:{})".format(
                     p.table["server"], p.table["servers"], p.world, p.master_addr, p.port)
                 if p.table is not None and p.table["servers"] > 1 else ""))
    print("{}: {}{} | {} | global batch {} | lr {:g} | {} epoch(s){} | precision {} | output {}".format(
        script, p.model, " (recipe {})".format(p.recipe) if p.recipe else "", where, p.batch, p.lr, p.epochs,
        " x {}".format(counted(p.steps, "step")) if p.steps else "", p.precision, p.output_dir))
    print("command: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.time()
    from trainer.job.ranks import SIGNAL_GRACE, Interrupted, Ranks
    from trainer.job.stop import name
    ranks = Ranks(groups=True)
    try:
        with ranks:
            with ranks.starting(), stops_blocked():  # each rank's main.py keeps the stop signals from its first line
                logs = start_ranks(p, cmd, env, ranks)
            r = ranks.supervise()
    except Interrupted as exc:
        sys.stderr.write("interrupted ({}): stopping all ranks\n".format(name(exc.signum)))
        ranks.stop(exc.signum, grace=SIGNAL_GRACE)  # each rank saves its run at the step they agree on
        return report_stop(p, ranks, exc.signum, t0)
    finally:
        if ranks.running():
            ranks.stop()
    code = report_failure(p, ranks, logs, r, t0) if r is not None else 0
    if code:
        return code
    print("finished in {} s".format(int(time.time() - t0)) if scale == "1p" else
          "all {} ranks finished in {} s".format(p.ranks, int(time.time() - t0)), flush=True)
    if 0 not in p.rank_ids:  # rank 0's node writes summary.json: the results are there
        print("node {}: done; {} reports the results (its summary.json and case log)".format(
            p.node_rank if p.table is None else p.table["server"],
            "node 0" if p.table is None else "the server of rank 0 ({})".format(p.master_addr)))
        return 0
    report = ["report", "--summary", os.path.join(p.output_dir, "summary.json"), "--network", p.network,
              "--rank-size", str(p.world), "--batch-size", str(p.batch), "--mode", p.case_mode,
              "--out-dir", p.output_dir]
    if p.baseline:
        report += ["--baseline", p.baseline, "--arch", p.network, "--precision", p.precision] + tolerances(p)
    return run_acceptance(report)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) < 2 or argv[0] not in ("full", "performance") or argv[1] not in SCALES or (
            argv[1] == "cluster" and argv[0] != "full"):
        sys.stderr.write("error: usage: python3 -m modelzoo.drivers full|performance 1p|8p|16p [--key=value ...], "
                         "or full cluster [--key=value ...]\n")
        return 2
    if not {"-h", "--help"} & set(argv[2:argv.index("--") if "--" in argv else len(argv)]):
        interpreter.require()  # the ranks' main.py runs on this Python: it has their packages, or one line, exit 2
    try:
        return run(argv[0], argv[1], argv[2:])
    except UsageError as exc:
        sys.stderr.write("error: {}\n".format(str(exc).splitlines()[0]))
        return 2
    except ImportError as exc:
        sys.stderr.write("error: {} cannot import what main.py needs ({}): {}\n".format(
            sys.executable, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, interpreter.fix()))
        return 2


if __name__ == "__main__":
    sys.exit(main())
