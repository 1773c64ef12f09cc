"""What every optimizer builder returns."""


class OptimizerChoice:
    """What an optimizer builder returns: the optimizer, its name for logs and summary.json, whether ``zero_grad``
    may free the gradients, a note (or None), its parameter groups' names; ``kind``: the ``--optimizer`` name."""

    kind = "sgd"

    def __init__(self, optimizer, name, grads_to_none=True, note=None, groups=("all",)):
        self.optimizer, self.name, self.grads_to_none, self.note = optimizer, name, grads_to_none, note
        self.groups = tuple(groups)

    @property
    def fused(self):
        return bool(self.optimizer.defaults.get("fused")) if hasattr(self.optimizer, "defaults") else False
