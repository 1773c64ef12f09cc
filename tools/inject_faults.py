#!/usr/bin/env python3
"""Seeded fault injection on a run's stop path (trainer/job/stop.py): stop signals at drawn moments of real runs,
then ``--resume auto``, each compared with the run that was not stopped.

    python3 -m tools.inject_faults --work-dir DIR [--data DIR] [--seed 0] [-n 24] [--launchers one [spawn] [torchrun]]
                                   [--workers 0 2] [--jobs 1] [--timeout 240] [--json FILE]

From --seed, N injections are drawn, each: a phase, one or two signals of SIGINT, SIGTERM and SIGUSR1 (the second a
drawn short delay after the first), a launcher (``one`` process; ``spawn``: --multiprocessing-distributed with 2 ranks
of one node; ``torchrun``: its 2 workers of one node, each signal sent to the agent and every process it started, as
Slurm signals every process of a job step; ``driver``: ModelZoo's bash test/train_full_1p.sh, its rank's log followed
in train_0.log) and the data workers (-j). The phases, each drawn once in every
round of six:

  start-up      a drawn delay (0-2 s) after the process starts, or its first log line where that comes first
  building      once the run's first line ("=> cpu binding") shows, plus a delay: its handlers installed
  step          once the line of step k of epoch e shows, plus a delay
  validation    once a "Test: [" line of epoch e's validation shows, plus a delay
  checkpoint    while epoch e's checkpoint is written: its temporary file is a FIFO, the writer waits in its
                open(2), the FIFO is removed and the signal sent (the open goes on into a file)
  epoch-end     once epoch e's " *   Acc@1" line shows (its validation done, its checkpoint next), plus a delay

The run is the smallest that has every phase: tiny_cnn, 32 px, -p 1 (a line per step), 2 epochs, CPU, on --data or
on a set generated into --work-dir (10 classes x 8 training and 2 validation images: 5 steps an epoch). For each
injection: the uninterrupted run of its configuration (launcher, -j; run once and kept in --work-dir), the run
with the injection, then ``--resume auto`` into its folder until summary.json says ``ok`` (a stop before the first
save leaves nothing to resume: that run trains from the start). Checked: the injected run's exit code (128 + a
signal sent; 0 where the run had ended ``ok``; killed by SIGINT or SIGTERM only before main.py's first line, where
no handler can be, and the driver's bash by any of them; torchrun's agent: 1, its own SignalException, or killed by
SIGUSR1, which it leaves to the workers), no traceback (but the torchrun agent's own), every step's loss
(step_losses.csv), every validation, Acc@1 and the final weights equal to the uninterrupted run's, the steps trained
twice (the injected run's last step past the step its resumed run continued at), no run.lock left, no process of the
run left, none past --timeout (then the outcome is ``hang``, with each process's state from /proc, and the
processes' Python stacks in the run's stderr file).

Outcomes: exact; redone N (all equal, N steps trained twice); differs (a loss, a validation, Acc@1 or the weights);
hang; failed (an exit code, a traceback, a lock or process left, a resume that did not end ``ok``, a phase never
reached). One line per injection, a table per phase, and a JSON of every injection (--json, by default
DIR/faults.json). Exit code 0 where every injection is exact (or redone at most --max-redone steps), 1 otherwise,
2 for bad input (one line on stderr).
"""
if not __package__:  # python3 tools/inject_faults.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tools._faults import LAUNCHERS, child_env, into, run_args, send, start, tracebacks, waits_in_open, writer
from trainer import errors
from trainer.errors import UsageError
from trainer.job.stop import exit_code
from trainer.options import HelpFormatter, UsageParser, number
from trainer.record.lock import LOCK, holder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("start-up", "building", "step", "validation", "checkpoint", "epoch-end")
DELAYS = {"start-up": 2.0, "building": 0.5, "step": 0.2, "validation": 0.1, "checkpoint": 0.0, "epoch-end": 0.3}
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "USR1": signal.SIGUSR1}
SECOND = (0.05, 1.0)  # s: the second signal's delay after the first, drawn in this range
TWO = 1 / 3.0  # the share of injections with a second signal
OUTCOMES = ("exact", "redone", "differs", "hang", "failed")
STEP = re.compile(r"Epoch: \[(\d+)\]\[\s*(\d+)/(\d+)\]")
STOPPED = re.compile(r"=> SIG\w+: stopped at epoch (\d+) step (\d+) of \d+ \(global step \d+\)(, before)?")


