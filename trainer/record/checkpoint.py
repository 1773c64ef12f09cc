"""Checkpoints: atomic writes (a temporary file in the same folder, fsync'ed, renamed over the target, the folder
fsync'ed: a crash leaves the previous checkpoint intact, never a truncated one), tolerant loads (a bare state dict or
one under ``state_dict``, with or without DDP's ``module.``, to the CPU first, ``weights_only=True`` where the
installed torch has it), resume."""
import contextlib
import dataclasses
import os
import pickle
import shutil
import warnings
import zipfile
from typing import Optional

import torch

from trainer import device as devmod
from trainer.device.rng import restore_rng, rng_states  # noqa: F401 (what a checkpoint keeps, read back)
from trainer.errors import UsageError, one_line

CHECKPOINT = "checkpoint.pth.tar"
BEST = "model_best.pth.tar"
FORMAT_VERSION = 3  # 2: apex's amp.state_dict() under "amp" (the Ascend guide's key), "precision", "scaler";
# 3: pytorch/examples' "scheduler" (its StepLR's state) and "best_acc1" as a tensor, as its --resume reads them
EXAMPLES_STEP = (30, 0.1)  # pytorch/examples' schedule: StepLR(optimizer, step_size=30, gamma=0.1)


def atomic_write(path, write_fn):
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, ".{}.tmp-{}".format(os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(obj, path):
    atomic_write(path, lambda f: torch.save(obj, f))


def copy(src, dst):
    def write(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 22)
    atomic_write(dst, write)


def strip_module(state_dict):
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return type(state_dict)((k[len("module."):], v) for k, v in state_dict.items())
    return state_dict


def read(path, what="checkpoint"):
    """Load a file saved by torch.save; a missing or non-torch file is a UsageError."""
    if not os.path.exists(path):
        raise UsageError("{} '{}' does not exist".format(what, path))
    if not os.path.isfile(path):
        raise UsageError("{} '{}' is not a file".format(what, path))
    try:
        return devmod.torch_load(path, map_location=devmod.HOST)
    except devmod.UnsafeCheckpoint as exc:
        raise UsageError(
            "{} '{}' holds Python objects beyond tensors and plain data{} and was not loaded: unpickling them could "
            "run code. If you trust the file, keep its weights once: python3 -c \"import torch; c = torch.load('{}', "
            "weights_only=False); torch.save({{'state_dict': c['state_dict'] if isinstance(c, dict) else "
            "c.state_dict()}}, 'weights.pth')\" and pass --pretrained weights.pth".format(
                what, path, " ({})".format(exc.what) if exc.what else "", path))
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile,
            AttributeError, ImportError, IndexError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError("{} '{}' is not a readable PyTorch checkpoint ({})".format(what, path, first[:200]))


class File:
    """A file the run reads (--resume, --pretrained): loaded at most once a process, when first needed, held until
    ``release``; a spawned rank receives it empty (its contents are not pickled) and loads it once itself."""

    def __init__(self, path, what="checkpoint"):
        self.path, self.what, self._contents, self._training = path, what, None, None

    def load(self):
        if self._contents is None:
            self._contents = read(self.path, self.what)
        return self._contents

    def training(self, arch):
        """The file as a training checkpoint to continue (a Resume), checked against ``arch`` once a process."""
        if self._training is None:
            self._training = read_training(self, arch)
        return self._training

    def release(self):
        self._contents = self._training = None

    def __getstate__(self):
        return dict(self.__dict__, _contents=None, _training=None)

    def __repr__(self):
        return "File({!r})".format(self.path)


def state_dict_of(obj, path):
    sd = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict) or not sd or not all(torch.is_tensor(v) for v in sd.values()):
        raise UsageError("'{}' holds no model state dict".format(path))
    return strip_module(sd)


