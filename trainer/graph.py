"""Graph mode (--compile): the training model compiled by the device's graph backend (inductor, torchair on NPU).

Compiling happens at the first call, so the engine runs the first step through ``Graph.first_step``: timed apart
(``compile_seconds``, out of FPS); where it fails, the buffers it changed and the generators it drew from are put
back, a ``note:`` says why and the run trains eagerly from the same step. Only training forward and backward
compile; checkpoints hold the eager model's state dict (no ``_orig_mod.`` prefix) and validation calls the eager
model.
"""
import time

import torch

from trainer.device import out_of_memory
from trainer.device import rng as rngs  # the RNG states a checkpoint keeps


class Graph:
    """The model as the training loop calls it. ``eager``: the model (in DDP where distributed); ``bare``: the
    module holding the weights."""

    def __init__(self, eager, bare, compiled=None, backend=None, mode=None, requested=False, note=None):
        self.eager, self.bare, self.compiled = eager, bare, compiled
        self.current = compiled if compiled is not None else eager
        self.pending = compiled is not None  # the first call compiles
        self.backend, self.mode, self.requested, self.note = backend, mode, requested, note
        self.seconds = None  # compile_seconds: the first step's time

    def __call__(self, *args, **kwargs):
        return self.current(*args, **kwargs)

    def train(self, mode=True):
        self.eager.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @property
    def status(self):
        if not self.requested:
            return "off"
        return "compiled" if self.compiled is not None else "eager"

    def first_step(self, step, device, log):
        """``step()`` as the step that compiles, timed between two device syncs. Where it fails, the BatchNorm
        statistics it moved and what it drew (dropout) are put back and it runs again eagerly (the optimizer had not
        stepped), drawing what an eager run's step draws."""
        self.pending = False
        if self.compiled is None:
            return step()
        saved = [(b, b.detach().clone()) for b in self.bare.buffers()]
        rng = rngs.rng_states(device)
        device.synchronize()
        t0 = time.time()
        try:
            out = step()
            device.synchronize()
        except Exception as exc:
            if out_of_memory(exc):
                raise
            with torch.no_grad():
                for buf, value in saved:
                    buf.copy_(value)
            rngs.restore_rng(rng, device)
            self.current, self.compiled = self.eager, None
            self.note = "--compile: {} could not compile the model ({}: {}): training eagerly".format(
                self.backend, type(exc).__name__, _first_line(exc))
            log("note: " + self.note)
            return step()
        self.seconds = time.time() - t0
        log("=> graph mode: the training step compiled ({}{}) in {:.1f} s (the first step; FPS leaves it out)".format(
            self.backend, ", mode " + self.mode if self.mode != "default" else "", self.seconds))
        return out

    def describe(self):
        """summary.json's ``compile``."""
        return {"enabled": self.requested, "status": self.status, "backend": self.backend,
                "mode": self.mode if self.requested else None, "note": self.note}


def _first_line(exc):
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else "no message")[:200]


def wrap(model, bare, device, section, log):
    """The Graph the loop calls: ``model`` without --compile, else the device's compiled model (eager, with a note,
    where the device has no graph backend or refuses)."""
    if not section.compile:
        return Graph(model, bare)
    try:
        compiled, backend, note = device.compile(model, section.compile_mode)
    except Exception as exc:
        if out_of_memory(exc):
            raise
        compiled, backend, note = model, None, "--compile: torch.compile refused the model ({}: {}): training " \
                                               "eagerly".format(type(exc).__name__, _first_line(exc))
    if note:
        log("note: " + note)
    return Graph(model, bare, None if compiled is model else compiled, backend, section.compile_mode, requested=True,
                 note=note)
