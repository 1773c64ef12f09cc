"""Porting tools: ONNX export checked by onnxruntime, op inventory with the dynamic-shape check,
module-by-module precision comparison, and step profiling through main.py."""
import json
import os
import subprocess

import pytest
import torch

import models
from conftest import (IMPORTS_FAKE_NPU, ONCE, PY, ROOT, SMALL, STACK, assert_call_error, assert_one_line_error, call,
                      read_summary, run_main, run_tool)
from tools import compare_precision, export_onnx, op_report
from trainer.record import checkpoint
from trainer.device import Device
from trainer.record.profiling import StepProfiler

pytestmark = [ONCE, pytest.mark.tools]  # make test-tools

FAKE = os.path.join(ROOT, "tests", "fake_npu")


def check_usage_error(mod, argv, capsys, *fragments):
    return assert_call_error(mod.main, argv, capsys, *fragments)


def diffs_of(out):
    """{batch: max abs difference} from export_onnx's output."""
    found = {}
    for line in out.splitlines():
        if "onnxruntime vs PyTorch, batch" in line:
            batch = int(line.split("batch")[1].split(":")[0])
            found[batch] = float(line.split("max abs difference")[1].split()[0])
    return found


# ---------------------------------------------------------------- runs of main.py


@pytest.fixture(scope="module")
def resnet_run(shapes, tmp_path_factory):
    """resnet18, 2 epochs of 1 step, profiling global step 0 and stopping after it."""
    out = tmp_path_factory.mktemp("resnet_run")
    proc = run_main([shapes, "-a", "resnet18", "--device", "cpu", "-b", "16", "--epochs", "2",
                     "--max-steps-per-epoch", "1", "--seed", "0", "--profile-steps", "0:1", "--profile-stop",
                     "--output-dir", str(out)] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def shufflenet_run(shapes, tmp_path_factory):
    out = tmp_path_factory.mktemp("shufflenet_run")
    proc = run_main([shapes, "-a", "shufflenet_v2_x0_5_npu", "--device", "cpu", "-b", "16", "--epochs", "1",
                     "--max-steps-per-epoch", "1", "--seed", "0", "--output-dir", str(out)] + SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


# ---------------------------------------------------------------- ONNX export


@STACK
def test_export_resnet_checkpoint_written_by_main(resnet_run, tmp_path, capsys):
    out_dir, _ = resnet_run
    onnx_path = tmp_path / "resnet18.onnx"
    # arch and num_classes come from the checkpoint
    rc, out, err = call(export_onnx.main, [out_dir / "checkpoint.pth.tar", "--image-size", "32", "--output", onnx_path],
                        capsys)
    assert rc == 0, (out, err)
    assert "exported resnet18 (10 classes" in out
    diffs = diffs_of(out)
    assert sorted(diffs) == [1, 5] and all(d <= 1e-4 for d in diffs.values()), diffs
    import onnx
    graph = onnx.load(str(onnx_path)).graph
    assert [i.name for i in graph.input] == ["input"] and [o.name for o in graph.output] == ["output"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch_size"
    assert onnx.load(str(onnx_path)).opset_import[0].version == 11


@STACK
def test_export_npu_shufflenet_checkpoint(shufflenet_run, tmp_path, capsys):
    onnx_path = tmp_path / "shufflenet.onnx"
    rc, out, err = call(export_onnx.main, [shufflenet_run / "model_best.pth.tar", "--image-size", "32",
                                      "--output", onnx_path], capsys)
    assert rc == 0, (out, err)
    assert "exported shufflenet_v2_x0_5_npu" in out
    diffs = diffs_of(out)
    assert sorted(diffs) == [1, 5] and all(d <= 1e-4 for d in diffs.values()), diffs


@STACK
def test_export_plain_state_dict_with_module_prefix(resnet_run, tmp_path, capsys):
    out_dir, _ = resnet_run
    sd = checkpoint.read(str(out_dir / "checkpoint.pth.tar"))["state_dict"]
    prefixed = {"module." + k: v for k, v in sd.items()}
    path = tmp_path / "ddp_weights.pth"
    torch.save(prefixed, str(path))
    # the weights really land in the model (num_classes read from fc.weight)
    model, arch, num_classes = export_onnx.load_model(str(path), "resnet18", log=lambda m: None)
    assert (arch, num_classes) == ("resnet18", 10)
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    # a plain state dict names no architecture
    check_usage_error(export_onnx, [path, "--output", tmp_path / "x.onnx"], capsys, "pass --arch")
    rc, out, err = call(export_onnx.main, [path, "--arch", "resnet18", "--image-size", "32", "--opset", "13",
                                      "--output", tmp_path / "r.onnx"], capsys)
    assert rc == 0, (out, err)
    diffs = diffs_of(out)
    assert sorted(diffs) == [1, 5] and all(d <= 1e-4 for d in diffs.values()), diffs


@pytest.fixture
def tiny_weights(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tiny.pth"
    torch.save(models.get_model("tiny_cnn", num_classes=10).state_dict(), str(path))
    return path


@STACK
def test_export_never_overwrites_without_force(tiny_weights, tmp_path, capsys):
    target = tmp_path / "keep.onnx"
    target.write_bytes(b"precious")
    check_usage_error(export_onnx, [tiny_weights, "--arch", "tiny_cnn", "--image-size", "32", "--output", target],
                      capsys, "already exists", "--force")
    assert target.read_bytes() == b"precious"
    rc, out, err = call(export_onnx.main, [tiny_weights, "--arch", "tiny_cnn", "--image-size", "32", "--output", target,
                                      "--force"], capsys)
    assert rc == 0, err
    assert target.read_bytes()[:8] != b"precious" and "verified" in out


@STACK
def test_export_over_tolerance_exits_nonzero_and_says_which(tiny_weights, tmp_path, capsys):
    rc, out, err = call(export_onnx.main, [tiny_weights, "--arch", "tiny_cnn", "--image-size", "32",
                                      "--output", tmp_path / "t.onnx", "--rtol", "0", "--atol", "1e-30"], capsys)
    assert rc == 1, (out, err)
    assert "OVER tolerance" in out
    assert "batch size(s) 1, 5" in err and "Traceback" not in err


@STACK
def test_export_check_is_relative_to_magnitude_and_catches_a_corrupted_file(shufflenet_run, tmp_path, capsys):
    import onnx
    from onnx import numpy_helper

    path = tmp_path / "s.onnx"
    rc, out, err = call(export_onnx.main, [shufflenet_run / "checkpoint.pth.tar", "--image-size", "32",
                                      "--output", path], capsys)
    assert rc == 0, (out, err)
    model, _, _ = export_onnx.load_model(str(shufflenet_run / "checkpoint.pth.tar"), None, None, lambda m: None)
    good = export_onnx.verify(model, str(path), 32)
    assert all(export_onnx.within(d, m, 1e-4, 1e-5) for _, d, m in good)
    # one initializer perturbed by 1 % of its scale: a wrong file, and the check says so
    m = onnx.load(str(path))
    init = max(m.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    arr = numpy_helper.to_array(init).copy()
    arr.flat[: max(1, arr.size // 10)] += 0.01 * float(abs(arr).max())
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    bad_path = tmp_path / "bad.onnx"
    onnx.save(m, str(bad_path))
    bad = export_onnx.verify(model, str(bad_path), 32)
    assert not any(export_onnx.within(d, mx, 1e-4, 1e-5) for _, d, mx in bad), bad


@pytest.mark.parametrize("args,fragments", [
    (["{missing}", "--arch", "resnet18"], ["does not exist"]),
    (["{weights}", "--arch", "resnet19"], ["unknown architecture 'resnet19'", "resnet18"]),
    (["{weights}", "--arch", "resnet18"], ["does not fit --arch resnet18", "--num-classes"]),
    (["{weights}", "--arch", "tiny_cnn", "--num-classes", "7"], ["does not fit", "(10, 128)"]),
    (["{weights}", "--arch", "tiny_cnn", "--opset", "3"], ["--opset", "from 7 to"]),
    (["{weights}", "--arch", "tiny_cnn", "--opset", "eleven"], ["--opset"]),
    (["{weights}", "--arch", "tiny_cnn", "--image-size", "0"], ["--image-size"]),
    (["{weights}", "--arch", "tiny_cnn", "--atol", "-1"], ["--atol"]),
    (["{notorch}", "--arch", "tiny_cnn"], ["not a readable PyTorch checkpoint"]),
])
def test_export_bad_arguments(args, fragments, tiny_weights, tmp_path, capsys):
    notorch = tmp_path / "notes.txt"
    notorch.write_text("hello")
    argv = [a.format(missing=tmp_path / "nope.pth", weights=tiny_weights, notorch=notorch) for a in args]
    check_usage_error(export_onnx, argv + ["--output", tmp_path / "o.onnx"], capsys, *fragments)
    assert not (tmp_path / "o.onnx").exists()
    assert not [f for f in os.listdir(str(tmp_path)) if ".tmp-" in f]


def test_export_usage_error_is_one_line_at_process_level(tmp_path):
    proc = run_tool("export_onnx.py", [str(tmp_path / "missing.pth.tar"), "--output", str(tmp_path / "m.onnx")])
    assert_one_line_error(proc, "does not exist")


# ---------------------------------------------------------------- op report


@STACK
def test_op_report_fixed_shapes_has_no_dynamic_ops_and_lists_unsupported(tmp_path, capsys):
    supported = tmp_path / "supported.txt"
    supported.write_text("# vendor list\naten::conv2d\nconvolution\nbatch_norm\naten::relu\nlinear\n\n")
    out_dir = tmp_path / "report"
    rc, out, err = call(op_report.main, ["--arch", "resnet18", "--steps", "2", "--batch-size", "4", "--image-size",
                                         "32", "--supported-ops", supported, "--output-dir", out_dir], capsys)
    assert rc == 0, (out, err)
    report = json.loads((out_dir / "op_report.json").read_text())
    names = report["all_ops"]
    assert {"aten::conv2d", "aten::batch_norm", "aten::convolution_backward"} <= set(names), names
    assert report["dynamic_ops"] == []
    dyn_lines = [ln for ln in (out_dir / "dynamic_ops.txt").read_text().splitlines() if not ln.startswith("#")]
    assert dyn_lines == []
    all_lines = [ln for ln in (out_dir / "all_ops.txt").read_text().splitlines() if not ln.startswith("#")]
    conv = [ln.split("\t") for ln in all_lines if ln.startswith("aten::conv2d\t")]
    assert conv and int(conv[0][1]) == 2 * 20 and "[4,3,32,32]" in conv[0][2]  # 20 convs per step
    unsupported = [ln for ln in (out_dir / "unsupported_ops.txt").read_text().splitlines() if not ln.startswith("#")]
    assert unsupported == report["unsupported_ops"] and unsupported
    assert "aten::convolution_backward" in unsupported and "aten::addmm" in unsupported
    for listed in ("aten::conv2d", "aten::convolution", "aten::batch_norm", "aten::relu_", "aten::linear"):
        assert listed not in unsupported, listed  # named, also without namespace or as in-place variant
    assert "0 dynamic-shape op(s)" in out


class GrowingCrop(torch.nn.Module):
    """Planted dynamic shape: every call crops its input to a different width."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 4, 1)
        self.fc = torch.nn.Linear(4, 10)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x = torch.relu(self.conv(x))
        x = x[:, :, :, : x.shape[-1] - self.calls]  # width changes with the step
        return self.fc(self.head(x).mean((2, 3)))


def _batches(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 10, (2,), generator=g)


@STACK
def test_op_report_finds_a_planted_dynamic_shape(tmp_path):
    report = op_report.op_report(GrowingCrop(), _batches, steps=3)
    op_report.write_report(report, str(tmp_path))
    dyn = set(report["dynamic_ops"])
    # the 1x1 conv after the crop sees a new width every step; the first conv never does
    assert "aten::conv2d" in dyn and "aten::mean" in dyn, dyn
    conv = next(o for o in report["ops"] if o["name"] == "aten::conv2d")
    # warm-up crops to width 15, the recorded steps to 14, 13, 12
    assert [(n["step"], n["input_shapes"][0]) for n in conv["new_shapes"]] == [(2, [2, 4, 16, 13]), (3, [2, 4, 16, 12])]
    assert sorted(s[0] for s in conv["first_step_shapes"]) == [[2, 3, 16, 16], [2, 4, 16, 14]]
    text = (tmp_path / "dynamic_ops.txt").read_text()
    assert "aten::conv2d\t" in text and "(step 3)" in text
    # the same model with a fixed crop: nothing dynamic
    fixed = GrowingCrop()
    fixed.forward = lambda x: fixed.fc(fixed.head(torch.relu(fixed.conv(x))[:, :, :, :10]).mean((2, 3)))
    assert op_report.op_report(fixed, _batches, steps=3)["dynamic_ops"] == []


def test_op_report_support_list_matching():
    wanted = op_report.expand_supported({"aten::add", "mul.Tensor", "relu"})
    assert op_report.is_supported("aten::add.Tensor", wanted)
    assert op_report.is_supported("aten::add_", wanted)  # in-place form of a listed op
    assert op_report.is_supported("aten::relu_", wanted)
    assert op_report.is_supported("aten::mul.Tensor", wanted)
    assert not op_report.is_supported("aten::addmm", wanted)
    assert not op_report.is_supported("aten::mul", wanted)  # only the .Tensor overload is listed


@pytest.mark.parametrize("args,fragments", [
    (["--arch", "tiny_cnn", "--steps", "1"], ["--steps", "at least 2"]),
    (["--arch", "tiny_cnn", "--steps", "zero"], ["--steps"]),
    (["--arch", "resnet19"], ["unknown architecture 'resnet19'"]),
    (["--arch", "tiny_cnn", "--supported-ops", "{missing}"], ["--supported-ops", "does not exist"]),
    (["--arch", "tiny_cnn", "--supported-ops", "{empty}"], ["names no op"]),
    (["--arch", "tiny_cnn", "--device", "tpu"], ["--device"]),
    (["--steps", "2"], ["--arch"]),
])
def test_op_report_bad_arguments(args, fragments, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    argv = [a.format(missing=tmp_path / "nope.txt", empty=tmp_path / "empty.txt") for a in args]
    check_usage_error(op_report, argv + ["--output-dir", tmp_path / "r"], capsys, *fragments)
    assert not (tmp_path / "r").exists()


def test_op_report_keeps_an_earlier_report(tmp_path, capsys):
    out_dir = tmp_path / "r"
    out_dir.mkdir()
    (out_dir / "all_ops.txt").write_text("earlier\n")
    check_usage_error(op_report, ["--arch", "tiny_cnn", "--output-dir", out_dir], capsys, "already holds", "--force")
    assert (out_dir / "all_ops.txt").read_text() == "earlier\n"


# ---------------------------------------------------------------- precision comparison


@STACK
def test_compare_fp32_with_itself_is_exact(tmp_path, capsys):
    out = tmp_path / "same.json"
    rc, text, err = call(compare_precision.main, ["--arch", "resnet18", "--target", "cpu", "--image-size", "32",
                                             "--steps", "2", "--output", out], capsys)
    assert rc == 0, (text, err)
    res = json.loads(out.read_text())
    assert res["over_tolerance"] == 0 and res["max_rel"] == 0.0
    assert all(r["max_abs"] == 0.0 for r in res["rows"])
    kinds = {r["kind"] for r in res["rows"]}
    assert kinds == {"forward", "loss", "grad", "buffer"}
    names = [r["name"] for r in res["rows"]]
    assert "step2/buffer/bn1.running_var" in names and "step1/grad/conv1.weight" in names
    assert "step1/forward/layer1.0.relu#2" in names  # a module called twice is recorded per call
    assert "within tolerance" in text


@STACK
def test_compare_bf16_autocast_finds_and_locates_the_drift(tmp_path, capsys):
    out = tmp_path / "bf16.json"
    rc, text, err = call(compare_precision.main, ["--arch", "resnet18", "--target", "cpu", "--target-amp",
                                             "--image-size", "32", "--output", out], capsys)
    assert rc == 1, (text, err)
    res = json.loads(out.read_text())
    assert res["target"]["amp_dtype"] == "bfloat16"
    assert res["over_tolerance"] > 0 and res["max_rel"] > 1e-3
    module = res["first_module_over"]
    assert module in dict(models.get_model("resnet18", num_classes=10).named_modules())
    first = next(r for r in res["rows"] if r["name"] == res["first_forward_over"])
    earlier = [r for r in res["rows"] if r["order"] < first["order"] and r["kind"] == "forward"]
    assert first["max_abs"] > 0 and all(not r["over"] for r in earlier)
    assert "first module over tolerance: {}".format(module) in text
    # the guide's criterion (mean |t - r| <= 1e-4) is reported beside ours, per tensor and in total
    assert all(r["guide_ok"] == (r["mean_abs"] <= 1e-4) for r in res["rows"] if r["mean_abs"] is not None)
    assert res["guide_over"] == sum(1 for r in res["rows"] if not r["guide_ok"]) > 0
    assert "the guide's criterion" in text


@pytest.mark.parametrize("args,fragments", [
    (["--arch", "resnet19"], ["unknown architecture"]),
    (["--arch", "tiny_cnn", "--steps", "0"], ["--steps"]),
    (["--arch", "tiny_cnn", "--rtol", "-1"], ["--rtol"]),
    (["--arch", "tiny_cnn", "--target", "gpu"], ["--target"]),
    (["--arch", "tiny_cnn", "--output", "{existing}"], ["already exists", "--force"]),
    (["--arch", "tiny_cnn", "--output", "{nofolder}"], ["does not exist"]),
])
def test_compare_bad_arguments(args, fragments, tmp_path, capsys):
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    argv = [a.format(existing=existing, nofolder=tmp_path / "no" / "x.json") for a in args]
    check_usage_error(compare_precision, argv, capsys, *fragments)
    assert existing.read_text() == "{}"


# ---------------------------------------------------------------- profiling


@STACK
def test_profile_steps_through_main_writes_trace_and_stops(resnet_run):
    out_dir, proc = resnet_run
    trace = json.loads((out_dir / "profile_rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::convolution_backward" in names  # a training step was recorded
    table = (out_dir / "profile_ops_rank0.txt").read_text()
    assert "sorted by self_cpu_time_total" in table and "aten::" in table
    assert "profiler: recording global steps 0..0" in proc.stdout
    assert "stopping after the profiled steps (--profile-stop)" in proc.stdout
    summary = read_summary(out_dir)
    assert summary["epochs_completed"] == 1  # of --epochs 2


class _Log:
    def __init__(self):
        self.lines = []

    def __call__(self, msg, **kwargs):
        self.lines.append(msg)


def _train_steps(profiler, steps, first=0):
    model = torch.nn.Linear(6, 3)
    seen = []
    for s in range(first, first + steps):
        model(torch.randn(2, 6)).sum().backward()
        profiler.step(s)
        seen.append((s, profiler.recording, profiler.stop_run))
        if profiler.stop_run:
            break
    return seen


@STACK
def test_step_profiler_window_without_stop(tmp_path):
    log = _Log()
    prof = StepProfiler((2, 4), False, Device("cpu", None), str(tmp_path), 3, log)
    seen = _train_steps(prof, 6)
    # recording starts after step 1 (so steps 2 and 3 are recorded) and stops after step 3
    assert [(s, rec) for s, rec, _ in seen] == [(0, False), (1, True), (2, True), (3, False), (4, False), (5, False)]
    assert not any(stop for _, _, stop in seen)
    assert json.loads((tmp_path / "profile_rank3.json").read_text())["traceEvents"]
    assert (tmp_path / "profile_ops_rank3.txt").exists()
    assert any("recording global steps 2..3" in ln for ln in log.lines)


@STACK
def test_step_profiler_resumed_inside_and_past_the_window(tmp_path):
    log = _Log()
    prof = StepProfiler((2, 5), True, Device("cpu", None), str(tmp_path / "a"), 0, log)
    seen = _train_steps(prof, 5, first=3)  # resumed at global step 3
    assert seen[-1][0] == 4 and seen[-1][2] is True
    assert (tmp_path / "a" / "profile_rank0.json").exists()
    assert any("recording global steps 4..4" in ln for ln in log.lines)
    log = _Log()
    prof = StepProfiler((2, 5), True, Device("cpu", None), str(tmp_path / "b"), 0, log)
    seen = _train_steps(prof, 3, first=10)
    assert seen == [(10, False, True)] and any("nothing recorded" in ln for ln in log.lines)
    assert not (tmp_path / "b").exists()


@STACK
def test_step_profiler_close_writes_an_unfinished_window(tmp_path):
    prof = StepProfiler((0, 100), False, Device("cpu", None), str(tmp_path), 0, _Log())
    _train_steps(prof, 2)
    prof.close()
    assert json.loads((tmp_path / "profile_rank0.json").read_text())["traceEvents"]


NPU_PROFILE = """
import json, sys, torch
from trainer.record import checkpoint
from trainer.device import Device
from trainer.record.profiling import StepProfiler
dev = Device.create("npu", 0)
lines = []
prof = StepProfiler((1, 3), True, dev, sys.argv[1], 2, lambda m, **k: lines.append(m))
model = torch.nn.Linear(8, 4)
for s in range(6):
    model(torch.randn(2, 8)).sum().backward()
    prof.step(s)
    if prof.stop_run:
        break
import torch_npu
print(json.dumps({"last": s, "lines": lines, "calls": [list(c) for c in torch_npu.calls if c[0] != "set_device"]}))
"""


@STACK
@IMPORTS_FAKE_NPU
def test_step_profiler_on_npu_uses_torch_npu_profiler_and_its_files(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="1")
    proc = subprocess.run([PY, "-c", NPU_PROFILE, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["last"] == 2
    calls = [c for c in res["calls"] if c[0] != "synchronize"]
    assert [c[0] for c in calls] == ["tensorboard_trace_handler", "profile", "export_chrome_trace"]
    assert calls[1][1] == ["CPU", "NPU"]  # the activities the device layer gives
    assert "synchronize" in [c[0] for c in res["calls"]]
    assert res["calls"][0][1] == str(tmp_path / "profile_rank2")
    trace = tmp_path / "profile_rank2" / "rank2_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    assert json.loads(trace.read_text())["traceEvents"]
    table = (tmp_path / "profile_ops_rank2.txt").read_text()
    assert "trace_view.json" in table and "aten::linear" in table
    assert not (tmp_path / "profile_rank2.json").exists()


@pytest.mark.timeout(300)
def test_callpath_follows_a_run_and_a_reader_goes_back_into_few_files(shapes, tmp_path):
    """tools/callpath.py on a real run: the path starts at main.py and goes through the plan and the trainer;
    a reader following the configuration goes back into a file from another one fewer than 10 times (the house's
    shape: parse -> plan -> run -> Trainer)."""
    out = str(tmp_path / "cp.json")
    r = subprocess.run([PY, "-m", "tools.callpath", "--json", out, "--", shapes, "-a", "resnet18", "--device", "cpu",
                        "--epochs", "1", "-b", "16", "--max-steps-per-epoch", "2", "--output-dir",
                        str(tmp_path / "run")] + SMALL, cwd=ROOT, capture_output=True, text=True, timeout=280,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    with open(out) as f:
        got = json.load(f)
    assert got["exit_code"] == 0 and got["follow"] == "config" and got["path"][0] == "main.py"
    assert {"trainer/plan.py", "trainer/trainer.py", "trainer/engine.py"} <= set(got["files"])
    assert got["total_reentries"] < 10, got["reentries"]
    assert "re-entries: {}".format(got["total_reentries"]) in r.stdout