def ema_state_dict_of(obj, path):
    """--model-ema's weights in a training checkpoint (its ``model_ema``: AveragedModel's state dict, without
    ``module.``); a file without them is a UsageError."""
    ema = obj.get("model_ema") if isinstance(obj, dict) else None
    sd = {k[len("module."):]: v for k, v in ema.items() if k.startswith("module.")} if isinstance(ema, dict) else {}
    if not sd or not all(torch.is_tensor(v) for v in sd.values()):
        raise UsageError("'{}' holds no weight average (model_ema: trained without --model-ema): evaluate it "
                         "without --model-ema".format(path))
    return sd


def shapes_of(model):
    """{name: shape} of a module's state dict (or of a state dict)."""
    sd = model.state_dict() if hasattr(model, "state_dict") else model
    return {k: tuple(v.shape) for k, v in sd.items()}


def model_shapes(name, num_classes):
    """{name: shape} of model ``name``'s state dict, built without memory where this torch can (the meta device)."""
    import models
    with devmod.without_storage():
        return shapes_of(models.get_model(name, num_classes=num_classes))


def published_head(own, sd):
    """The keys of ``sd`` whose leading size alone differs from ``own`` ({name: shape}): the classifier of
    torchvision's weights for another class count."""
    return [k for k in sd if k in own and tuple(sd[k].shape) != tuple(own[k])
            and sd[k].dim() >= 1 and len(own[k]) >= 1 and tuple(sd[k].shape[1:]) == tuple(own[k][1:])]


def check_fits(model, sd, what, hint="check --arch and --num-classes", skip=()):
    """UsageError ``<what>: <which keys differ>; <hint>`` unless ``sd`` loads into ``model`` (a module, or its
    {name: shape}) strictly; keys in ``skip`` are not compared."""
    own = model if isinstance(model, dict) else shapes_of(model)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [k for k in sd if k in own and k not in skip and tuple(sd[k].shape) != tuple(own[k])]
    parts = ["shape differs for {} (e.g. {}: file {} vs model {})".format(
        len(shapes), shapes[0], tuple(sd[shapes[0]].shape), tuple(own[shapes[0]]))] if shapes else []
    parts += ["{} {} (e.g. {})".format(len(keys), word, keys[0]) for keys, word in
              ((missing, "missing"), (unexpected, "unexpected")) if keys]
    if parts:
        raise UsageError("{}: {}; {}".format(what, "; ".join(parts), hint))


def check_checkpoints(weights, resume, published, own, about):
    """Before any rank starts (trainer/plan.py): the Files ``weights`` (--pretrained) and ``resume`` (--resume or
    --evaluate's) fit ``own`` ({name: shape}, ``about`` its description), torchvision's (``published``) but for the
    classifier. Returns the notes."""
    notes = []
    if weights is not None:
        sd = state_dict_of(weights.load(), weights.path)
        head = published_head(own, sd) if published else []
        if head:
            notes.append("--pretrained: torchvision's weights are for {} classes and this model has {}: the backbone "
                         "is loaded, the classifier ({}) starts newly initialised".format(
                             sd[head[0]].shape[0], own[head[0]][0], ", ".join(head)))
        check_fits(own, sd, "weights '{}' do not fit {}".format(weights.path, about), skip=head)
    if resume is not None:
        ckpt = resume.load()
        sd = state_dict_of(ckpt, resume.path)
        saved = ckpt.get("num_classes") if isinstance(ckpt, dict) else None
        head = published_head(own, sd) if not isinstance(saved, int) else []  # e.g. pytorch/examples' 1000 classes
        if head:
            saved = sd[head[0]].shape[0]
        hint = "check --arch and --num-classes" if not isinstance(saved, int) else \
            "{} {} classes: use data of {} classes, or --num-classes {}".format(
                "its classifier has" if head else "it was trained with", saved, saved, saved)
        check_fits(own, sd, "checkpoint '{}' does not fit {}".format(resume.path, about), hint=hint)
    return tuple(notes)


def load_weights_into(model, weights, published=False):
    """--pretrained's File into ``model`` (checked by ``check_checkpoints``); with ``published`` (torchvision's
    weights) a classifier of another class count is left as built."""
    sd = state_dict_of(weights.load(), weights.path)
    if published:
        own = model.state_dict()
        head = published_head(shapes_of(own), sd)
        sd = dict((k, own[k] if k in head else v) for k, v in sd.items())
    model.load_state_dict(sd, strict=True)


