"""checkpoint.Reader: a file checked by the launcher and then loaded by the run is read from disk once."""
import os

import pytest
import torch

from trainer import checkpoint
from trainer import device as devmod

pytestmark = pytest.mark.timeout(60)


def test_a_file_read_twice_in_a_row_is_loaded_once(tmp_path, monkeypatch):
    path = str(tmp_path / "c.pth.tar")
    checkpoint.save({"epoch": 1, "state_dict": {"w": torch.ones(2)}}, path)
    loads = []
    real = devmod.torch_load
    monkeypatch.setattr(devmod, "torch_load", lambda *a, **k: loads.append(1) or real(*a, **k))
    reader = checkpoint.Reader()
    first = reader.read(path)
    second = reader.read(path)
    assert second is first and len(loads) == 1
    third = reader.read(path)  # handed over once only: a third read loads again
    assert third is not first and len(loads) == 2
    checkpoint.save({"epoch": 2, "state_dict": {"w": torch.zeros(2)}}, path)  # the file changed
    assert reader.read(path)["epoch"] == 2 and len(loads) == 3
    reader.release()
    assert reader.read(path)["epoch"] == 2 and len(loads) == 4
    os.remove(path)
