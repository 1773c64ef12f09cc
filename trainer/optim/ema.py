"""``--model-ema``: an exponential moving average of the weights, as torchvision's classification reference keeps it
(flags, defaults, decay): torch's ``AveragedModel`` (BatchNorm statistics averaged too) with ``get_ema_multi_avg_fn``,
or their fallbacks on an older torch (trainer/device/shims.py). It moves after every ``--model-ema-steps`` N-th step of
an epoch (0, N, 2N, ...) by a decay adjusted as torchvision (after pycls): ``1 - min(1, (1 - D) x batch x N / epochs)``;
its first update, and those while the LR warms up, copy the weights. No host sync: the count of updates lives on the
host (AveragedModel's own update reads it back from the device). Checkpoint entry: ``model_ema``, torchvision's.
"""
import itertools

import torch

from trainer import device as devmod


def decay_per_update(decay, global_batch, every, epochs):
    """torchvision's reference's ``--model-ema-decay`` for the global batch, the steps between updates, the epochs."""
    return 1.0 - min(1.0, (1.0 - decay) * global_batch * every / float(epochs))


class ModelEMA:
    """The average of the bare ``model`` (``section``: the config's optim section)."""

    def __init__(self, model, section, global_batch, epochs, steps_per_epoch):
        self.every, self.asked = section.model_ema_steps, section.model_ema_decay
        self.decay = decay_per_update(section.model_ema_decay, global_batch, self.every, epochs)
        self.warm_steps, self.steps_per_epoch = int(round(section.warmup_epochs * steps_per_epoch)), steps_per_epoch
        self.average_fn = devmod.ema_multi_avg_fn(self.decay)
        self.averaged = devmod.averaged_model(model, self.average_fn)
        self.module = self.averaged.module
        self.updates = 0  # n_averaged, on the host
        pairs = list(zip(_tensors(self.module), _tensors(model)))
        self._floats = ([e for e, m in pairs if e.is_floating_point()], [m for e, m in pairs if e.is_floating_point()])
        self._others = [(e, m) for e, m in pairs if not e.is_floating_point()]
        self._all = pairs

    @torch.no_grad()
    def update(self, epoch, i):
        """After the optimizer step of step ``i`` of ``epoch``."""
        if i % self.every:
            return
        if self.updates:  # the first update copies every tensor
            self.average_fn(self._floats[0], self._floats[1], self.updates)
        for e, m in self._others if self.updates else self._all:
            e.copy_(m)
        self.updates += 1
        if epoch * self.steps_per_epoch + i < self.warm_steps:
            self.updates = 0  # torchvision's reference: the average copies the weights while the LR warms up
        self.averaged.n_averaged.fill_(self.updates)

    def state_dict(self):
        return self.averaged.state_dict()

    def load_state_dict(self, state):
        self.averaged.load_state_dict(state)
        self.updates = int(self.averaged.n_averaged)  # a host tensor

    def describe(self):
        """summary.json's ``model_ema``."""
        return {"decay": self.asked, "decay_per_update": self.decay, "every_steps": self.every, "updates": self.updates}


def _tensors(module):
    return [t.detach() for t in itertools.chain(module.parameters(), module.buffers())]
