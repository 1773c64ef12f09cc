#!/usr/bin/env python3
"""Device-to-host copies of each training step, by phase, counted on the torch_npu double (tests/fake_npu).

    python3 -m bench.host_syncs [--ranks 1|2] [--amp off|on|both] [--model-ema] [--steps 7] [--print-freq 3]
                                [--format markdown|json] [DATA]

Each copy from the device to the host waits for the device's queue (a host sync). The double counts every one
(``torch_npu.d2h_ops``, by kind: item, tolist, to_cpu, copy_to_host, ...). This trains ``main.py --device npu``
(resnet18 at 32 px, one epoch of ``--steps`` steps, ``-p --print-freq``) in processes of its own, one per rank,
each of which reads the counts at the boundaries of a step's phases without touching the trainer's code:

  data       a DataLoader iterator's ``__next__`` (the sampler's order, collation), then normalisation and the
             targets' copy to the device, up to the model's first forward
  forward    from the model's forward (an outermost module call in training mode: DDP's, or the model's) through
             the loss (a global forward pre-hook), up to ``torch.autograd.backward``
  backward   ``torch.autograd.backward`` (DDP's gradient all-reduce included)
  optimizer  from the end of backward to the end of the optimizer step (a global optimizer step post-hook) and of
             the GradScaler's ``update`` (torch_npu's loss scaler)
  after      the rest of the step: the meters' and the divergence guard's device sums, the EMA, and at a print
             step (``i % print_freq == 0`` and the epoch's last step) the read of the meters; the last step's
             also holds the epoch's end (its sums read once more, the slowest rank's time)

Without DATA a small generated image set is used (tools/make_dataset.py). Prints one JSON object (``--format
json``) or a markdown table (docs/BENCHMARKS.md, "Host syncs per step").
"""
import argparse
import collections
import json
import os
import runpy
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = os.path.join(ROOT, "tests", "fake_npu")
EMA = ("--model-ema", "--model-ema-steps", "1")  # the average moves after every step
PHASES = ("data", "forward", "backward", "optimizer", "after")
TRAIN = ["-a", "resnet18", "--seed", "1", "--epochs", "1", "-b", "16", "--lr", "0.02", "--wd", "0",
         "--no-channels-last", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32",
         "-j", "0", "--no-validate"]


class Phases:
    """The copies counted (``torch_npu.d2h_ops``) in each phase of each training step of this process."""

    def __init__(self, copies):
        self.copies = copies  # the double's Counter of copies by kind
        self.syncs = collections.Counter()  # the device synchronisations (torch_npu.npu.synchronize)
        self.seen = self.counts()
        self.phase, self.step = "setup", -1
        self.depth = 0
        self.steps = collections.defaultdict(lambda: {p: collections.Counter() for p in PHASES})
        self.epoch_end = collections.Counter()  # from the end of the epoch's loop (StepClock.finish) on
        self.outside = collections.Counter()  # before the first step, and in validation

    def counts(self):
        return collections.Counter(self.copies) + self.syncs

    def enter(self, phase):
        """Close the current phase (its copies go to the current step) and open ``phase``."""
        now = self.counts()
        delta = now - self.seen
        self.seen = now
        if self.phase in PHASES and self.step >= 0:
            self.steps[self.step][self.phase].update(delta)
        elif self.phase == "epoch_end":
            self.epoch_end.update(delta)
        else:
            self.outside.update(delta)
        self.phase = phase

    # the markers
    def next_batch(self):
        if self.phase in ("after", "setup", "eval", "epoch_end"):
            self.enter("data")

    def forward_starts(self, module):
        if self.depth == 0 and self.phase in ("data", "after", "setup", "eval", "epoch_end"):  # a step, or validation
            # (a loader that is no DataLoader, --dummy's, opens no "data" phase)
            if module.training:
                self.step += 1
                self.enter("forward")
            else:
                self.enter("eval")
        self.depth += 1

    def forward_ends(self):
        self.depth = max(0, self.depth - 1)

    def backward_starts(self):
        if self.phase == "forward":
            self.enter("backward")

    def backward_ends(self):
        if self.phase == "backward":
            self.enter("optimizer")

    def optimizer_starts(self):
        if self.phase == "after":  # the loss scaler's update after the optimizer step
            self.enter("optimizer")

    def optimizer_ends(self):
        if self.phase == "optimizer":
            self.enter("after")

    def loop_ends(self):
        self.enter("epoch_end")

    def synchronized(self):
        self.syncs["synchronize"] += 1

    def result(self):
        self.enter("setup")
        steps = []
        for i in sorted(self.steps):
            phases = self.steps[i]
            steps.append({"step": i, "copies": {p: sum(phases[p].values()) for p in PHASES},
                          "ops": {p: dict(phases[p]) for p in PHASES if phases[p]}})
        return {"steps": steps, "epoch_end": dict(self.epoch_end), "outside_steps": dict(self.outside)}


