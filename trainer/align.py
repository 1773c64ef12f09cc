"""Precision alignment with msprobe (PyPI ``mindstudio-probe``), Ascend's precision tool.

--precision-dump DIR: the chosen training steps through msprobe's PrecisionDebugger (forward pass to optimizer step),
into DIR/step<k>/rank<r>/. --deterministic: msprobe's seed_all (dropout removed), the device's deterministic
algorithms, Dropout at p=0; summary.json's "alignment" records the seed and the fingerprints of the initial weights
and first batches. msprobe is imported only here and only when asked; ``check_flags`` imports neither it nor torch.
tools/align.py compares what these runs leave.
"""
import hashlib
import importlib.util
import os

from trainer.errors import UsageError

MSPROBE_PIN = "mindstudio-probe==26.2.0"
FINGERPRINT_STEPS = 2  # the first training steps whose batches the summary's fingerprint covers


INSTALL_HINT = "pip install {} (make install installs it)".format(MSPROBE_PIN)


def available():
    """Whether msprobe is installed (found, not imported)."""
    return importlib.util.find_spec("msprobe") is not None


DUMP_OPTIONS = ("dump_steps", "dump_level", "dump_task", "dump_config")


def check_flags(ns, explicit):
    """--precision-dump, its options and --deterministic: what they need, and no earlier dump of the steps asked."""
    given = [d for d in DUMP_OPTIONS if d in explicit]
    if ns.precision_dump is None:
        if given:
            raise UsageError("{} needs --precision-dump DIR".format("--" + given[0].replace("_", "-")))
    else:
        if ns.dump_config is not None:
            other = [d for d in given if d != "dump_config"]
            if other:
                raise UsageError("--dump-config '{}' and --{} contradict each other: msprobe's config file sets "
                                 "the steps, level and task; give one".format(
                                     ns.dump_config, other[0].replace("_", "-")))
            if not os.path.isfile(ns.dump_config):
                raise UsageError("--dump-config '{}' is not a file: give msprobe's config.json".format(
                    ns.dump_config))
        if os.path.exists(ns.precision_dump) and not os.path.isdir(ns.precision_dump):
            raise UsageError("--precision-dump '{}' is a file: give a folder".format(ns.precision_dump))
        if os.path.isdir(ns.precision_dump):
            steps = sorted(n for n in os.listdir(ns.precision_dump) if n.startswith("step"))
            asked = steps if ns.dump_config is not None else \
                [n for n in ("step{}".format(k) for k in ns.dump_steps) if n in steps]
            if asked:
                raise UsageError("--precision-dump '{}' already holds a dump ({}/): give a new or empty folder".format(
                    ns.precision_dump, asked[0]))
        if ns.evaluate:
            raise UsageError("--precision-dump dumps training steps: drop --evaluate")
        if ns.compile:
            raise UsageError("--precision-dump hooks the eager model's modules and APIs: drop --compile")
        if not available():
            raise UsageError("--precision-dump needs msprobe, which is not installed: " + INSTALL_HINT)
    if ns.deterministic and ns.seed is None:
        raise UsageError("--deterministic needs --seed N: give every run to be compared the same seed")


def msprobe(flag):
    """msprobe's PyTorch package, imported now; a UsageError naming ``flag`` and the install where it cannot be."""
    if not available():
        raise UsageError("{} needs msprobe, which is not installed: {}".format(flag, INSTALL_HINT))
    try:
        import msprobe.pytorch as mp
    except Exception as exc:  # a broken install: say what failed, in one line
        raise UsageError("{} needs msprobe, which does not import here ({}): {}".format(
            flag, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160], INSTALL_HINT))
    return mp


def seed_all(seed, device):
    """--deterministic, once the seed is known: msprobe's seed_all where installed, then the device's deterministic
    algorithms again (seed_all's mode=False leaves them off). Returns a note."""
    if not available():
        device.manual_seed(seed)
        return "--deterministic without msprobe ({}): torch seeded {}, Dropout modules at p=0".format(
            INSTALL_HINT, seed)
    mp = msprobe("--deterministic")
    mp.seed_all(seed=seed, mode=False, rm_dropout=True)
    device.manual_seed(seed)
    device.deterministic()
    return "msprobe seed_all(seed={}, rm_dropout=True): Python, NumPy and torch seeded, dropout p=0".format(seed)


