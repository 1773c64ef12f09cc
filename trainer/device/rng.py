"""The random generators a run draws from and a checkpoint keeps: torch's, the device's, Python's."""
import contextlib
import random

import torch


def rng_states(device):
    """The generators a checkpoint keeps (``restore_rng`` puts them back): torch's, the device's, Python's."""
    return {"torch": torch.get_rng_state(), "device": device.rng_state(), "python": random.getstate()}


def restore_rng(states, device):
    states = states or {}
    if states.get("torch") is not None:
        torch.set_rng_state(states["torch"])
    if states.get("device") is not None:
        with contextlib.suppress(Exception):  # a checkpoint from another device kind
            device.set_rng_state(states["device"])
    if states.get("python") is not None:
        py = states["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
