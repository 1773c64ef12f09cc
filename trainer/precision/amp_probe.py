"""``--amp-dtype auto`` where the device's rule is a measurement (``Device.measures_amp_dtype``: a CPU).

A CPU's flags do not say whether bfloat16 autocast is faster than float32: on one 2-core CPU with AVX-512 BF16 resnet18
trained at 1.87x float32's images/s, on another at 0.64x. So before training a copy of the run's model (its weights, RNG
and buffers untouched) is timed forward + backward (forward only for --evaluate) on a small batch at the run's crop size
and memory format, float32 and bfloat16 autocast interleaved; bfloat16 must beat float32 by ``MARGIN``. Rank 0 measures
and broadcasts. A verdict that cost ``CACHE_AFTER_S`` is kept in ``cache_dir()`` (per machine, torch, threads, model and
shape) for later runs; delete it to measure again. Reasons and figures: docs/PRECISION.md."""
import copy
import datetime
import hashlib
import json
import os
import time

import torch

from trainer.record import checkpoint
from trainer import device as devmod

MARGIN = 1.05  # bfloat16 must measure this much faster than float32 to be chosen
BATCH = 8  # images per probe step (at most the run's batch per device)
BUDGET_S = 1.0  # timed steps continue, interleaved, until this much time has passed (at least MIN_ROUNDS)
MIN_ROUNDS, MAX_ROUNDS = 2, 5
CACHE_AFTER_S = 3.0  # a probe that cost this long is kept for the next run
CACHE_VERSION = 1
_CODES = (None, torch.bfloat16, torch.float16)  # what rank 0 broadcasts: the index of its choice


def dtype_name(dtype):
    return "float32" if dtype is None else str(dtype).replace("torch.", "")


def cache_dir(environ=None):
    """Where costly verdicts are kept: ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/imagenet-npu-trainer/amp_dtype``."""
    base = (os.environ if environ is None else environ).get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(base, "imagenet-npu-trainer", "amp_dtype")


def time_steps(step, dtypes, clock=time.perf_counter):
    """{dtype name: seconds of its fastest (least disturbed) step}: a warm-up step each (oneDNN builds its kernels on
    a first call), then rounds of a step per dtype, order reversed every round, within the rounds and budget."""
    for _, dtype in dtypes:
        step(dtype)
    best = {name: float("inf") for name, _ in dtypes}
    start, rounds = clock(), 0
    while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and clock() - start < BUDGET_S):
        for name, dtype in (dtypes if rounds % 2 == 0 else dtypes[::-1]):
            t0 = clock()
            step(dtype)
            best[name] = min(best[name], clock() - t0)
        rounds += 1
    return best


def probe_step(model, device, batch, size, channels_last, backward=True):
    """``step(dtype)``: one forward (+ backward) of a copy of ``model`` on a fixed batch, in ``dtype`` autocast."""
    probe = copy.deepcopy(model)
    probe.train(backward)
    gen = torch.Generator().manual_seed(0)
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, max(1, last[-1].out_features if last else 1000), (batch,), generator=gen)
    x = device.move(x.contiguous(memory_format=torch.channels_last) if channels_last else x)
    y = device.move(y).to(device.target_dtype)

    def step(dtype):
        if not backward:
            with torch.no_grad(), device.autocast(dtype):
                probe(x)
        else:
            with device.autocast(dtype):
                loss = torch.nn.functional.cross_entropy(probe(x), y)
            loss.backward()
            probe.zero_grad(set_to_none=True)
        device.synchronize()
    return step


