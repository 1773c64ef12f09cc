"""The fake torch_npu's device double (tests/fake_npu/torch_npu/_double.py): tensors on npu:N held in host memory.
main.py trains on it as on the CPU, one process and two ranks, and prints no warning a device does not; a host tensor
in a device op fails as on an NPU; every op whose result needs the device's data on the host is counted (copies,
Python scalars, data-dependent output shapes, boolean-mask indexing); a 0-dim tensor formats as on a device."""
import json
import os
import re
import subprocess

import pytest

from conftest import DOUBLE, PY, RANKS, ROOT, SMALL, STACK, read_summary, run_main

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(600)]

FAKE = os.path.join(ROOT, "tests", "fake_npu")
# resnet18 on 32x32 shapes, a few steps at a small lr (its validation loss stays finite), float32, NCHW on both
TRAIN = ["-a", "resnet18", "--seed", "1", "--epochs", "1", "--max-steps-per-epoch", "4", "-b", "16", "--lr", "0.02",
         "--wd", "0", "--no-channels-last"] + SMALL
COMPARED = ("final_acc1", "final_acc5", "final_loss", "val_loss", "train_acc1")


def fake_env(**extra):
    env = dict(PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8")
    env.update(extra)
    return env


def on_double(script, timeout=300, stderr=False):
    """``script`` in a child process that imported the fake torch_npu; its last stdout line as JSON (and, with
    ``stderr``, what it wrote there)."""
    env = dict(os.environ, **fake_env())
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([PY, "-c", "import torch, torch_npu, json\n" + script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return (out, proc.stderr) if stderr else out


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
        assert_quiet(proc)
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


# what torch prints for a device module without seeding, and DDP's logger for a device without a timer: a run on an
# NPU (torch_npu has both) prints neither
DEVICE_WARNINGS = ("Set seed for `npu` device does not take effect", "Time stats are currently only collected")


def assert_quiet(proc):
    for line in DEVICE_WARNINGS:
        assert line not in proc.stdout + proc.stderr, line


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
        assert_quiet(proc)  # DDP's ranks on the device: no time-stats warning either
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


# Each case run on the device and on the host: the reads the double counted (by kind) on the device, and whether the
# device gave the host's value (a tensor: on the device, with the host's values).
READS = """
def same(a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.device.type == "npu" and torch.equal(a.cpu(), b)
    return type(a) is type(b) and a == b


def attempt(f, tensors):
    try:
        return f(**tensors)
    except TypeError as exc:
        return "TypeError"


def reads(cases, **host):
    device = {k: v.to("npu:0") for k, v in host.items()}
    out = {}
    for name, f in cases:
        before = dict(torch_npu.d2h_ops)
        got = attempt(f, device)
        counted = {k: n - before.get(k, 0) for k, n in torch_npu.d2h_ops.items() if n != before.get(k, 0)}
        out[name] = [counted, same(got, attempt(f, host))]
    return out


x = torch.arange(6, dtype=torch.float32)
"""

SCALARS = READS + """
print(json.dumps(reads([
    ("item", lambda x: x[1].item()), ("float", lambda x: float(x[1])), ("int", lambda x: int(x[3])),
    ("bool", lambda x: bool(x[0])), ("is_nonzero", lambda x: x[2].is_nonzero()), ("in", lambda x: 3.0 in x),
    ("index", lambda x: "abcdef"[x.long()[4]]), ("if", lambda x: "yes" if (x > 4).any() else "no"),
    ("equal", lambda x: torch.equal(x, x * 1)), ("allclose", lambda x: torch.allclose(x, x + 1e-9)),
    ("tolist", lambda x: x.tolist()),
    ("on_device", lambda x: ((x * 2).sum() > 3).any()),
], x=x)))
"""


def test_python_scalars_read_from_the_device_are_counted():
    out = on_double(SCALARS)
    scalar = {"item": 1}  # each of these ends in aten::_local_scalar_dense, torch's read of one value
    want = {"item": scalar, "float": scalar, "int": scalar, "bool": scalar, "is_nonzero": scalar, "in": scalar,
            "index": scalar, "if": scalar, "equal": {"equal": 1}, "allclose": {"allclose": 1},
            "tolist": {"tolist": 1}, "on_device": {}}
    assert {name: counted for name, (counted, _) in out.items()} == want
    assert all(same for _, same in out.values()), out


SHAPES = READS + """
print(json.dumps(reads([
    ("nonzero", lambda x: (x > 2).nonzero()), ("where", lambda x: torch.where(x > 2)),
    ("argwhere", lambda x: torch.argwhere(x > 2)), ("masked_select", lambda x: x.masked_select(x > 2)),
    ("unique", lambda x: (x % 3).unique()), ("unique_counts", lambda x: (x % 3).unique(return_counts=True)),
    ("unique_consecutive", lambda x: (x // 2).unique_consecutive()), ("bincount", lambda x: x.long().bincount()),
    ("repeat_interleave", lambda x: torch.repeat_interleave(x.long() % 3)),
    # the shape known without the data: no read
    ("repeat_interleave_sized", lambda x: torch.repeat_interleave(x.long() % 3, output_size=6)),
    ("same_shape", lambda x: (torch.where(x > 2, x, 0.0), x.masked_fill(x > 2, 0.0), (x > 2).any(), x.sort()[1])),
], x=x)))
"""


def test_ops_with_data_dependent_output_shapes_are_counted():
    out = on_double(SHAPES)
    want = {"nonzero": {"nonzero": 1}, "where": {"nonzero": 1}, "argwhere": {"nonzero": 1},
            "masked_select": {"masked_select": 1}, "unique": {"unique": 1}, "unique_counts": {"unique": 1},
            "unique_consecutive": {"unique_consecutive": 1}, "bincount": {"bincount": 1},
            "repeat_interleave": {"repeat_interleave": 1}, "repeat_interleave_sized": {}, "same_shape": {}}
    assert {name: counted for name, (counted, _) in out.items()} == want
    assert all(same for _, same in out.values()), out


MASKS = READS + """
def put(x, mask, value):
    y = x.clone()
    y[mask] = value
    return y


print(json.dumps(reads([
    ("loss[mask]", lambda x: x[x > 2]), ("rows[mask]", lambda x: x.view(3, 2)[x.view(3, 2)[:, 0] > 1]),
    ("mask = tensor", lambda x: put(x, x > 2, torch.full_like(x[:3], 7.0))),
    ("mask = number", lambda x: put(x, x > 2, 7.0)),
    # integer indices, and a host scalar through a mask (torch's index_put makes it masked_fill_): no read
    ("integer index", lambda x: x[x.long()[1:4:2]]), ("host index", lambda x: x[torch.tensor([0, 5])]),
    ("mask = host scalar", lambda x: put(x, x > 2, torch.tensor(7.0))),
], x=x)))
"""


def test_boolean_mask_indexing_is_counted():
    out = on_double(MASKS)
    want = {"loss[mask]": {"index": 1}, "rows[mask]": {"index": 1}, "mask = tensor": {"index_put": 1},
            "mask = number": {"index_put": 1}, "integer index": {}, "host index": {}, "mask = host scalar": {}}
    assert {name: counted for name, (counted, _) in out.items()} == want
    assert all(same for _, same in out.values()), out


FORMATS = READS + """
print(json.dumps(reads([
    ("f'{loss:.3f}'", lambda x: f"{x.mean():.3f}"), ("f'{lr:>10.2e}'", lambda x: f"{x[1] / 3:>10.2e}"),
    ("f'{n:d}'", lambda x: f"{x.long().sum():d}"), ("format(t)", lambda x: format(x[2])),
    ("'{:.1%}'.format", lambda x: "{:.1%}".format(x[1] / 4)),
    ("1-dim: TypeError", lambda x: f"{x:.3f}"),
], x=x)))
"""


def test_a_0dim_device_tensor_formats_its_number():
    out = on_double(FORMATS)
    counted = {name: counted for name, (counted, _) in out.items()}
    assert counted.pop("1-dim: TypeError") == {}  # as torch's own tensors: only a 0-dim tensor has a number format
    assert counted == {name: {"item": 1} for name in counted}  # Tensor.__format__ reads the number: one read
    assert all(same for _, same in out.values()), out


QUIET = """
import os, tempfile, warnings
import torch.distributed as dist
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.manual_seed(3)
first = torch.randn(4, device="npu:0")
torch.manual_seed(3)
again = torch.randn(4, device="npu:0")
dist.init_process_group("hccl", init_method="file://" + os.path.join(tempfile.mkdtemp(), "store"), rank=0,
                        world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to("npu:0"), device_ids=[0])
for _ in range(3):
    model(torch.randn(3, 4).to("npu:0")).sum().backward()
dist.destroy_process_group()
print(json.dumps({"warnings": [str(w.message) for w in caught], "same": torch.equal(first, again),
                  "seeded": [list(c) for c in torch_npu.calls if c[0] == "manual_seed_all"]}))
"""


def test_seeding_and_ddp_on_the_double_print_nothing_a_device_does_not():
    """torch.manual_seed seeds the device through torch_npu's _is_in_bad_fork and manual_seed_all, and DDP's logger
    finds a timer for the device (torch_npu registers one): neither warns, as on an NPU."""
    out, stderr = on_double(QUIET, stderr=True)
    assert out["warnings"] == [] and out["same"] is True
    assert out["seeded"] == [["manual_seed_all", 3], ["manual_seed_all", 3]]
    for line in DEVICE_WARNINGS:
        assert line not in stderr, stderr[-2000:]


def _autoload_site(tmp_path):
    """A folder for PYTHONPATH with the entry point the real torch_npu wheel installs (2.7.1's entry_points.txt:
    ``[torch.backends] torch_npu = torch_npu:_autoload``), pointing at the double."""
    info = tmp_path / "site" / "torch_npu-2.7.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return str(tmp_path / "site")


@pytest.mark.timeout(900)
def test_a_cpu_run_never_loads_an_installed_torch_npu_with_torch(shapes, tmp_path):
    """torch >= 2.5 imports every installed device extension with torch, and torch_npu's import takes an NPU: a CPU
    golden run on an Ascend host would compete for a card. A run asked for the CPU (--device cpu, --no-accel, with a
    recipe too) sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 before torch is imported; a user's own setting wins."""
    import torch
    if not hasattr(torch, "_import_device_backends"):
        pytest.skip("torch {} loads no device extension with torch (autoload came in 2.5)".format(torch.__version__))
    log = tmp_path / "calls.jsonl"
    env = dict(fake_env(FAKE_NPU_CALL_LOG=str(log)), PYTHONPATH=os.pathsep.join([FAKE, _autoload_site(tmp_path), ROOT]))
    probe = subprocess.run([PY, "-c", "import sys, torch; print('torch_npu' in sys.modules)"], cwd=ROOT,
                           env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    assert probe.stdout.strip() == "True" and '"autoload"' in log.read_text(), (probe.stdout, probe.stderr[-2000:])
    cpu = ["-a", "resnet18", "--seed", "1", "--epochs", "1", "--max-steps-per-epoch", "2", "-b", "16"] + SMALL
    for name, asked, user in (("device_cpu", ["--device", "cpu"], None), ("no_accel", ["--no-accel"], None),
                              ("recipe", ["--no-accel", "--recipe", "fast"], None),
                              ("users_own", ["--device", "cpu"], "1")):
        log.unlink() if log.exists() else None
        run_env = dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD=user) if user else env
        proc = run_main([shapes, "--output-dir", str(tmp_path / name)] + asked + cpu, env=run_env)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        assert read_summary(tmp_path / name)["device"].startswith("cpu"), name
        loaded = log.exists() and '"autoload"' in log.read_text()
        assert loaded == (user == "1"), (name, log.read_text() if log.exists() else "no call of torch_npu")


def test_no_accel_with_every_recipe_is_device_cpu_on_an_npu_host():
    """pytorch/examples' --no-accel is --device cpu, with a recipe too, on a host whose accelerator answers (the
    double's 8 NPUs): the same config and notes. Before, a recipe asked the machine for --device's kind and kept its
    accelerator settings (--amp, --channels-last) for a --no-accel run."""
    out = on_double("""
from trainer import recipes
from trainer.config import parse_config
diffs = {}
for name in recipes.names():
    a = parse_config(["/data", "--no-accel", "--recipe", name], env={})
    b = parse_config(["/data", "--device", "cpu", "--recipe", name], env={})
    if a != b:
        diffs[name] = [str(a)[:300], str(b)[:300]]
print(json.dumps({"recipes": len(recipes.names()), "diffs": diffs,
                  "npu": parse_config(["/data", "--recipe", "resnet18_ffcv_16"], env={}).cfg.precision.amp}))
""")
    assert out["recipes"] >= 3 and out["diffs"] == {}, out
    assert out["npu"] is True  # the same recipe on the NPU keeps its --amp: the double's NPUs answered


def test_deterministic_on_the_npu_turns_on_torch_npus_own_switches(shapes, tmp_path):
    """--deterministic on an NPU: HCCL_DETERMINISTIC, and where torch_npu has them (2.14: TorchNPU 26.x) its kernels
    computed as PyTorch computes them and its deterministic level 1, each named in summary.json's device settings,
    without the warning set_deterministic_level prints; torch_npu 2.1.0.post17 (the double under torch 2.1) has
    neither, and the settings say so."""
    log = tmp_path / "calls.jsonl"
    out = tmp_path / "run"
    proc = run_main([shapes, "--device", "npu", "--deterministic", "--output-dir", str(out)] + TRAIN,
                    env=fake_env(FAKE_NPU_CALL_LOG=str(log)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = read_summary(out)["device_settings"]["deterministic"]
    calls = [json.loads(line)["call"] for line in log.read_text().splitlines()]
    import torch
    if tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2]) < (2, 3):  # the double as 2.1.0.post17
        assert "has neither use_compatible_impl nor set_deterministic_level" in settings, settings
        assert not [c for c in calls if c[0] in ("use_compatible_impl", "set_deterministic_level")], calls
    else:
        assert "TORCH_NPU_USE_COMPATIBLE_IMPL" in settings and "deterministic level 1" in settings, settings
        assert ["use_compatible_impl", True] in calls and ["set_deterministic_level", 1] in calls, calls
    assert "HCCL_DETERMINISTIC" in settings and "set_deterministic_level" not in proc.stderr, proc.stderr[-2000:]