def published_weights(arch, model):
    """torchvision's weights for ``model`` (-a ``arch``) in TORCH_HOME/hub/checkpoints, downloaded if missing."""
    import models as registry
    url = registry.published_weights_url(model)
    if url is None:
        raise UsageError("--pretrained: torchvision publishes no weights for -a {}; pass --pretrained FILE"
                         .format(arch))
    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    path = os.path.join(folder, os.path.basename(url.split("?")[0]))
    if not os.path.exists(path):
        try:
            os.makedirs(folder, exist_ok=True)
            torch.hub.download_url_to_file(url, path, progress=False)
        except Exception as exc:  # offline, refused, a full disk: the user can put the file there by hand
            raise UsageError("--pretrained: torchvision's weights for -a {} are not in {} and could not be downloaded "
                             "({}); copy {} there, or pass --pretrained FILE".format(
                                 arch, folder, one_line(exc) or type(exc).__name__, url))
    return path


def last_name(prefix="checkpoint"):  # the last epoch's checkpoint file name (--checkpoint-nameprefix)
    return CHECKPOINT if prefix == "checkpoint" else prefix + ".pth.tar"


def epoch_name(prefix, epoch):  # the file --checkpoint-freq keeps of ``epoch`` epochs completed
    return "{}_epoch{}.pth.tar".format(prefix, epoch)


def resolve_resume(resume, output_dir, prefix="checkpoint"):
    """--resume PATH | auto -> a path, or None (auto with nothing to resume)."""
    if resume != "auto":
        return resume
    path = os.path.join(output_dir, last_name(prefix))
    return path if os.path.isfile(path) else None


@dataclasses.dataclass(frozen=True)
class Resume:
    """A training checkpoint to continue from: what the run restores, read once (``read_training``)."""
    path: str
    epoch: int  # epochs completed
    best_acc1: Optional[float]
    state_dict: dict  # the model's, without DDP's "module." prefix
    rng: Optional[dict]
    lr_schedule: dict
    seed: Optional[int]
    entries: dict  # the whole file: the optimizer step restores its own entries (optimizer, scaler, amp)


def read_training(file, arch):
    """``file`` (a File) as a Resume; a weights file, or another --arch's checkpoint, is a UsageError."""
    path, ckpt = file.path, file.load()
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "epoch" not in ckpt:
        raise UsageError("'{}' is a weights file, not a training checkpoint (no epoch/optimizer state); "
                         "use --pretrained for weights".format(path))
    import models
    if ckpt.get("arch") is not None and not models.same_weights(ckpt["arch"], arch):
        raise UsageError("'{}' is a checkpoint of --arch {}, not {}".format(path, ckpt.get("arch"), arch))
    best = float(ckpt["best_acc1"]) if ckpt.get("best_acc1") is not None else None
    return Resume(path=path, epoch=int(ckpt["epoch"]), best_acc1=best or None,  # 0: nothing validated yet
                  state_dict=strip_module(ckpt["state_dict"]), rng=ckpt.get("rng"),
                  lr_schedule=ckpt.get("lr_schedule") or {}, seed=ckpt.get("seed"), entries=ckpt)


