"""Graph mode (--compile): compiled training against eager, resume, DDP, mixed precision, the divergence guard,
ONNX export of a compiled run's checkpoint, the fallback to eager where compiling fails, and torchair on the
(fake) NPU. Compiling is slow on a CPU: these tests are their own lane (make test-graph, marker ``graph``)."""
import json
import os
import subprocess

import pytest
import torch

import models
from conftest import ONCE, PY, RANKS, ROOT, SMALL, STACK, call, needs_cpu_float16, read_summary, run_main
from trainer.precision import amp as ampmod
from trainer import graph, optim
from trainer.config import ModelConfig, OptimConfig, PrecisionConfig, parse_config
from trainer.plan import plan
from trainer.device import Device, host
from trainer.errors import UsageError

pytestmark = [STACK, pytest.mark.graph, pytest.mark.timeout(600),
              pytest.mark.skipif(Device("cpu", None).compile_missing() is not None,
                                 reason=str(Device("cpu", None).compile_missing()))]

CPU = Device("cpu", None)
FAKE = os.path.join(ROOT, "tests", "fake_npu")
RUN = ["-a", "tiny_cnn", "-b", "8", "--lr", "0.05", "--seed", "3", "--device", "cpu", "--no-tensorboard",
       "--fps-warmup-steps", "0"] + SMALL


def weights(folder, name="checkpoint.pth.tar"):
    return torch.load(os.path.join(str(folder), name), map_location="cpu", weights_only=True)["state_dict"]


def ok(proc):
    """A run that ended well: exit 0 and nothing on stderr (compiling included)."""
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def pair(shapes, tmp_path_factory):
    """The same 6 steps (2 epochs of 3), eager and compiled: {"eager"|"compiled": (folder, process)}."""
    out = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        folder = tmp_path_factory.mktemp(name)
        out[name] = folder, ok(run_main([shapes, "--epochs", "2", "--max-steps-per-epoch", "3", "--output-dir",
                                         str(folder)] + RUN + extra))
    return out


def test_compiled_training_equals_eager_and_reports_compile_time_apart(pair):
    (eager, _), (compiled, proc) = pair["eager"], pair["compiled"]
    a, b = weights(eager), weights(compiled)
    assert list(a) == list(b) and not [k for k in b if "_orig_mod" in k]  # the eager model's state dict
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    se, sc = read_summary(eager), read_summary(compiled)
    assert se["status"] == sc["status"] == "ok"
    assert abs(se["final_loss"] - sc["final_loss"]) < 1e-4 and se["final_acc1"] == sc["final_acc1"]
    assert se["compile"]["status"] == "off" and se["compile_seconds"] is None
    assert sc["compile"] == {"enabled": True, "status": "compiled", "backend": "inductor", "mode": "default",
                             "note": None}
    assert sc["compile_seconds"] > 0 and sc["config"]["compile"] is True
    flags = host._cpuinfo_flags()  # float32: the warning where graph mode measured no faster (no AVX-512)
    assert ("warning: --compile on a CPU without AVX-512" in proc.stdout) == (bool(flags) and "avx512f" not in flags)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("=> graph mode:")]
    assert len(lines) == 1 and "compiled (inductor) in" in lines[0], lines  # once: the first epoch's first step
    # --fps-warmup-steps 0: the compiling step is still left out of the first epoch's FPS (2 of 3 steps timed)
    with open(os.path.join(str(compiled), "metrics.jsonl")) as f:
        epochs = [json.loads(line) for line in f]
    assert [e["fps_steps"] for e in epochs if "fps_steps" in e] == [2, 3]
    with open(os.path.join(str(eager), "metrics.jsonl")) as f:
        assert [e["fps_steps"] for e in map(json.loads, f) if "fps_steps" in e] == [3, 3]


def test_a_compiled_runs_checkpoint_loads_into_an_eager_model_and_exports_to_onnx(pair, tmp_path, capsys):
    from tools import export_onnx
    compiled, _ = pair["compiled"]
    model = models.get_model("tiny_cnn", num_classes=10)
    model.load_state_dict(weights(compiled))  # strict: every key, no prefix
    onnx_path = tmp_path / "tiny.onnx"
    rc, out, err = call(export_onnx.main, [compiled / "checkpoint.pth.tar", "--image-size", "32", "--output",
                                           onnx_path], capsys)
    assert rc == 0, (out, err)
    assert "exported tiny_cnn (10 classes" in out and onnx_path.exists()


