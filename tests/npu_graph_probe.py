"""Run in a child process with tests/fake_npu on PYTHONPATH: graph mode (--compile) on the (fake) NPU, through
the trainer's own Graph and the device layer. Prints one JSON object of observations. ``argv[1]``: the
--compile-mode."""
import json
import sys

import torch

import torch_npu  # the fake (tests/fake_npu)

assert getattr(torch_npu, "FAKE", False), "the real torch_npu must never be probed by tests"

import models  # noqa: E402
from trainer import graph  # noqa: E402
from trainer.config import ModelConfig  # noqa: E402
from trainer.device import Device  # noqa: E402

lines = []
dev = Device.create("npu", 0)
torch.manual_seed(0)
eager = models.get_model("tiny_cnn", num_classes=4)  # the fake NPU keeps tensors on the CPU
compiled = models.get_model("tiny_cnn", num_classes=4)
compiled.load_state_dict(eager.state_dict())
x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
torch_npu.reset_calls()
g = graph.wrap(compiled, compiled, dev, ModelConfig(compile=True, compile_mode=sys.argv[1]), lines.append).train()


def step(model, params):
    for p in params.parameters():
        p.grad = None
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return None, loss, None


_, loss, _ = g.first_step(lambda: step(g, compiled), dev, lines.append)
_, eager_loss, _ = step(eager.train(), eager)
print(json.dumps({
    "describe": g.describe(), "seconds": g.seconds, "lines": lines,
    "calls": [[str(a) for a in c] for c in torch_npu.calls if c[0].startswith("torchair")],
    "loss_equal": bool(torch.equal(loss, eager_loss)),
    "grads_equal": all(torch.equal(a.grad, b.grad) for a, b in zip(compiled.parameters(), eager.parameters())),
    "state_dict_keys_plain": all(not k.startswith("_orig_mod.") for k in compiled.state_dict()),
}))