def examples_scheduler(base_lr, epochs_done, lr):
    """The ``scheduler`` entry pytorch/examples' --resume loads into its StepLR: its state (the installed torch's)
    after ``epochs_done`` epochs from ``base_lr`` (--lr), with last LR ``lr`` (the next epoch's, as the optimizer
    holds it): examples continues --lr-schedule step (without warm-up) exactly, any other schedule from ``lr``."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=EXAMPLES_STEP[0], gamma=EXAMPLES_STEP[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(epochs_done):
            optimizer.step()
            scheduler.step()
    state = scheduler.state_dict()
    state["_last_lr"] = [lr]
    return state


class CheckpointSaver:
    """The checkpoint policy over the parts saved (held by reference): the last epoch in ``checkpoint.pth.tar``
    (--checkpoint-nameprefix), the best Acc@1 copied to ``model_best.pth.tar``, every N epochs a file of its own
    (--checkpoint-freq), all atomic; never weights or buffers that are not finite (``Diverged`` instead, the files
    left as they were). ``step``: the optimizer step (trainer/precision/amp.py: optimizer and loss-scaler entries);
    ``record``: the other entries (``arch``, ``model``, ``num_classes``, ``classes``, ``seed``, ``config``); ``ema``:
    --model-ema's average (saved as torchvision's ``model_ema``), or None."""

    def __init__(self, section, model, step, schedule, device, record, ema=None):
        self.last = os.path.join(section.output_dir, last_name(section.checkpoint_prefix))
        self.best = os.path.join(section.output_dir, BEST)
        self.out_dir, self.prefix, self.freq = section.output_dir, section.checkpoint_prefix, section.checkpoint_freq
        self.model, self.step, self.schedule, self.device, self.record = model, step, schedule, device, record
        self.ema = ema

    def state(self, epoch, best_acc1, mid=None, rng=None):
        """The checkpoint of ``epoch`` epochs completed (``mid``: a mid-epoch one's position; ``rng``: the RNG states
        to keep, this moment's by default): pytorch/examples' and the Ascend guide's keys (``epoch``, ``arch``,
        ``state_dict``, ``best_acc1``, ``optimizer``, ``scheduler``, apex's ``amp``) and this project's, all loadable
        with ``torch.load(path, weights_only=True)``."""
        from trainer.guard import Diverged, all_finite
        state = dict(format_version=FORMAT_VERSION, epoch=epoch, **self.record)
        rng = rng or rng_states(self.device)
        # best_acc1 as examples' --resume reads it (``best_acc1.to(args.gpu)``): a float64 0-dim tensor, 0 at first
        state.update(state_dict=self.model.state_dict(), lr_schedule=self.schedule.state_dict(), rng=rng,
                     best_acc1=torch.tensor(float(best_acc1) if best_acc1 is not None else 0.0, dtype=torch.float64))
        if not all_finite(state["state_dict"].values()):
            at = {"epoch": epoch - 1, "step": None} if mid is None else {"epoch": mid["epoch"], "step": mid["step"]}
            raise Diverged("non-finite weights", dict(at, lr=None, loss_scale=None))
        state.update(self.step.checkpoint_entries())
        lr = self.schedule(epoch, 0)  # the LR the next epoch starts at
        state["optimizer"] = dict(state["optimizer"], param_groups=[
            dict(group, lr=lr) for group in state["optimizer"]["param_groups"]])
        state["scheduler"] = examples_scheduler(self.schedule.lr, epoch, lr)
        if self.ema is not None:
            state["model_ema"] = self.ema.state_dict()
        if mid is not None:
            state["mid_epoch"] = mid
        return state

    def save(self, epoch, best_acc1, is_best, validation_due=None, rng=None):
        """The checkpoint of ``epoch`` epochs completed; ``validation_due``: a stop came before the epoch's
        validation (its training stats and the signal: ``--resume auto`` validates first), ``rng``: the states before
        that validation."""
        state = self.state(epoch, best_acc1, rng=rng)
        if validation_due is not None:
            state["validation_due"] = validation_due
        save(state, self.last)
        if is_best:
            copy(self.last, self.best)
        if self.freq and epoch % self.freq == 0:  # --checkpoint-freq N: a file of its own every N epochs
            copy(self.last, os.path.join(self.out_dir, epoch_name(self.prefix, epoch)))

    def save_mid(self, position, best_acc1):
        """A mid-epoch checkpoint in the last epoch's file (``--resume auto`` continues it): that of the epochs
        completed, with ``mid_epoch`` (``position``: the loop's step, meters, counters, the signal that stopped it)
        and this moment's RNG states (a step boundary)."""
        save(self.state(position["epoch"], best_acc1, position), self.last)

    def existing(self):
        """{'checkpoint': path, 'best_checkpoint': path} for the files present."""
        return {k: p for k, p in (("checkpoint", self.last), ("best_checkpoint", self.best)) if os.path.exists(p)}