def install(phases):
    """The markers: hooks and wrappers on torch's own entry points (the trainer's objects are left as built)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    import torch.utils.data.dataloader as dataloader
    import torch_npu

    from trainer.record import metrics

    def wrap(owner, name, before, after=None):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            before()
            try:
                return original(*args, **kwargs)
            finally:
                if after is not None:
                    after()

        setattr(owner, name, wrapped)

    wrap(dataloader._BaseDataLoaderIter, "__next__", phases.next_batch)
    wrap(torch.autograd, "backward", phases.backward_starts, phases.backward_ends)
    wrap(torch_npu.npu.amp.GradScaler, "update", phases.optimizer_starts, phases.optimizer_ends)
    wrap(torch_npu.npu, "synchronize", phases.synchronized)
    wrap(metrics.StepClock, "finish", phases.loop_ends)  # the engine's clock: the epoch's steps are over
    torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: phases.forward_starts(module))
    torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: phases.forward_ends())
    register_optimizer_step_post_hook(lambda opt, args, kwargs: phases.optimizer_ends())


def child(out_path, argv):
    """One rank: main.py's run in this process with the markers installed; the counts written to ``out_path``."""
    import torch_npu
    if torch_npu._double.unavailable:
        raise SystemExit("the torch_npu double is off: {}".format(torch_npu._double.unavailable))
    phases = Phases(torch_npu.d2h_ops)
    install(phases)
    sys.argv = [os.path.join(ROOT, "main.py")] + list(argv)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")  # main.py as its command line runs it
        rc = 0
    except SystemExit as exit_:
        rc = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    result = dict(phases.result(), rc=rc)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return rc


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(data, out_dir, ranks=1, amp=False, steps=7, print_freq=3, extra=(), timeout=540):
    """Train one epoch of ``steps`` steps in ``ranks`` processes (torchrun's variables) on the double; returns
    {"config": {...}, "boundaries": [the print steps], "ranks": [per rank: {"rc", "steps": [{"step", "copies":
    {phase: count}, "ops": {phase: {kind: count}}}], "epoch_end": {kind: count}, "outside_steps": {...}}]}.
    ``torch_npu.npu.synchronize`` calls are counted beside the copies, as "synchronize". ``extra``: more main.py
    flags."""
    args = [data, "--device", "npu", "--output-dir", os.path.join(out_dir, "run"), "--max-steps-per-epoch",
            str(steps), "-p", str(print_freq)] + TRAIN + (["--amp"] if amp else []) + list(extra)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT=str(max(ranks, 1)),
               PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1" if ranks > 1 else "2")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    port = _free_port()
    procs, outs = [], []
    for rank in range(ranks):
        rank_env = dict(env)
        if ranks > 1:
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        outs.append(os.path.join(out_dir, "rank{}.json".format(rank)))
        log = open(os.path.join(out_dir, "rank{}.log".format(rank)), "w")
        procs.append((subprocess.Popen([sys.executable, "-m", "bench.host_syncs", "--child", outs[-1], "--"] + args,
                                       cwd=ROOT, env=rank_env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for rank, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        if rc != 0:
            with open(log.name) as f:
                failed.append("rank {} exited {}:\n{}".format(rank, rc, f.read()[-3000:]))
    if failed:
        raise RuntimeError("\n".join(failed))
    per_rank = []
    for path in outs:
        with open(path) as f:
            per_rank.append(json.load(f))
    boundaries = [i for i in range(steps) if i % print_freq == 0 or i == steps - 1]
    return {"config": {"ranks": ranks, "amp": amp, "steps": steps, "print_freq": print_freq, "extra": list(extra)},
            "boundaries": boundaries, "ranks": per_rank}


def groups(rank, boundaries):
    """A rank's steps grouped by their counts: [(steps, {phase: {op: count}})], in step order."""
    out = []
    for record in rank["steps"]:
        ops = {p: record["ops"].get(p, {}) for p in PHASES}
        for steps, seen in out:
            if seen == ops:
                steps.append(record["step"])
                break
        else:
            out.append(([record["step"]], ops))
    return out


def _cell(ops):
    n = sum(ops.values())
    return "0" if not n else "{} ({})".format(n, ", ".join("{} {}".format(op, k) for op, k in sorted(ops.items())))


def markdown(results):
    """One row per group of steps with the same counts (rank 0's; another rank's only where its steps differ),
    and one for what follows the epoch's steps. A print step is marked (p)."""
    lines = ["| run | steps | " + " | ".join(PHASES) + " |", "|" + "---|" * (len(PHASES) + 2)]
    for r in results:
        c = r["config"]
        run = "{} {}, {}{}".format(c["ranks"], "process" if c["ranks"] == 1 else "ranks",
                                   "--amp (float16, dynamic loss scale)" if c["amp"] else "float32",
                                   "".join(" " + a for a in c.get("extra", ())))
        first = groups(r["ranks"][0], r["boundaries"])
        alike = all(groups(rank, r["boundaries"]) == first for rank in r["ranks"])
        for index, rank in enumerate(r["ranks"]):
            mine = groups(rank, r["boundaries"])
            if index and mine == first:
                continue
            who = run if len(r["ranks"]) == 1 else "{}, {}".format(run, "each rank" if alike else
                                                                   "rank {}".format(index))
            for steps, ops in mine:
                label = ", ".join("{}{}".format(i, " (p)" if i % c["steps"] in r["boundaries"] else "") for i in steps)
                lines.append("| {} | {} | {} |".format(who, label, " | ".join(_cell(ops[p]) for p in PHASES)))
        lines.append("| {} | after the epoch's steps (rank 0) | {} | {} |".format(
            run, " | ".join("-" for _ in PHASES[:-1]), _cell(r["ranks"][0]["epoch_end"])))
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", help="an ImageNet-layout folder (default: a generated one)")
    p.add_argument("--ranks", type=int, choices=(1, 2), action="append",
                   help="processes (repeat for both; default 1 and 2)")
    p.add_argument("--amp", choices=("off", "on", "both"), default="both")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--print-freq", type=int, default=3)
    p.add_argument("--format", choices=("markdown", "json"), default="markdown")
    p.add_argument("--model-ema", action="store_true",
                   help="also a run of one process with --model-ema --model-ema-steps 1 (the average moves every step)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            from tools.make_dataset import generate
            data = generate(os.path.join(tmp, "shapes"), classes=10, train_per_class=40, val_per_class=10, size=32,
                            seed=0)
        results = []
        for ranks in args.ranks or (1, 2):
            for amp in {"off": (False,), "on": (True,), "both": (False, True)}[args.amp]:
                out = os.path.join(tmp, "r{}{}".format(ranks, "amp" if amp else ""))
                os.makedirs(out)
                results.append(measure(data, out, ranks, amp, args.steps, args.print_freq))
        if args.model_ema:
            out = os.path.join(tmp, "ema")
            os.makedirs(out)
            results.append(measure(data, out, 1, False, args.steps, args.print_freq, EMA))
    if args.format == "json":
        print(json.dumps(results, indent=1))
    else:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
