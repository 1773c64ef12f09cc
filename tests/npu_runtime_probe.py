"""Run in a child process with tests/fake_npu on PYTHONPATH: the NPU runtime settings (``Device.configure``), the
loaders they give, the core binding torch_npu is left, and the profiler of a torch_npu without one (1.11); prints
one JSON object. argv[1]: an output folder; then main.py flags."""
import json
import os
import sys

import torch

import torch_npu  # the fake (tests/fake_npu)

assert getattr(torch_npu, "FAKE", False), "the real torch_npu must never be probed by tests"

from trainer import data  # noqa: E402
from trainer.job import affinity  # noqa: E402
from trainer import device as devmod  # noqa: E402
from trainer.config import DataConfig, parse_config  # noqa: E402
from trainer.errors import UsageError  # noqa: E402
from trainer.record.profiling import StepProfiler  # noqa: E402

out_dir, flags = sys.argv[1], sys.argv[2:]
obs = {"release": torch_npu.__version__}
cfg = parse_config(["--dummy", "--device", "npu"] + flags).cfg
try:
    problem = devmod.Device.of("npu").settings_problem(cfg.launch)
    if problem:
        raise UsageError(problem)
    torch_npu.reset_calls()
    dev = devmod.Device.create("npu", 0)
    obs["settings"] = dev.configure(cfg.launch)
    obs["calls"] = [list(c) for c in torch_npu.calls if c[0] in ("set_compile_mode", "allow_internal_format")]
    obs["jit_compile_false"] = torch.npu.is_jit_compile_false()
    root = os.path.join(out_dir, "data")
    from tools.make_dataset import generate
    generate(root, classes=2, train_per_class=4, val_per_class=2, size=16, seed=0)
    train, val, _ = data.build(DataConfig(root=root, train_crop_size=16, val_resize_size=16, val_crop_size=16), dev,
                               data.Sampling(4))
    obs["loader"] = [train.pin_memory, getattr(train, "pin_memory_device", None),
                     val.pin_memory, getattr(val, "pin_memory_device", None)]
    obs["binding"] = affinity.bind(cfg.launch, "npu")
    prof = StepProfiler((0, 2), False, dev, out_dir, 0, lambda *a, **k: None)
    for step in range(2):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        prof.step(step)
    obs["profile_files"] = sorted(os.path.basename(p) for p in prof.files)
    obs["profile_calls"] = [list(c) for c in torch_npu.calls if c[0] == "autograd.profiler.profile"]
    with open(os.path.join(out_dir, "profile_ops_rank0.txt")) as f:
        obs["profile_table_has_mm"] = "aten::mm" in f.read()
except UsageError as exc:
    obs["problem"] = str(exc)
print(json.dumps(obs))