class Verdict:
    """What the probe found: ``dtype`` (None: float32), images/s per dtype name, cost, shape, cache file."""

    def __init__(self, dtype, rates, seconds, shape, measured_at, cache_file=None, cached=False, busy=None):
        self.dtype, self.rates, self.seconds, self.shape = dtype, dict(rates), seconds, dict(shape)
        self.measured_at, self.cache_file, self.cached = measured_at, cache_file, cached
        self.busy = busy  # the load average, where it exceeded the cores while measuring

    @property
    def ratio(self):
        return self.rates["bfloat16"] / self.rates["float32"] if self.rates.get("float32") else None

    def as_dict(self):
        return {"choice": dtype_name(self.dtype), "float32_img_s": round(self.rates["float32"], 3),
                "bfloat16_img_s": round(self.rates["bfloat16"], 3),
                "bfloat16_over_float32": round(self.ratio, 4) if self.ratio is not None else None,
                "seconds": round(self.seconds, 3), "margin": MARGIN, "measured_at": self.measured_at,
                "cached": self.cached, "cache_file": self.cache_file, "busy_load_average": self.busy, **self.shape}

    def note(self):
        s = self.shape
        what = "{} ({} px, batch {}, {}, {})".format(
            s["arch"], s["size"], s["batch"], "channels-last" if s["channels_last"] else "NCHW",
            "forward + backward" if s["backward"] else "forward")
        faster = self.dtype is not None
        text = ("--amp: bfloat16 autocast measured {} than float32 on this CPU for {}: float32 {:.1f} img/s, "
                "bfloat16 {:.1f} img/s ({:.2f}x), probe {:.1f} s".format(
                    "faster" if faster else "no faster", what, self.rates["float32"], self.rates["bfloat16"],
                    self.ratio or 0.0, self.seconds))
        if self.cached:
            text += " on {} (read from {}; delete it to measure again)".format(self.measured_at, self.cache_file)
        elif self.cache_file:
            text += " (kept in {})".format(self.cache_file)
        elif self.busy is not None:
            text += " while the machine was busy (load average {:.1f} on {} cores{})".format(
                self.busy, devmod.usable_cpus(), ": not kept" if self.seconds >= CACHE_AFTER_S else "")
        return text + (": training in bfloat16" if faster else
                       ": training in float32 (--amp-dtype bfloat16 forces bfloat16)")


def load_average():
    """The 1-minute load average, or None where the OS does not tell it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def measure(model, device, shape, candidate=torch.bfloat16, timer=None, cache=None, cache_after_s=CACHE_AFTER_S,
            load=load_average):
    """The ``Verdict`` of float32 against ``candidate`` for ``model`` at ``shape``; ``timer``: as ``time_steps``
    (a test seam); ``cache``: None, ``cache_dir()``; False, none. Not kept while ``load()`` exceeds the cores."""
    shape = {k: shape[k] for k in ("arch", "size", "batch", "channels_last", "backward")}
    folder = cache_dir() if cache is None else cache
    key = {"version": CACHE_VERSION, "machine": devmod.cpu_identity(), "threads": torch.get_num_threads(),
           "torch": torch.__version__.split("+")[0], "candidate": dtype_name(candidate), **shape}
    path = None
    if folder:
        digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        path = os.path.join(folder, "{}-{}.json".format(shape["arch"], digest))
        try:
            with open(path) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            entry = None  # absent or unreadable: measure again
        if isinstance(entry, dict) and entry.get("key") == key:
            dtype = candidate if entry["choice"] != "float32" else None
            return Verdict(dtype, entry["rates"], entry["seconds"], shape, entry["measured_at"], path, cached=True)
    names = (("float32", None), ("bfloat16", candidate))
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # dropout in the probe must not move the run's RNG
        step = probe_step(model, device, shape["batch"], shape["size"], shape["channels_last"], shape["backward"])
        seconds = (timer or time_steps)(step, names)
        del step
    cost = time.perf_counter() - t0
    rates = {name: shape["batch"] / max(seconds[name], 1e-9) for name, _ in names}
    dtype = candidate if rates["bfloat16"] >= MARGIN * rates["float32"] else None
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kept, busy = None, load()
    busy = busy if busy is not None and busy > devmod.usable_cpus() else None
    if path is not None and cost >= cache_after_s and busy is None:
        try:
            os.makedirs(folder, exist_ok=True)
            text = json.dumps({"key": key, "choice": dtype_name(dtype), "rates": rates, "seconds": cost,
                               "measured_at": when}, indent=1)
            checkpoint.atomic_write(path, lambda f: f.write(text.encode()))
            kept = path
        except OSError:
            pass  # a read-only home: the next run measures again
    return Verdict(dtype, rates, cost, shape, when, kept, busy=busy)


def for_run(plan, model, device, dist, batch_per_rank, timer=None, cache=None):
    """``decide(dtype, note)`` -> (dtype, note, record) for ``amp.resolve``: rank 0 measures, every rank takes it."""
    def decide(dtype, note):
        record = None
        if dist.is_main and dtype is not None:
            size = plan.data.val_crop_size if plan.run.evaluate else plan.data.train_crop_size
            shape = {"arch": plan.model.arch, "size": size, "batch": max(1, min(BATCH, batch_per_rank)),
                     "channels_last": bool(plan.model.channels_last), "backward": not plan.run.evaluate}
            verdict = measure(model, device, shape, dtype, timer=timer, cache=cache)
            dtype, note, record = verdict.dtype, verdict.note(), verdict.as_dict()
        chosen = _CODES[dist.broadcast_int(_CODES.index(dtype), device)]
        return chosen, note if chosen == dtype else None, record
    return decide
