"""Learning-rate schedule: a pure function of the config and the position in training.

step: pytorch/examples' rule, lr x 0.1 every 30 epochs. cosine: half a cosine from lr (after warm-up) to 0 at the last
step. triangular: FFCV's ResNet recipes' "cyclic", lr x interp(x, [0, P, epochs], [1e-4, 1, 0]) at each step's position
x = epoch + i / steps (P: ``--lr-peak-epoch``). poly: MLPerf ResNet-50's LARS schedule, after warm-up end + (lr - end) x
(1 - progress)^2, end = min(1e-4, lr). Warm-up (``--warmup-epochs``) ramps per step from lr/steps to lr. Computed, not
stored: a resumed run continues with the command line's schedule.

``unit="epoch"`` (--lr-step-unit epoch; Ascend ModelZoo's entries): the LR moves once per epoch, as their main.py files
set it: warm-up lr x (e+1)/(W+offset) in epoch e < W (ResNet50_ID4149: offset 0; Shufflenetv2: 1), then cosine 0.5 x lr
x (1 + cos(pi (e-W)/(E-W))) (poly: at progress (e-W)/(E-W)), or the step rule (triangular: x = e).
"""
import math


KINDS = ("step", "cosine", "triangular", "poly")  # --lr-schedule
TRIANGLE_START = 1e-4  # the triangle's first LR, a fraction of lr (FFCV's)
POLY_POWER = 2  # MLPerf's lars_opt_learning_rate_decay_poly_power
POLY_END = 1e-4  # MLPerf's lars_opt_end_learning_rate (an LR, not a fraction of lr)


class Schedule:
    def __init__(self, lr, kind, epochs, warmup_epochs, steps_per_epoch, unit="step", warmup_offset=0, peak_epoch=0.0):
        self.lr, self.kind, self.epochs, self.warmup_epochs = lr, kind, epochs, warmup_epochs
        self.steps_per_epoch, self.unit, self.warmup_offset = max(1, steps_per_epoch), unit, warmup_offset
        self.peak_epoch = peak_epoch  # triangular: where the LR peaks

    def __call__(self, epoch, step):
        if self.unit == "epoch":
            warm, x = self.warmup_epochs, float(epoch)
            if epoch < warm:
                return self.lr * (epoch + 1) / (warm + self.warmup_offset)
            progress = (epoch - warm) / float(max(1e-9, self.epochs - warm))
        else:
            spe = self.steps_per_epoch
            t = epoch * spe + step
            warm = int(round(self.warmup_epochs * spe))
            if t < warm:
                return self.lr * (t + 1) / warm
            x, progress = t / float(spe), (t - warm) / float(max(1, self.epochs * spe - warm))
        if self.kind == "step":
            return self.lr * (0.1 ** (epoch // 30))
        if self.kind == "triangular":  # at position x, in epochs
            peak = self.peak_epoch
            if x < peak:
                return self.lr * (TRIANGLE_START + (1.0 - TRIANGLE_START) * x / peak)
            return self.lr * max(0.0, (self.epochs - x) / float(self.epochs - peak))
        progress = min(1.0, progress)  # of cosine or poly: 0 at the end of warm-up, 1 at the end
        if self.kind == "poly":
            end = min(POLY_END, self.lr)
            return end + (self.lr - end) * (1.0 - progress) ** POLY_POWER
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * progress))

    def state_dict(self):
        keys = ("lr", "kind", "epochs", "warmup_epochs", "steps_per_epoch", "unit", "warmup_offset", "peak_epoch")
        return {k: getattr(self, k) for k in keys}


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
