"""Meters, accuracy and the log lines.

The printed lines keep pytorch/examples' formats byte for byte, because acceptance
tooling greps them (the Epoch line is one line, wrapped here):
    Epoch: [0][ 10/500]\tTime  0.123 ( 0.150)\tData  0.001 ( 0.010)\tLoss 6.9078e+00 (6.9100e+00)
        \tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.50)
    Test: [ 10/196]\tTime ...
     *   Acc@1 75.123 Acc@5 92.456
Sums are kept on the device (no host sync per step); they are read, and reduced across
processes, only at print steps and at the end of an epoch.
"""
import sys

import torch


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0.0

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(
            name=self.name, val=self.val, avg=self.avg)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        digits = len(str(num_batches))
        fmt = "{:" + str(digits) + "d}"
        self.batch_fmtstr = "[" + fmt + "/" + fmt.format(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def line(self, batch):
        return "\t".join([self.prefix + self.batch_fmtstr.format(batch)] + [str(m) for m in self.meters])


def summary_line(acc1, acc5):
    return " *   Acc@1 {:.3f} Acc@5 {:.3f}".format(acc1, acc5)


def correct_counts(output, target, mask=None):
    """(top-1 correct, top-5 correct) as device tensors; top-5 is top-min(5, classes)."""
    maxk = min(5, output.shape[1])
    pred = output.topk(maxk, 1, True, True)[1]
    hit = pred.eq(target.view(-1, 1).to(pred.dtype))
    c1, c5 = hit[:, :1].any(1), hit.any(1)
    if mask is not None:
        c1, c5 = c1 & mask, c5 & mask
    return c1.sum(), c5.sum()


class Sums:
    """Device-resident [loss_sum, correct1, correct5, count] with interval bookkeeping."""

    def __init__(self, device):
        self.device = device
        self.total = device.move(torch.zeros(4, dtype=torch.float32))
        self._seen = [0.0, 0.0, 0.0, 0.0]

    def add(self, loss_sum, c1, c5, n):
        self.total += torch.stack([loss_sum.detach().float().reshape(()), c1.float(), c5.float(),
                                   n.float() if torch.is_tensor(n) else torch.full((), float(n), device=c1.device)])

    def read(self, reduce_fn=None, extras=None):
        """Host values (reduced over processes by ``reduce_fn``): (interval, running) dicts. With ``extras``
        ({name: device scalar or number}, not reduced) also a dict of their host values, read in the same
        transfer (no sync of their own)."""
        t = self.total if reduce_fn is None else reduce_fn(self.total.clone())
        names = [k for k, v in (extras or {}).items() if torch.is_tensor(v)]
        if names:
            t = torch.cat([t, torch.stack([extras[k].detach().reshape(()).float().to(t.device) for k in names])])
        values = [float(v) for v in t.tolist()]
        now = values[:4]
        delta = [a - b for a, b in zip(now, self._seen)]
        self._seen = now
        if extras is None:
            return _as_metrics(delta), _as_metrics(now)
        host = {k: v for k, v in extras.items() if not torch.is_tensor(v)}
        host.update(zip(names, values[4:]))
        return _as_metrics(delta), _as_metrics(now), host


def _as_metrics(v):
    n = v[3]
    if n <= 0:
        return {"loss": 0.0, "acc1": 0.0, "acc5": 0.0, "count": 0}
    return {"loss": v[0] / n, "acc1": 100.0 * v[1] / n, "acc5": 100.0 * v[2] / n, "count": int(round(n))}


class Logger:
    """Rank 0 prints plain lines (greppable); other ranks prefix theirs with [rank N]."""

    def __init__(self, rank=0, stream=None):
        self.rank = rank
        self.stream = stream

    @property
    def is_main(self):
        return self.rank == 0

    def __call__(self, msg, all_ranks=False):
        if self.rank != 0 and not all_ranks:
            return
        out = self.stream or sys.stdout
        prefix = "" if self.rank == 0 else "[rank {}] ".format(self.rank)
        for line in str(msg).splitlines() or [""]:
            out.write(prefix + line + "\n")
        out.flush()

    def warn(self, msg):
        self("warning: " + msg, all_ranks=True)
