"""Child process with the fake torch_npu: the trainer's whole flow on --device npu, one step on the fake device
(tests/fake_npu/torch_npu/_double.py); what matters here is the order: set_device is the very first NPU call.
"""
import json
import sys

import torch_npu  # the fake

from trainer import run
from trainer.config import parse_config
from trainer.plan import plan

cfg = parse_config(["--dummy", "--device", "npu", "--gpu", "5", "-a", "tiny_cnn", "--output-dir",
                       sys.argv[1], "--epochs", "1", "--max-steps-per-epoch", "1", "--no-validate", "-b", "2",
                       "--train-crop-size", "32"], env={}).cfg
planned = plan(cfg, env={})
torch_npu.reset_calls()
try:
    run.worker(planned)
    stopped = None
except Exception as exc:
    stopped = type(exc).__name__
print(json.dumps({"calls": [list(map(str, c[:2])) for c in torch_npu.calls], "stopped": stopped}))