def draw(seed, count, launchers, workers, epochs):
    """The ``count`` injections of ``seed``: the phases in rounds of six (each round a drawn order), the rest drawn
    for each (the same draws whatever the phase, so that one seed's injections never depend on the options' use)."""
    rng, order, out = random.Random(seed), [], []
    for index in range(count):
        if not order:
            order = list(PHASES)
            rng.shuffle(order)
        phase = order.pop()
        inj = dict(index=index, phase=phase, launcher=rng.choice(launchers), workers=rng.choice(workers),
                   epoch=rng.randrange(epochs), at=rng.random(), delay=round(rng.uniform(0, DELAYS[phase]), 3),
                   signals=[rng.choice(sorted(SIGNALS))], second_delay=None)
        second, second_delay = rng.choice(sorted(SIGNALS)), round(rng.uniform(*SECOND), 3)
        if rng.random() < TWO:
            inj["signals"].append(second)
            inj["second_delay"] = second_delay
        out.append(inj)
    return out


def epoch_of(lines):
    """The epoch of the last step line so far (None before the first)."""
    for line in reversed(lines):
        m = STEP.match(line)
        if m:
            return int(m.group(1))
    return None


MISSED = "missed"  # reach(): the moment passed before the harness could hold it; the run is started again
TRIES = 3  # runs started for one injection, at most, while its moment is missed


def reach(child, inj, steps, out, deadline):
    """Waits for the injection's moment: True there, False where the run ended first, None past ``deadline``,
    MISSED where it passed unheld (the checkpoint's write begun before its temporary file could be held)."""
    phase, epoch = inj["phase"], inj["epoch"]
    if phase == "start-up":  # the drawn delay, or the first log line where that comes sooner (a fast machine)
        seen = child.read(lambda line: True, min(deadline, child.started + inj["delay"]))
        return True if seen is None else seen
    if phase == "checkpoint":
        return _in_checkpoint_write(child, inj, out, deadline)
    step = 1 + int(inj["at"] * steps)
    marks = {"building": lambda line: line.startswith("=> cpu binding"),
             "step": lambda line: bool(STEP.match(line)) and STEP.match(line).group(1, 2) == (str(epoch), str(step)),
             "validation": lambda line: line.startswith("Test: [") and epoch_of(child.lines) == epoch,
             "epoch-end": lambda line: line.startswith(" *   Acc@1") and epoch_of(child.lines) == epoch}
    seen = child.read(marks[phase], deadline)
    if not seen:
        return seen
    child.read(None, min(deadline, time.monotonic() + inj["delay"]))
    return True


def _in_checkpoint_write(child, inj, out, deadline):
    """Epoch ``epoch``'s checkpoint write held in the open of its temporary file (a FIFO of its name), then let go:
    the FIFO removed, the signal comes while the open still waits."""
    seen = child.read(lambda line: line.startswith("Epoch: [{}][".format(inj["epoch"])), deadline)
    if not seen:
        return seen
    pid = writer(child, inj["launcher"])
    if pid is None:
        return False
    fifo = os.path.join(out, ".checkpoint.pth.tar.tmp-{}".format(pid))  # trainer.record.checkpoint.atomic_write's
    try:
        os.mkfifo(fifo)
    except FileExistsError:  # the write had begun before this came (a loaded machine): no signal sent yet
        return MISSED
    try:
        while not waits_in_open(pid):
            if child.read(None, min(deadline, time.monotonic() + 0.01)) is False:
                return False
            if time.monotonic() > deadline:
                return None
    finally:
        os.remove(fifo)
    return True


def landed(lines, err_tail, summary, code):
    """Where the stop took effect, from the run's log, its stderr and its summary."""
    for line in reversed(lines):
        m = STOPPED.search(line)
        if m:
            return "stopped at epoch {} step {}{}".format(m.group(1), m.group(2), " (validation due)"
                                                         if m.group(3) else "")
    if code is not None and code < 0:
        return "killed by signal {}".format(-code)
    if any("the run had not begun" in line for line in err_tail):
        return "before the run"
    if summary.get("status") == "ok":
        return "after the run"
    return "at once ({})".format(summary.get("error") or summary.get("status") or "no summary")


