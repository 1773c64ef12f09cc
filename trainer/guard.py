"""Divergence guard: a non-finite loss, or a loss scaler that skips step after step, stops every rank with status
``diverged`` (exit code 4) before a checkpoint takes the weights. The device counters are read with the engine's
meters, in the same transfer: no host sync of their own.
"""
import torch

EXIT_DIVERGED = 4
# A run of this many consecutive overflow-skipped steps is a run that no longer trains: a dynamic
# scale has then halved 50 times (65536 -> ~6e-11); a static one has skipped every update.
MAX_CONSECUTIVE_OVERFLOWS = 50

_NO_STEP = 1e30


class Diverged(Exception):
    """The run stopped training; ``info`` goes into summary.json."""

    exit_code = EXIT_DIVERGED

    def __init__(self, reason, info):
        self.reason, self.info = reason, dict(info, reason=reason)
        super().__init__(self.message())

    def message(self):
        i = self.info
        where = "epoch {} step {}".format(i["epoch"], i["step"]) if i.get("step") is not None else \
            "epoch {}".format(i["epoch"])
        scale = "" if i.get("loss_scale") is None else ", loss scale {:g}".format(i["loss_scale"])
        lr = "" if i.get("lr") is None else ", lr {:g}".format(i["lr"])
        return ("training diverged at {} ({}{}{}): lower --lr, add --warmup-epochs, or try --amp-dtype bfloat16 "
                "(or no --amp); the last good checkpoint is kept".format(where, self.reason, lr, scale))


class Guard:
    """Per-epoch device counters: [non-finite losses, max consecutive overflow run, -first bad step]."""

    def __init__(self, device):
        self.device = device
        self.restore([0.0, 0.0, -_NO_STEP, 0.0, 0.0])  # no step seen yet

    def observe(self, loss, found):
        """One training step: its loss (device scalar) and the scaler's overflow flag (tensor, int or None)."""
        self._seen += 1
        bad = ~torch.isfinite(loss.detach().float())
        self.stats[0] += bad.float()
        step_if_bad = torch.where(bad, -self._seen, torch.full_like(self._seen, -_NO_STEP))
        self.stats[2] = torch.maximum(self.stats[2], step_if_bad)
        if found is not None:
            if not torch.is_tensor(found):
                found = torch.full_like(self._run, float(found))
            f = found.reshape(()).float().clamp(max=1.0)
            self._run = (self._run + 1.0) * f
            self.stats[1] = torch.maximum(self.stats[1], self._run)

    def state(self):
        """The counters as host values (a mid-epoch checkpoint's), and ``restore`` to put them back."""
        return [float(v) for v in torch.cat([self.stats, self._run.reshape(1), self._seen.reshape(1)]).tolist()]

    def restore(self, values):
        self.stats = self.device.move(torch.tensor(values[:3]))
        self._run = self.device.move(torch.tensor(values[3]))
        self._seen = self.device.move(torch.tensor(values[4]))

    def reduced(self, dist):
        """The counters, max over ranks, on the device (read with the meters: metrics.Sums.read's ``extras``)."""
        return dist.all_reduce_max(self.stats.clone())

    def check(self, dist, epoch, lr_at, loss_scale=lambda: None, values=None):
        """Raise ``Diverged`` if any rank saw a non-finite loss or too long an overflow run. ``lr_at(step)``: the LR
        of a 0-based step of this epoch; ``values``: ``reduced(dist)`` as read already (else read here: one sync)."""
        if values is None:
            values = self.reduced(dist).tolist()
        nonfinite, run, neg_first = (float(v) for v in values)
        if nonfinite > 0:
            step = int(round(-neg_first))  # 1-based, as in the log lines
            raise Diverged("non-finite training loss", {"epoch": epoch, "step": step, "lr": lr_at(step - 1),
                                                        "loss_scale": loss_scale()})
        if run > MAX_CONSECUTIVE_OVERFLOWS:
            raise Diverged("{} consecutive steps skipped for inf/NaN gradients".format(int(run)),
                           {"epoch": epoch, "step": None, "lr": None, "loss_scale": loss_scale()})


def all_finite(tensors):
    """Whether every floating tensor of ``tensors`` is finite (one host sync)."""
    by_device = {}
    for t in tensors:
        if torch.is_tensor(t) and t.is_floating_point():
            by_device.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(flags).all()) for flags in by_device.values())
