"""Learning-rate schedule: a pure function of the config and the position in training.

step:   pytorch/examples' rule, lr x 0.1 every 30 epochs.
cosine: half a cosine from lr (after warm-up) to 0 at the last step.
Warm-up (``--warmup-epochs``, fractions allowed) ramps linearly per step from lr/steps
to lr. Because the LR is computed, not stored, a resumed run continues with exactly
the LR the schedule gives at that point: the command line's --lr/--lr-schedule/
--warmup-epochs/--epochs win over the values saved in the checkpoint.
"""
import math


class Schedule:
    def __init__(self, lr, kind, epochs, warmup_epochs, steps_per_epoch):
        self.lr, self.kind, self.epochs = lr, kind, epochs
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = max(1, steps_per_epoch)

    def __call__(self, epoch, step):
        spe = self.steps_per_epoch
        t = epoch * spe + step  # global step index
        warm = int(round(self.warmup_epochs * spe))
        if t < warm:
            return self.lr * (t + 1) / warm
        if self.kind == "step":
            return self.lr * (0.1 ** (epoch // 30))
        total = self.epochs * spe
        progress = (t - warm) / float(max(1, total - warm))
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * min(1.0, progress)))

    def state_dict(self):
        return {"lr": self.lr, "kind": self.kind, "epochs": self.epochs,
                "warmup_epochs": self.warmup_epochs, "steps_per_epoch": self.steps_per_epoch}


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
