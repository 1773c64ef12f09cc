"""Learning-rate schedule: a pure function of the config and the position in training.

step:       pytorch/examples' rule, lr x 0.1 every 30 epochs.
cosine:     half a cosine from lr (after warm-up) to 0 at the last step.
triangular: FFCV's ResNet recipes' schedule (their "cyclic"): linear from lr x 1e-4 at the first step to lr at
            ``--lr-peak-epoch`` P, then linear to 0 at the end of the last epoch, evaluated at each step's
            position x = epoch + i / steps: lr x interp(x, [0, P, epochs], [1e-4, 1, 0]).
poly:       MLPerf ResNet-50's LARS schedule: after warm-up, a polynomial of power 2 from lr down to an end LR of
            1e-4 (or lr, if lower) at the last step: end + (lr - end) x (1 - progress)^2.
Warm-up (``--warmup-epochs``, fractions allowed) ramps linearly per step from lr/steps
to lr. Because the LR is computed, not stored, a resumed run continues with exactly
the LR the schedule gives at that point: the command line's --lr/--lr-schedule/
--warmup-epochs/--epochs win over the values saved in the checkpoint.

``unit="epoch"`` (--lr-step-unit epoch; Ascend ModelZoo's entries, trainer/zoo.py): the LR moves once per epoch,
as their main.py files set it: warm-up lr x (e+1)/(W+offset) in epoch e < W (ResNet50_ID4149: offset 0;
Shufflenetv2: 1), then cosine 0.5 x lr x (1 + cos(pi (e-W)/(E-W))) (poly: at progress (e-W)/(E-W)), or the step
rule (triangular: at x = e).
"""
import math


KINDS = ("step", "cosine", "triangular", "poly")  # --lr-schedule
TRIANGLE_START = 1e-4  # the triangle's first LR, a fraction of lr (FFCV's)
POLY_POWER = 2  # MLPerf's lars_opt_learning_rate_decay_poly_power
POLY_END = 1e-4  # MLPerf's lars_opt_end_learning_rate (an LR, not a fraction of lr)


class Schedule:
    def __init__(self, lr, kind, epochs, warmup_epochs, steps_per_epoch, unit="step", warmup_offset=0,
                 peak_epoch=0.0):
        self.lr, self.kind, self.epochs = lr, kind, epochs
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = max(1, steps_per_epoch)
        self.unit, self.warmup_offset = unit, warmup_offset
        self.peak_epoch = peak_epoch  # triangular: where the LR peaks

    def _triangle(self, x):
        """The triangle at position ``x`` (epochs, fractions allowed)."""
        peak = self.peak_epoch
        if x < peak:
            return self.lr * (TRIANGLE_START + (1.0 - TRIANGLE_START) * x / peak)
        return self.lr * max(0.0, (self.epochs - x) / float(self.epochs - peak))

    def _decay(self, progress):
        """cosine or poly after warm-up, at ``progress`` (0 at the end of warm-up, 1 at the end)."""
        progress = min(1.0, progress)
        if self.kind == "poly":
            end = min(POLY_END, self.lr)
            return end + (self.lr - end) * (1.0 - progress) ** POLY_POWER
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * progress))

    def __call__(self, epoch, step):
        if self.unit == "epoch":
            return self._per_epoch(epoch)
        spe = self.steps_per_epoch
        t = epoch * spe + step  # global step index
        warm = int(round(self.warmup_epochs * spe))
        if t < warm:
            return self.lr * (t + 1) / warm
        if self.kind == "step":
            return self.lr * (0.1 ** (epoch // 30))
        if self.kind == "triangular":
            return self._triangle(t / float(spe))
        total = self.epochs * spe
        return self._decay((t - warm) / float(max(1, total - warm)))

    def _per_epoch(self, epoch):
        warm = self.warmup_epochs
        if epoch < warm:
            return self.lr * (epoch + 1) / (warm + self.warmup_offset)
        if self.kind == "step":
            return self.lr * (0.1 ** (epoch // 30))
        if self.kind == "triangular":
            return self._triangle(float(epoch))
        return self._decay((epoch - warm) / float(max(1e-9, self.epochs - warm)))

    def state_dict(self):
        return {"lr": self.lr, "kind": self.kind, "epochs": self.epochs,
                "warmup_epochs": self.warmup_epochs, "steps_per_epoch": self.steps_per_epoch, "unit": self.unit,
                "warmup_offset": self.warmup_offset, "peak_epoch": self.peak_epoch}


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