class RunFailed(Exception):
    """An uninterrupted run that did not end ``ok``: nothing to compare with."""


def read_summary(out):
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def global_steps(lines):
    """The global step of each step line (-p 1: one line per step, printed once it trained)."""
    out = []
    for line in lines:
        m = STEP.match(line)
        if m:
            out.append(int(m.group(1)) * int(m.group(3)) + int(m.group(2)))
    return out


def reference(a, launcher, workers, env):
    """The uninterrupted run of a configuration, kept in --work-dir (reused where its command is the same):
    (its folder, its steps per epoch)."""
    out = os.path.join(a.work_dir, "ref-{}-j{}".format(launcher, workers))
    cmd, stamp = run_args(a, launcher, workers), out + ".json"
    try:
        with open(stamp) as f:
            kept = json.load(f)
        if kept["cmd"] == cmd and read_summary(out).get("status") == "ok":
            return out, kept["steps"]
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(out, ignore_errors=True)
    child = start(into(cmd, out), out, out + ".err", env)
    code = child.finish(child.started + a.timeout)
    child.left()
    steps = [int(m.group(3)) for m in map(STEP.match, child.lines) if m]
    if code != 0 or read_summary(out).get("status") != "ok" or not steps:
        raise RunFailed("the uninterrupted run in '{}' ended {}: {}".format(
            out, "past --timeout" if code is None else "with exit code {}".format(code),
            " | ".join(child.stderr_tail(2)) or "no step trained"))
    with open(stamp, "w") as f:
        json.dump(dict(cmd=cmd, steps=steps[0]), f)
    return out, steps[0]


def allowed_exits(inj, summary, lines):
    """The exit codes the injected run may end with."""
    sent = [SIGNALS[s] for s in inj["signals"]]
    allowed = {exit_code(s) for s in sent}
    if inj["launcher"] == "torchrun":  # the agent's: its SignalException, or killed by the signal it leaves alone
        allowed = {1 for s in sent if s != signal.SIGUSR1} | {-s for s in sent if s == signal.SIGUSR1}
    if summary.get("status") == "ok":
        allowed.add(0)
    if not (summary or [ln for ln in lines if not ln.startswith("## ")]):  # before main.py's first line: killed
        allowed |= {-s for s in sent if s != signal.SIGUSR1}  # as any program is (a shell reads 128 + N)
        if inj["launcher"] == "driver":  # the driver's bash, before it execs Python, by any of them
            allowed |= {-s for s in sent}
    return allowed


def check_end(child, out, rec, what, launcher):
    """A finished process: no traceback, no process of the run left, no run.lock left."""
    with open(child.err_path, errors="replace") as f:
        raised = tracebacks(f.read() + "\n".join(child.lines if child.follow else ()), launcher)
    if raised:
        rec["problems"].append("{}: a traceback on stderr ({}): {}".format(what, child.err_path, raised[-1]))
    rest = child.left()
    if rest:
        rec["problems"].append("{}: {} process(es) of the run left: {}".format(what, len(rest), rest))
    if os.path.exists(os.path.join(out, LOCK)):
        rec["problems"].append("{}: {} left ({})".format(what, LOCK, holder(out) or "not held"))


