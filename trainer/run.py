"""The run, top to bottom (pytorch/examples' main -> main_worker): ``run(cfg)`` plans it (every check before any rank
starts), takes the output folder, then starts one worker per device (spawn) or is the one worker; ``worker(plan)``
is one rank: the device first (an Ascend rule), the process group, a Trainer; every outcome becomes a summary
status and an exit code here.
"""
import dataclasses
import functools
import os
import signal
import stat
import sys

from trainer import cli, data
from trainer.job import affinity, distributed, ranks, stop as stops
from trainer.record import folders, metrics, summary
from trainer.device import Device, out_of_memory
from trainer.errors import UsageError, one_line, report
from trainer.guard import Diverged
from trainer.plan import plan as make_plan
from trainer.job.rendezvous import RendezvousError, peer_failure, show_traces
from trainer.trainer import Trainer


def run(cfg, notes=(), amp_timer=None, env=None, found=None):
    """Entry point after parsing (``notes``: parsing's): the exit code. ``amp_timer``: the --amp dtype probe's timer;
    ``env``: the environment the plan reads (os.environ by default); ``found``: what inputs.check found."""
    plan = make_plan(cfg, env, notes, found)
    held_lock, plan = folders.hold_folder(plan)  # the process that starts rank 0 holds --output-dir
    try:
        if plan.launch.mode == "spawn":  # each rank reads the plan's files for itself: this process lets them go
            for checked in (plan.weights, plan.resume):
                if checked is not None:
                    checked.release()
            return ranks.spawn(plan, functools.partial(worker, amp_timer=amp_timer))
        return worker(plan, amp_timer)
    finally:
        if held_lock is not None:
            held_lock.release()


def worker(plan, amp_timer=None):
    """One rank of ``plan``: its exit code (0 ok, 2 user error, 4 diverged, 128 + a stop signal); anything else is
    raised (exit 1)."""
    append_to_shared_log()  # several ranks may share one log file (ModelZoo's loops)
    section = plan.launch
    # installed once the process group has started: a rank stopped at its rendezvous ends by the signal itself
    # (trainer/job/held_stderr.py)
    stop = stops.StopRequest()
    try:
        return _worker(plan, section, stop, amp_timer)
    finally:
        stop.end()
        stop.restore()


def _worker(plan, section, stop, amp_timer):
    try:
        # Ascend rule: the device is set first, once, before any tensor or model touches it.
        bound = affinity.bind(section, plan.kind)  # before any thread or data worker starts
        device = Device.create(plan.kind, section.device_index)
        settings = device.configure(section)
        if plan.run.deterministic:  # before the process group starts: HCCL reads HCCL_DETERMINISTIC then
            settings["deterministic"] = device.deterministic()
        host_memory = Device.of(plan.kind).keep_host_memory()
        dist = distributed.init(section, device)
        stop.install(several=dist.world_size > 1 and not plan.run.evaluate)  # trainer/job/stop.py
    except RendezvousError as exc:
        summary.failed_start(plan, exc)
        return report(exc)
    except UsageError as exc:
        return report(exc)
    log, rs, node_lock = metrics.Logger(dist.rank), None, None
    log(affinity.describe(bound), all_ranks=True)
    log("=> device settings: " + ", ".join("{} {}".format(k, v) for k, v in settings.items()))
    if plan.precision.float32_math is not None:  # ModelZoo's ALLOW_HF32 / ALLOW_FP32
        plan = dataclasses.replace(plan, notes=plan.notes + (device.set_float32_math(plan.precision.float32_math),))
    try:
        writes, node_lock, plan = folders.node_writer(plan, dist, device, log)
        if writes:
            os.makedirs(plan.run.output_dir, exist_ok=True)
            name = summary.EVAL_SUMMARY if plan.run.evaluate else summary.SUMMARY
            rs = summary.RunSummary(plan, os.path.join(plan.run.output_dir, name))
            rs.update(host_memory=host_memory, cpu_binding=bound, device_settings=settings)
        trainer = Trainer(plan, device, dist, log, rs, amp_timer, stop)
        try:
            return trainer.evaluate() if plan.run.evaluate else trainer.fit()
        finally:  # the data-loader workers end with the run, not with the process (samplers.release)
            data.release(trainer.train_loader, trainer.val_loader)
    except KeyboardInterrupt as exc:  # Ctrl-C, or a stop signal outside the training loop (stop.Stopped)
        for s in stops.SIGNALS:  # a second signal (or spawn's supervisor passing it on) must not cut the summary short
            signal.signal(s, signal.SIG_IGN)
        if rs is not None and rs.data["status"] == "ok":  # it came after the run had ended: that stays as it was
            return 0
        signum = getattr(exc, "signum", signal.SIGINT)
        signame = None if signum == signal.SIGINT else stops.name(signum)
        dist.record_failure()
        _finish(rs, "interrupted", "stopped by {}".format(signame) if signame else "interrupted by the user")
        if dist.is_main and section.mode != "spawn":  # spawn's parent says it for all ranks
            sys.stderr.write(cli.interrupted_line(plan, signame) + "\n")
            sys.stderr.flush()
        else:
            log.warn("interrupted")
        return stops.exit_code(signum)
    except Diverged as exc:
        dist.record_failure()
        _finish(rs, "diverged", exc.message(), diverged=exc.info)
        if dist.is_main:
            report(exc)  # its message, one line
        return exc.exit_code
    except UsageError as exc:
        dist.record_failure()
        _finish(rs, "failed", one_line(exc))
        return report(exc)
    except BaseException as exc:
        line = None if show_traces() else peer_failure(exc, section, dist.store)
        if line is None:  # this rank's own error (its traceback kept): the ranks it cuts off blame it
            dist.record_failure()
        elif stop.asked:  # asked to stop, and a peer left first (one the signal ended before its run began)
            _finish(rs, "interrupted", "stopped by {}; {}".format(stops.name(stop.signum), line))
            log.warn("interrupted: " + line)
            return stops.exit_code(stop.signum)
        if line is not None or out_of_memory(exc):
            line = line or cli.out_of_memory_line(plan, device)
            _finish(rs, "failed", line)
            sys.stderr.write("error: {}\n".format(line))
            sys.stderr.flush()
            return 1
        _finish(rs, "failed", "{}: {}".format(type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))
        raise
    finally:
        dist.close()
        if node_lock is not None:
            node_lock.release()


def _finish(rs, status, error, **fields):
    """A run that started records how it ended; one that never started leaves an existing summary alone."""
    if rs is not None and rs.started:
        rs.update(**fields)
        rs.write(status, error)


def append_to_shared_log():
    """ModelZoo's 8p loops start every rank with ``> train_0.log 2>&1``, each at its own offset, so ranks would
    overwrite each other's lines: regular-file stdout / stderr are switched to O_APPEND."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except (AttributeError, OSError, ValueError):
            continue
