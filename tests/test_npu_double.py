"""The fake torch_npu's device double (tests/fake_npu/torch_npu/_double.py): tensors on npu:N held in host memory.
main.py trains on it as on the CPU, one process and two ranks; a host tensor in a device op fails as on an NPU;
every copy from the device to the host is counted."""
import json
import os
import re
import subprocess

import pytest

from conftest import DOUBLE, PY, RANKS, ROOT, SMALL, read_summary, run_main

pytestmark = [DOUBLE, pytest.mark.timeout(600)]

FAKE = os.path.join(ROOT, "tests", "fake_npu")
# resnet18 on 32x32 shapes, a few steps at a small lr (its validation loss stays finite), float32, NCHW on both
TRAIN = ["-a", "resnet18", "--seed", "1", "--epochs", "1", "--max-steps-per-epoch", "4", "-b", "16", "--lr", "0.02",
         "--wd", "0", "--no-channels-last"] + SMALL
COMPARED = ("final_acc1", "final_acc5", "final_loss", "val_loss", "train_acc1")


def fake_env(**extra):
    env = dict(PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8")
    env.update(extra)
    return env


def on_double(script, timeout=300):
    """``script`` in a child process that imported the fake torch_npu; its last stdout line as JSON."""
    env = dict(os.environ, **fake_env())
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([PY, "-c", "import torch, torch_npu, json\n" + script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", autouse=True)
def double():
    """The double's C++ part built (or loaded) once before the tests; without a compiler they skip, saying why."""
    why = on_double("print(json.dumps(torch_npu._double.unavailable))", timeout=540)
    if why:
        pytest.skip(why)


def assert_same_run(npu_dir, cpu_dir, device):
    npu, cpu = read_summary(npu_dir), read_summary(cpu_dir)
    assert npu["status"] == cpu["status"] == "ok"
    assert npu["device"] == device and npu["versions"]["torch_npu"].endswith("+fake")
    assert npu["final_acc1"] == cpu["final_acc1"]
    for key in COMPARED:
        assert npu[key] == pytest.approx(cpu[key], rel=1e-4, abs=1e-4), key


def test_resnet18_trains_on_the_double_as_on_the_cpu(shapes, tmp_path):
    runs, logs = {}, {}
    for name, device, extra in (("npu", "npu", []), ("cpu", "cpu", []), ("amp", "npu", ["--amp"])):
        out = tmp_path / name
        proc = run_main([shapes, "--device", device, "--output-dir", str(out)] + TRAIN + extra,
                        env=fake_env() if device == "npu" else None)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name], logs[name] = out, proc.stdout
    assert_same_run(runs["npu"], runs["cpu"], "npu:0")
    assert "=> resnet18 on npu:0 |" in logs["npu"]
    # --amp on the device: torch_npu's autocast in float16 and its dynamic GradScaler, as the guides train. The
    # first step's loss (float16 forward) stays near float32's; each overflow step halved the scale from 2**16.
    amp = read_summary(runs["amp"])
    assert amp["status"] == "ok"
    assert (amp["amp"]["enabled"], amp["amp"]["impl"], amp["amp"]["dtype"]) == (True, "native", "float16")
    assert amp["amp"]["final_loss_scale"] == 65536.0 / 2 ** amp["overflow_steps"]
    assert first_loss(logs["amp"]) == pytest.approx(first_loss(logs["npu"]), rel=1e-2)


def first_loss(log):
    """The loss of the first step, from its progress line (pytorch/examples' format)."""
    return float(re.search(r"^Epoch: \[0\]\[\s*1/\d+\].*\tLoss (\S+) ", log, re.M).group(1))


@RANKS
def test_two_ranks_on_the_double_match_two_cpu_ranks(shapes, tmp_path):
    runs, logs = {}, {}
    for device in ("npu", "cpu"):
        out = tmp_path / device
        proc = run_main([shapes, "--device", device, "--output-dir", str(out), "--multiprocessing-distributed",
                         "--device-list", "0,1", "--port", "0", "--dist-timeout", "120"] + TRAIN,
                        env=fake_env(OMP_NUM_THREADS="1") if device == "npu" else {"OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[device], logs[device] = out, proc.stdout
    assert_same_run(runs["npu"], runs["cpu"], "npu:0")
    assert read_summary(runs["npu"])["world_size"] == 2
    assert "[rank 1] => resnet18 on npu:1 |" in logs["npu"]  # each rank on its own NPU, gradients all-reduced


HOST_TENSOR_MODEL = """
class Scaled(torch.nn.Module):
    # a porting bug: a tensor made in forward without a device stays on the host
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x) * torch.arange(1, 4).float()


out = {}
for device in ("cpu", "npu:0"):
    model = Scaled().to(device)
    try:
        model(torch.randn(2, 4, device=device)).sum().backward()
        out[device] = "ok"
    except RuntimeError as exc:
        out[device] = str(exc)
a, b = torch.ones(3, device="npu:0"), torch.ones(3, device="npu:1")
try:
    a + b
    out["two_npus"] = "ok"
except RuntimeError as exc:
    out["two_npus"] = str(exc)
out["scalar"] = (a * torch.tensor(2.0)).device.type  # a 0-dim host tensor is a scalar, as on a device
out["moved"] = str(b.to("npu:0").add(a).device)
print(json.dumps(out))
"""


def test_a_host_tensor_in_a_device_op_fails_as_on_an_npu():
    out = on_double(HOST_TENSOR_MODEL)
    assert out["cpu"] == "ok"
    assert out["npu:0"].startswith("Expected all tensors to be on the same device"), out
    assert "npu:0 and cpu" in out["npu:0"]
    assert out["two_npus"].startswith("Expected all tensors to be on the same device") and "npu:1" in out["two_npus"]
    assert out["scalar"] == "npu" and out["moved"] == "npu:0"


COUNTED = """
t = torch.arange(6, dtype=torch.float32).to("npu:0")
seen = {}
def note(name):
    seen[name] = torch_npu.d2h_copies
note("start")
u = (t * 2).sum()          # on the device: no copy
note("device_ops")
u.item(); note("item")
t.cpu(); note("cpu")
t.tolist(); note("tolist")
float(t[1]); note("float")
host = torch.empty(6)
host.copy_(t); note("copy_")
t.to("cpu", torch.float64); note("to")
torch.npu.synchronize(); note("synchronize")
print(json.dumps({"seen": seen, "ops": dict(torch_npu.d2h_ops), "values": host.tolist(), "dev": str(u.device)}))
"""


def test_device_to_host_copies_are_counted():
    out = on_double(COUNTED)
    seen = out["seen"]
    steps = ["start", "device_ops", "item", "cpu", "tolist", "float", "copy_", "to", "synchronize"]
    assert [seen[s] - seen["start"] for s in steps] == [0, 0, 1, 2, 3, 4, 5, 6, 6]
    assert out["ops"] == {"item": 2, "to_cpu": 2, "tolist": 1, "copy_to_host": 1}
    assert out["values"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and out["dev"] == "npu:0"