def inject_one(a, inj, ref, steps, env):
    """One injection: the run stopped by it, resumed until ``ok``, compared with ``ref``; its record."""
    out = os.path.join(a.work_dir, "inj-{:03d}".format(inj["index"]))
    cmd = run_args(a, inj["launcher"], inj["workers"])
    rec = dict(inj, folder=out, problems=[], differences=[], resumes=[], redone=0, signal_to_exit=None, missed=0)
    if inj["phase"] == "step":
        rec["step"] = 1 + int(inj["at"] * steps)
    for _ in range(TRIES):  # a moment missed before any signal: the run is killed, its folder emptied, started again
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        child = start(into(cmd, out), out, out + ".err", env)
        deadline = child.started + a.timeout
        reached, sent = reach(child, inj, steps, out, deadline), None
        if reached != MISSED:
            break
        rec["missed"] += 1
        child.kill_all(signal.SIGKILL)
        child.finish(time.monotonic() + 60)
    if reached == MISSED:
        reached = None
        rec["problems"].append("the moment passed before it could be held, in each of {} runs".format(TRIES))
    if reached:
        for k, name in enumerate(inj["signals"]):
            if k:
                child.read(None, min(deadline, time.monotonic() + inj["second_delay"]))
            send(child, inj["launcher"], SIGNALS[name])
            child.lines.append("## SIG{} sent".format(name))  # in its .log file, where it came
            sent = sent or time.monotonic()
    elif not rec["problems"]:
        rec["problems"].append("the phase never came: the run {}".format("ended first" if reached is False
                                                                         else "passed --timeout"))
    code = child.finish(deadline)
    if code is None:
        rec.update(hang=child.hung, outcome="hang", landed="hung (stacks in {})".format(child.err_path))
        return rec
    rec["signal_to_exit"] = round(time.monotonic() - sent, 3) if sent else None
    summary = read_summary(out)
    rec.update(exit=code, landed=landed(child.lines, child.stderr_tail(), summary, code))
    if code not in allowed_exits(inj, summary, child.lines):
        rec["problems"].append("exit code {}, expected {}".format(code, sorted(allowed_exits(inj, summary,
                                                                                             child.lines))))
    check_end(child, out, rec, "the injected run", inj["launcher"])
    if not resume(a, cmd, out, rec, env):
        return rec
    trained = max(global_steps(child.lines) or [0])
    if rec["resumes"]:
        first = rec["resumes"][0]["first_step"]
        rec["redone"] = max(0, trained - (first - 1 if first is not None else a.epochs * steps))
        rec["steps_redone"] = read_summary(out).get("steps_redone")
    rec["differences"] = compare(out, ref)
    return rec


def resume(a, cmd, out, rec, env):
    """``--resume auto`` into ``out`` until its summary says ``ok`` (3 times at most). False on a hang."""
    for attempt in range(3):
        if read_summary(out).get("status") == "ok":
            return True
        child = start(into(cmd, out, resume=True), out, "{}.resume{}.err".format(out, attempt), env)
        code = child.finish(child.started + a.timeout)
        first = global_steps(child.lines)
        rec["resumes"].append(dict(exit=code, first_step=first[0] if first else None,
                                   seconds=round(time.monotonic() - child.started, 1)))
        if code is None:
            rec.update(hang=child.hung, outcome="hang", landed="resumed run hung (stacks in {})".format(
                child.err_path))
            return False
        check_end(child, out, rec, "the resumed run", rec["launcher"])
        if code != 0:  # a run that fails would fail again: no further attempt
            rec["problems"].append("the resumed run ended with exit code {}: {}".format(
                code, " | ".join(child.stderr_tail(2))))
            return False
    if read_summary(out).get("status") != "ok":
        rec["problems"].append("resumed 3 times, and the run did not end ok")
        return False
    return True


def compare(out, ref):
    """What differs between the run in ``out`` and the uninterrupted one in ``ref``: every step's loss, every
    validation, Acc@1, the final weights."""
    import torch
    from trainer.device import torch_load
    from trainer.record.observe import LOSSES, METRICS, read_losses, read_records
    diffs = []
    mine, theirs = read_losses(os.path.join(out, LOSSES)), read_losses(os.path.join(ref, LOSSES))
    if mine != theirs:
        at = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
        diffs.append("{} differs at row {} ({} rows, the reference {}): {} vs {}".format(
            LOSSES, at + 1, len(mine), len(theirs), mine[at] if at < len(mine) else None,
            theirs[at] if at < len(theirs) else None))
    vals = [[(r.get("epoch"), r.get("val_loss"), r.get("val_acc1")) for r in read_records(os.path.join(f, METRICS))]
            if os.path.exists(os.path.join(f, METRICS)) else [] for f in (out, ref)]
    if vals[0] != vals[1]:
        diffs.append("validations (epoch, loss, Acc@1) differ: {} vs {}".format(vals[0], vals[1]))
    ours, reference_summary = read_summary(out), read_summary(ref)
    for key in ("best_acc1", "final_acc1"):
        if ours.get(key) != reference_summary.get(key):
            diffs.append("{} {} vs {}".format(key, ours.get(key), reference_summary.get(key)))
    try:
        wa, wb = [torch_load(os.path.join(f, "checkpoint.pth.tar"))["state_dict"] for f in (out, ref)]
    except (OSError, KeyError, RuntimeError) as exc:
        return diffs + ["the final checkpoint could not be read: {}".format(exc)]
    if wa.keys() != wb.keys() or not all(torch.equal(wa[k], wb[k]) for k in wa):
        diffs.append("the final weights differ")
    return diffs