def remove_dropout(model):
    """Every Dropout module of ``model`` at p=0 (msprobe's rm_dropout patches only functions). Returns how many."""
    import torch
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
            n += 1
    return n


def _digest(h, t):
    import torch
    t = t.detach()
    h.update(str(tuple(t.shape)).encode())
    h.update(str(t.dtype).encode())
    host = t.cpu()
    h.update((host.float() if host.dtype == torch.bfloat16 else host).contiguous().numpy().tobytes())


def weights_fingerprint(model):
    """sha256 of the model's state dict (names, shapes, dtypes and values), the same on every device."""
    import torch
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        if torch.is_tensor(t):
            _digest(h, t)
    return h.hexdigest()


def environment():
    """The set environment variables that msprobe's config check compares (its env.yaml) and ENV_NAMES."""
    names = set(ENV_NAMES)
    if available():
        try:
            import yaml
            from msprobe.core.config_check.checkers import env_args_checker
            for kinds in (yaml.safe_load(open(env_args_checker.env_yaml_path)) or {}).values():
                names.update(v["name"] for v in kinds.values() if isinstance(v, dict) and "name" in v)
        except Exception:  # msprobe's list moved: keep ours
            pass
    return {k: os.environ[k] for k in sorted(names) if k in os.environ}


ENV_NAMES = ("HCCL_DETERMINISTIC", "NCCL_DETERMINISTIC", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED",
             "OMP_NUM_THREADS", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def packages():
    """{distribution name: version} of this Python's installed packages (what msprobe's pip check lists)."""
    try:
        from importlib import metadata  # novermin (3.8; msprobe needs 3.8 too)
    except ImportError:
        return {}
    found = ((dist.metadata.get("Name") if dist.metadata else None, dist.version) for dist in metadata.distributions())
    return dict(sorted({name: version for name, version in found if name}.items()))


def record(seed, deterministic, dropout_removed, model):
    """summary.json's "alignment" (batches_sha256 is added as the first batches train)."""
    return dict(seed=seed, deterministic=deterministic, dropout_removed=dropout_removed,
                weights_sha256=weights_fingerprint(model), batches_sha256=None, batches_steps=0,
                environment=environment(), packages=packages())


class BatchFingerprint:
    """sha256 of the first FINGERPRINT_STEPS training batches (images as loaded, targets) of a rank."""

    def __init__(self, steps=FINGERPRINT_STEPS):
        self.h, self.limit, self.steps = hashlib.sha256(), steps, 0

    def add(self, images, target):
        if self.steps >= self.limit:
            return False
        _digest(self.h, images)
        _digest(self.h, target)
        self.steps += 1
        return True

    def value(self):
        return self.h.hexdigest() if self.steps else None


class Dumper:
    """--precision-dump: msprobe's PrecisionDebugger around each training step, counting from ``first_step``, the
    global step the run trains first (a resumed run's: the step after its checkpoint's, mid-epoch too)."""

    def __init__(self, run, rank, first_step, model, log):
        mp = msprobe("--precision-dump")
        self.rank, self.model = rank, model
        path = os.path.abspath(run.precision_dump)
        if run.dump_config is not None:
            self.debugger = mp.PrecisionDebugger(config_path=os.path.abspath(run.dump_config), dump_path=path)
        else:
            self.debugger = mp.PrecisionDebugger(task=run.dump_task, dump_path=path, level=run.dump_level,
                                                 step=list(run.dump_steps))
        if first_step:
            self.debugger.set_init_step(first_step)
        what = "msprobe's config '{}'".format(run.dump_config) if run.dump_config is not None else \
            "steps {}, level {}, task {}".format(",".join(map(str, run.dump_steps)), run.dump_level, run.dump_task)
        log("=> precision dump (msprobe): {} into {}".format(what, path))

    def start(self):
        self.debugger.start(self.model, rank_id=self.rank)

    def stop(self):
        self.debugger.stop()
        self.debugger.step()