def test_a_compiled_run_resumes_exactly(pair, shapes, tmp_path):
    folder = tmp_path / "resumed"
    ok(run_main([shapes, "--epochs", "1", "--max-steps-per-epoch", "3", "--output-dir", str(folder), "--compile"]
                + RUN))
    proc = ok(run_main([shapes, "--epochs", "2", "--max-steps-per-epoch", "3", "--output-dir", str(folder),
                        "--resume", "auto", "--compile"] + RUN))
    assert "=> graph mode: the training step compiled" in proc.stdout  # the resumed process compiles anew
    straight, resumed = weights(pair["compiled"][0]), weights(folder)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_model_that_fails_to_compile_trains_eagerly_with_one_note(pair, shapes, tmp_path):
    """A CPU without a working C++ compiler (inductor's CPU kernels need one): one note, then eager training
    from the same step, equal to the eager run."""
    env = {"CXX": os.path.join(str(tmp_path), "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    folder = tmp_path / "o"
    proc = ok(run_main([shapes, "--epochs", "2", "--max-steps-per-epoch", "3", "--output-dir", str(folder),
                        "--compile"] + RUN, env=env))
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: --compile")]
    assert len(notes) == 1 and "could not compile the model" in notes[0] and notes[0].endswith("training eagerly")
    assert "=> graph mode" not in proc.stdout
    s = read_summary(folder)
    assert s["status"] == "ok" and s["compile"]["status"] == "eager" and s["compile_seconds"] is None
    assert s["compile"]["note"] == notes[0][len("note: "):]
    eager = weights(pair["eager"][0])
    assert all(torch.equal(eager[k], v) for k, v in weights(folder).items())


@RANKS
def test_ddp_on_two_cpu_processes_trains_compiled_like_eager(shapes, tmp_path):
    dist = ["--multiprocessing-distributed", "--device-list", "0,1", "--port", "0", "-b", "16"]
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        folder = tmp_path / name
        ok(run_main([shapes, "--epochs", "1", "--max-steps-per-epoch", "3", "--output-dir", str(folder)] + RUN
                    + dist + extra))
        runs[name] = folder
    s = read_summary(runs["compiled"])
    assert s["status"] == "ok" and s["world_size"] == 2 and s["compile"]["status"] == "compiled"
    a, b = weights(runs["eager"]), weights(runs["compiled"])
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)


def test_bfloat16_autocast_compiles_with_the_cpu_warning_and_the_guard_stops_a_diverging_compiled_run(
        shapes, tmp_path):
    proc = ok(run_main([shapes, "--epochs", "1", "--max-steps-per-epoch", "2", "--no-validate", "--output-dir",
                        str(tmp_path / "bf16"), "--compile", "--amp", "--amp-dtype", "bfloat16"] + RUN))
    assert "warning: --compile with bfloat16 autocast on a CPU trained slower than eager" in proc.stdout
    s = read_summary(tmp_path / "bf16")
    assert s["amp"]["dtype"] == "bfloat16" and s["compile"]["status"] == "compiled"
    proc = run_main([shapes, "--epochs", "1", "--max-steps-per-epoch", "3", "--output-dir", str(tmp_path / "huge"),
                     "--compile"] + RUN + ["--lr", "1e12"])
    assert proc.returncode == 4, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: training diverged at epoch 0"), proc.stderr
    assert read_summary(tmp_path / "huge")["status"] == "diverged"


@ONCE
def test_a_step_that_fails_to_compile_runs_again_eagerly_drawing_what_an_eager_step_draws():
    """What the failed attempt drew (dropout, before its backend failed) is put back with the buffers: the eager
    step that follows draws what an eager run's first step draws (a resumed run, compiling, stays exact)."""
    eager = torch.nn.Dropout(0.5)

    def broken(x):
        torch.nn.functional.dropout(x, 0.5)
        raise RuntimeError("the backend failed")
    g = graph.Graph(eager, eager, compiled=broken, backend="inductor", requested=True)
    x = torch.ones(256)
    torch.manual_seed(0)
    out = g.first_step(lambda: g(x), CPU, lambda line: None)
    after = torch.get_rng_state()
    torch.manual_seed(0)
    assert g.status == "eager" and torch.equal(out, eager(x)) and torch.equal(after, torch.get_rng_state())


@needs_cpu_float16
def test_a_compiled_float16_step_skips_an_overflow_and_then_equals_eager():
    """The overflow-skip contract through a compiled forward and backward: a step whose gradients hold inf
    changes neither weights nor momentum; the next steps match an eager model's (same scaler)."""
    precision = ampmod.resolve(PrecisionConfig(amp=True, amp_impl="native", amp_dtype="float16"), CPU, 1)
    torch.manual_seed(0)
    models_ = [models.get_model("tiny_cnn", num_classes=4) for _ in range(2)]
    models_[1].load_state_dict(models_[0].state_dict())
    runs = []
    for compiled, model in zip((False, True), models_):
        choice = optim.build(OptimConfig(lr=0.1, momentum=0.9, weight_decay=1e-4), model, CPU, precision, fused=False)
        model, step = ampmod.wrap(choice, precision, CPU, model)
        g = graph.wrap(model, model, CPU, ModelConfig(compile=compiled), print).train()
        runs.append((g, model, step))
    poison = {"on": True}
    for _, model, _ in runs:
        next(model.parameters()).register_hook(lambda grad: grad.clone().fill_(float("inf")) if poison["on"] else grad)
    gen = torch.Generator().manual_seed(1)
    for i in range(3):
        x, y = torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 4, (4,), generator=gen)
        for g, model, step in runs:
            def one():
                with step.autocast():
                    loss = torch.nn.functional.cross_entropy(g(x), y)
                step.zero_grad()
                return None, loss, step(loss)
            before = [p.detach().clone() for p in model.parameters()]
            _, _, skipped = g.first_step(one, CPU, print) if g.pending else one()
            if i == 0:
                assert float(skipped) == 1.0 and all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
        poison["on"] = False
    assert runs[1][0].status == "compiled" and runs[1][2].overflow_steps() == runs[0][2].overflow_steps() == 1
    for a, b in zip(runs[0][1].parameters(), runs[1][1].parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-3, atol=1e-4)


