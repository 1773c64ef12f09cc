"""What every optimizer builder returns."""


class OptimizerChoice:
    """What an optimizer factory returns: the optimizer, its name for logs and summary.json, whether
    ``zero_grad`` may free the gradients, and a note for the log (or None). ``kind``: the ``--optimizer`` name
    (``optim.create_optimizer`` names what it built)."""

    kind = "sgd"

    def __init__(self, optimizer, name, grads_to_none=True, note=None):
        self.optimizer, self.name, self.grads_to_none, self.note = optimizer, name, grads_to_none, note

    @property
    def fused(self):
        return bool(self.optimizer.defaults.get("fused")) if hasattr(self.optimizer, "defaults") else False