def outcome(rec):
    if rec.get("hang"):
        return "hang"
    if rec["problems"]:
        return "failed"
    if rec["differences"]:
        return "differs"
    return "redone" if rec["redone"] else "exact"


def describe(rec):
    """One line of an injection: what, where, the outcome, the exit and its time, where the stop took effect."""
    where = {"step": "e{} k{}".format(rec["epoch"], rec.get("step")), "start-up": "", "building": ""}.get(
        rec["phase"], "e{}".format(rec["epoch"]))
    sigs = rec["signals"][0] + ("" if len(rec["signals"]) == 1 else " +{:.2f}s {}".format(rec["second_delay"],
                                                                                           rec["signals"][1]))
    result = rec["outcome"] + (" {}".format(rec["redone"]) if rec["outcome"] == "redone" else "")
    took = "" if rec.get("signal_to_exit") is None else ", {:.2f} s after the signal".format(rec["signal_to_exit"])
    why = "; ".join(rec["problems"] + rec["differences"] + (["its moment passed unheld in {} run(s) before, "
                                                             "started again".format(rec["missed"])]
                                                           if rec.get("missed") and not rec["problems"] else []))
    return "#{:<3} {:<10} {:<6} +{:.2f}s  {:<16} {:<8} -j{}  {:<8} exit {}{}  {}{}".format(
        rec["index"], rec["phase"], where, rec["delay"], sigs, rec["launcher"], rec["workers"], result,
        rec.get("exit"), took, rec.get("landed", ""), " | " + why if why else "")