@ONCE
def test_compile_mode_needs_compile():
    with pytest.raises(UsageError, match="--compile-mode max-autotune needs --compile"):
        parse_config(["--dummy", "--compile-mode", "max-autotune"], env={})
    assert parse_config(["--dummy", "--compile", "--compile-mode", "reduce-overhead"], env={}).cfg.model.compile_mode \
        == "reduce-overhead"
    parsed = parse_config(["--dummy", "--device", "cpu", "--compile", "--evaluate"], env={})
    assert "--compile applies to training: the evaluation runs eagerly" in plan(parsed.cfg).notes


def _npu_probe(mode, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8", **env)
    proc = subprocess.run([PY, os.path.join(ROOT, "tests", "npu_graph_probe.py"), mode], env=e, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_npu_compiles_forward_and_backward_through_torchair():
    obs = _npu_probe("reduce-overhead")
    assert obs["describe"] == {"enabled": True, "status": "compiled", "backend": "torchair",
                               "mode": "reduce-overhead", "note": obs["describe"]["note"]}
    assert "on NPU torchair compiles the training step with its graph engine" in obs["describe"]["note"]
    assert [c[:2] for c in obs["calls"]] == [["torchair.get_npu_backend", "CompilerConfig"],
                                             ["torchair.compile", "forward"], ["torchair.compile", "backward"]]
    assert obs["loss_equal"] and obs["grads_equal"] and obs["state_dict_keys_plain"]
    assert obs["seconds"] > 0 and obs["lines"][-1].startswith(
        "=> graph mode: the training step compiled (torchair, mode reduce-overhead) in")


def test_npu_without_torchair_trains_eagerly_with_a_note():
    obs = _npu_probe("default", FAKE_NPU_TORCHAIR="0")
    assert obs["describe"]["status"] == "eager" and obs["seconds"] is None and obs["calls"] == []
    assert obs["lines"] == ["note: --compile: this torch_npu has no torchair (its graph backend, in torch_npu >= 2.1): "
                            "training eagerly"]
    assert obs["loss_equal"] and obs["grads_equal"]


def test_check_device_reports_the_compiled_fps_row(tmp_path):
    from tools import check_device
    out = tmp_path / "results.json"
    rc = check_device.main(["--small", "--device", "cpu", "--only", "fps-compiled", "--json", str(out),
                            "--work-dir", str(tmp_path / "w")])
    res = json.loads(out.read_text())
    row = res["checks"][0]
    assert rc == 0 and row["name"] == "fps-compiled" and row["status"] == "PASS", row
    tiny = row["models"]["tiny_cnn"]
    assert tiny["compile"] == "compiled" and tiny["status"] == "ok" and tiny["compile_seconds"] > 0
    assert tiny["compiled_fps"] > 0 and tiny["eager_fps"] > 0 and "of eager" in row["detail"]