def table(records, by="phase", groups=PHASES):
    """Outcomes per phase (or per launcher: ``by``), and the seconds from the first signal to the exit of the runs
    it stopped (its landing not "after the run"): median and most."""
    head = "{:<11} {:>5} {:>6} {:>7} {:>8} {:>5} {:>7}  {:>14} {:>8}"
    rows = [head.format(by, "runs", *OUTCOMES + ("to exit median", "most"))]
    for group in tuple(groups) + ("all",):
        mine = [r for r in records if group in (r[by], "all")]
        took = sorted(r["signal_to_exit"] for r in mine if r.get("signal_to_exit") is not None
                      and not r.get("landed", "").startswith("after the run"))
        times = ["{:.2f} s".format(took[len(took) // 2]), "{:.2f} s".format(took[-1])] if took else ["-", "-"]
        if mine:
            counts = [sum(r["outcome"] == o for r in mine) for o in OUTCOMES]
            rows.append(head.format(group, len(mine), *counts + times))
    return "\n".join(rows)


def data_set(a):
    """--data, checked; else the small set in --work-dir/data, generated once."""
    if a.data is not None:
        if not all(os.path.isdir(os.path.join(a.data, sub)) for sub in ("train", "val")):
            raise UsageError("--data '{}' has no train/ and val/ folders (an ImageNet layout: train/<class>/*, "
                             "val/<class>/*); leave --data out to generate a small set".format(a.data))
        return os.path.abspath(a.data)
    path = os.path.join(a.work_dir, "data")
    if not os.path.isdir(path):
        from tools.make_dataset import generate
        shutil.rmtree(path + ".tmp", ignore_errors=True)
        generate(path + ".tmp", classes=10, train_per_class=8, val_per_class=2, size=32, seed=0)
        os.replace(path + ".tmp", path)
    return path


def build_parser():
    p = UsageParser(prog="python3 -m tools.inject_faults", formatter_class=HelpFormatter,
                    description="Seeded stop signals at drawn moments of real runs, each resumed with --resume auto "
                                "and compared with the run that was not stopped (tools/inject_faults.py's "
                                "docstring tells the phases and the checks).")
    p.add_argument("--work-dir", required=True, metavar="DIR",
                   help="the runs' folders (inj-NNN, ref-LAUNCHER-jW), their stderr files, the generated data")
    p.add_argument("--data", metavar="DIR", help="an ImageNet-layout data set (default: 10 classes x 8 training "
                                                 "and 2 validation images of 32 px, generated into DIR/data)")
    p.add_argument("--seed", type=number(int, 0), default=0, help="the injections' draw")
    p.add_argument("-n", "--count", type=number(int, 1), default=24, help="injections")
    p.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=["one"],
                   help="drawn among: one process, spawn's 2 ranks (--multiprocessing-distributed), torchrun's 2 "
                        "workers (signals to the agent and every process it started), ModelZoo's "
                        "test/train_full_1p.sh")
    p.add_argument("--workers", nargs="+", type=number(int, 0), default=[0, 2], help="-j values drawn among")
    p.add_argument("--epochs", type=number(int, 1), default=2)
    p.add_argument("--batch-size", type=number(int, 1), default=16)
    p.add_argument("--arch", default="tiny_cnn")
    p.add_argument("--threads", type=number(int, 1), default=1, help="OMP_NUM_THREADS of every run")
    p.add_argument("--jobs", type=number(int, 1), default=1, help="injections run at a time")
    p.add_argument("--timeout", type=number(float, 0, exclusive=True), default=240.0,
                   help="seconds each process may take, past which it is a hang")
    p.add_argument("--max-redone", type=number(int, 0), default=1,
                   help="steps an injection may train twice and still pass (its outcome is 'redone N' all the same)")
    p.add_argument("--only", nargs="+", type=number(int, 0), metavar="I",
                   help="run only these of the seed's injections (their numbers: to repeat one)")
    p.add_argument("--json", metavar="FILE", help="every injection's record (default: DIR/faults.json)")
    return p


def run(a):
    if os.path.exists(a.work_dir) and not os.path.isdir(a.work_dir):
        raise UsageError("--work-dir '{}' is a file, not a folder".format(a.work_dir))
    a.work_dir = os.path.abspath(a.work_dir)
    if a.data is not None:
        a.data = data_set(a)  # checked before anything is written
    os.makedirs(a.work_dir, exist_ok=True)
    a.data = a.data or data_set(a)
    injections, env, lock = draw(a.seed, a.count, a.launchers, a.workers, a.epochs), child_env(a.threads), \
        threading.Lock()
    if a.only:
        injections = [i for i in injections if i["index"] in a.only]
    configs = sorted({(i["launcher"], i["workers"]) for i in injections})
    refs = {}

    def one(inj):
        try:
            rec = inject_one(a, inj, *refs[(inj["launcher"], inj["workers"])], env=env)
        except Exception as exc:  # the harness's own failure: recorded, the other injections go on
            rec = dict(inj, problems=["the harness failed: {}: {}".format(type(exc).__name__, exc)],
                       differences=[], redone=0)
        rec["outcome"] = outcome(rec)
        with lock:
            print(describe(rec), flush=True)
        return rec

    started = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        try:
            refs.update(zip(configs, pool.map(lambda c: reference(a, c[0], c[1], env), configs)))
        except RunFailed as exc:
            sys.stderr.write("error: {}\n".format(exc))
            return 1
        for (launcher, workers), (folder, steps) in sorted(refs.items()):
            print("=> uninterrupted run, {} -j{}: {} ({} steps an epoch)".format(launcher, workers, folder, steps))
        records = list(pool.map(one, injections))
    print(table(records))
    if len(a.launchers) > 1:
        print(table(records, "launcher", a.launchers))
    path = a.json or os.path.join(a.work_dir, "faults.json")
    passed = [r["outcome"] == "exact" or r["outcome"] == "redone" and r["redone"] <= a.max_redone for r in records]
    with open(path, "w") as f:
        json.dump(dict(seed=a.seed, count=a.count, data=a.data, launchers=a.launchers, workers=a.workers,
                       references={"{} -j{}".format(*k): v[0] for k, v in refs.items()}, passed=all(passed),
                       seconds=round(time.monotonic() - started, 1), injections=records), f, indent=1)
    print("=> {} of {} injections within the rules ({:.0f} s); every injection: {}".format(
        sum(passed), len(records), time.monotonic() - started, path))
    return 0 if all(passed) else 1


def main(argv=None):
    return errors.run(lambda argv: run(build_parser().parse_args(argv)), argv)


if __name__ == "__main__":
    sys.exit(main())
