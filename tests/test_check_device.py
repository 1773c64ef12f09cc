"""tools/check_device.py, the accelerator battery, run for real on the CPU with --small."""
import json
import multiprocessing
import threading

import pytest

from conftest import CPU_FLOAT16, ONCE, STACK, assert_one_line_error, run_tool
from tools import check_device

pytestmark = [STACK, pytest.mark.tools, pytest.mark.timeout(400)]  # make test-tools


def test_small_battery_passes_on_cpu_and_writes_json(tmp_path):
    out = tmp_path / "results.json"
    proc = run_tool("check_device.py", ["--small", "--device", "cpu", "--work-dir", str(tmp_path / "w"),
                                              "--only", "contract,train-amp,onnx,precision", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["passed"] is True and res["device"] == "cpu"
    assert [c["name"] for c in res["checks"]] == ["contract", "train-amp", "onnx", "precision"]
    assert all(c["status"] == "PASS" for c in res["checks"])
    train = res["checks"][1]
    assert train["losses"][-1] < 0.8 * train["losses"][0] and train["acc1"] > 20
    assert "4 of 4 checks passed" in proc.stdout


@ONCE
def test_a_failing_check_is_a_fail_row_and_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check_device, "overflow_contract", lambda device, prec, fused: ("momentum changed", "X"))
    out = tmp_path / "r.json"
    rc = check_device.main(["--small", "--device", "cpu", "--only", "contract", "--json", str(out),
                            "--work-dir", str(tmp_path / "w")])
    assert rc == 1
    row = json.loads(out.read_text())["checks"][0]
    assert row["status"] == "FAIL" and "momentum changed" in row["detail"]
    assert "FAIL" in capsys.readouterr().out


@ONCE
@pytest.mark.parametrize("args,fragment", [(["--only", "contract,bogus"], "unknown check 'bogus'"),
                                           (["--json", "/no/such/dir/x.json"], "does not exist")])
def test_bad_arguments(args, fragment):
    assert_one_line_error(run_tool("check_device.py", ["--small", "--device", "cpu"] + args), fragment)


def test_fps_check_feeds_from_jpegs_with_both_data_backends(tmp_path, monkeypatch):
    """fps-shufflenet --small: synthetic, bare loop, and the trainer fed from JPEGs by the default backend
    and by the other one (the device backend's logic runs on CPU tensors here), which decodes in a thread
    beside the step as on CUDA (--decode-ahead on) and once more on the training thread."""
    from trainer.data import device_backend as batch_decode
    monkeypatch.setattr(check_device, "SMALL_FPS_PASS", 0.0)  # timing is not asserted: the check's rows are
    threads = set()
    real = batch_decode.DeviceDecodeLoader._prepare
    monkeypatch.setattr(batch_decode.DeviceDecodeLoader, "_prepare",
                        lambda self, *args: threads.add(threading.current_thread().name[:12]) or real(self, *args))
    out = tmp_path / "results.json"
    before = set(multiprocessing.active_children())
    rc = check_device.main(["--small", "--device", "cpu", "--work-dir", str(tmp_path / "w"),
                            "--only", "fps-shufflenet", "--decode-ahead", "on", "--json", str(out)])
    # its three trainer runs' data-loader workers ended with each run (a later garbage collection would wait 5 s
    # for each before killing it)
    assert not set(multiprocessing.active_children()) - before, multiprocessing.active_children()
    row = json.loads(out.read_text())["checks"][0]
    assert rc == 0 and row["status"] == "PASS", row["detail"]
    assert row["data_backend"] == "cpu"
    assert set(row["jpeg_fps_by_backend"]) == {"cpu", "gpu"}
    assert all(v > 0 for v in row["jpeg_fps_by_backend"].values())
    assert row["jpeg_fps"] == row["jpeg_fps_by_backend"]["cpu"] and row["trainer_fps"] > 0
    assert row["jpeg_fps_decode_on_training_thread"] > 0
    assert "gpu backend" in row["detail"] and "on the training thread" in row["detail"]
    assert threads == {"decode-ahead", "MainThread"}  # the device backend's runs: one of each


def test_backends_check_trains_from_both_data_backends_with_batched_crops_on_cpu(tmp_path, monkeypatch):
    """backends --small: one run per data backend from the same seed; on a CPU the device backend runs the
    batched roi_align crops an accelerator runs (its CPU default crops image by image)."""
    from trainer.data import device_backend as batch_decode
    calls = []
    real = batch_decode.resized_crops
    monkeypatch.setattr(batch_decode, "resized_crops", lambda *a, **k: calls.append(len(a[0])) or real(*a, **k))
    monkeypatch.setattr(check_device, "BACKEND_ACC_GAP", 100.0)  # the tiny model's seeds alone spread ~17 points
    out = tmp_path / "r.json"
    rc = check_device.main(["--small", "--device", "cpu", "--only", "backends", "--json", str(out),
                            "--work-dir", str(tmp_path / "w")])
    row = json.loads(out.read_text())["checks"][0]
    assert rc == 0 and row["status"] == "PASS", row["detail"]
    assert set(row["runs"]) == {"cpu", "gpu"}
    for run in row["runs"].values():
        assert run["losses"][-1] < 0.8 * run["losses"][0] and run["acc1"] > 20
    # each model also validated through the other backend: the same images, so nearly the same score
    assert abs(row["runs"]["cpu"]["acc1_gpu"] - row["runs"]["cpu"]["acc1"]) <= 3
    assert abs(row["runs"]["gpu"]["acc1_cpu"] - row["runs"]["gpu"]["acc1"]) <= 3
    # every training batch of the gpu run through roi_align: --small trains 3 epochs of 1500 images in
    # batches of 16 (93 steps each); validation adds a few batches of other sizes
    assert calls.count(16) >= 3 * 93
    assert "Acc@1 gap" in row["detail"]


@ONCE
def test_backends_alike_needs_both_runs_trained_and_close():
    good = {"losses": [2.3, 1.2], "acc1": 60.0, "acc1_gpu": 59.0}
    other = {"losses": [2.3, 1.3], "acc1": 52.0, "acc1_cpu": 53.5}
    alike = check_device.backends_alike
    assert alike({"cpu": good, "gpu": other}, 10.0, 3.0)[0]
    ok, detail = alike({"cpu": good, "gpu": dict(other, acc1=45.0, acc1_cpu=45.0)}, 10.0, 3.0)
    assert not ok and "gap 15.0 points" in detail
    ok, detail = alike({"cpu": good, "gpu": dict(other, acc1_cpu=40.0)}, 10.0, 3.0)
    assert not ok and "other backend 12.0" in detail and "40.0 % through cpu" in detail
    assert not alike({"cpu": good, "gpu": dict(other, losses=[2.3, 2.2])}, 10.0, 3.0)[0]
    assert not alike({"cpu": good, "gpu": dict(other, acc1=15.0, acc1_cpu=15.0)}, 100.0, 3.0)[0]


@pytest.mark.skipif(CPU_FLOAT16 is None, reason="this torch trains float16 on the CPU: no SKIP row to see (the "
                    "float16 runs are tested in test_precision.py and test_observe.py)")
def test_train_fp16_is_a_skip_row_with_its_reason_where_the_torch_cannot_run_it(tmp_path):
    out = tmp_path / "r.json"
    proc = run_tool("check_device.py", ["--small", "--device", "cpu", "--work-dir", str(tmp_path / "w"),
                                        "--only", "train-fp16", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    row = res["checks"][0]
    assert res["passed"] is True
    assert row["status"] == "SKIP" and "needs torch >= 2.3" in row["detail"], row  # torch < 2.3: no CPU GradScaler
    assert "0 of 1 checks passed (1 skipped" in proc.stdout


@ONCE
def test_the_data_sections_device_backend_choices_reach_its_loader_spec(tmp_path):
    """check_device's --decode-ahead and its batched crops reach a main.py run in its process through the config's
    data section (DataConfig.decode_ahead / batched_crops -> LoaderSpec), with no device class or table changed."""
    from tools.make_dataset import generate
    from trainer import data
    from trainer.config import DataConfig
    from trainer.device import Device
    from trainer.device_names import DEVICE_DECODE
    root, cpu = generate(str(tmp_path / "d"), classes=2, train_per_class=2, val_per_class=1, size=32, seed=0), \
        Device.create("cpu")
    real, seen = data.BACKENDS[DEVICE_DECODE], []
    data.BACKENDS[DEVICE_DECODE] = lambda spec, device, train, val: seen.append(spec) or (None, None)
    try:
        data.build(DataConfig(root=root, data_backend="gpu", decode_ahead=False, batched_crops=True), cpu,
                   data.Sampling(2))
        data.build(DataConfig(root=root, data_backend="gpu"), cpu, data.Sampling(2))
    finally:
        data.BACKENDS[DEVICE_DECODE] = real
    assert (seen[0].decode_ahead, seen[0].batched_crops, seen[0].batch_per_rank) == (False, True, 2)
    assert (seen[1].decode_ahead, seen[1].batched_crops) == (None, None)
    assert Device.decode_ahead is False and Device.crops_per_image is False


def test_amp_dtype_check_gives_the_verdict_beside_bare_loops(tmp_path):
    """amp-dtype on this CPU: what --amp trains ResNet18 in (the probe's record where bfloat16 is native), beside
    bare loops of both dtypes; PASS exactly when the choice ran at least 0.9x the other (no timing asserted)."""
    from trainer.device import cpu_slow_bf16
    out = tmp_path / "r.json"
    rc = check_device.main(["--small", "--device", "cpu", "--only", "amp-dtype", "--json", str(out),
                            "--work-dir", str(tmp_path / "w")])
    row = json.loads(out.read_text())["checks"][0]
    assert row["name"] == "amp-dtype" and row["arch"] == "resnet18" and rc == (0 if row["status"] == "PASS" else 1)
    if cpu_slow_bf16():
        assert row["status"] == "PASS" and row["auto"]["choice"] == "float32" and "no native bfloat16" in row["detail"]
        return
    auto = row["auto"]
    assert set(row["bare_fps"]) == {"float32", "bfloat16"} and auto["choice"] in row["bare_fps"]
    assert auto["float32_img_s"] > 0 and auto["bfloat16_img_s"] > 0 and auto["seconds"] > 0 and not auto["cached"]
    assert "probe: float32" in row["detail"] and "bare loops float32" in row["detail"]
    assert (row["status"] == "PASS") == (row["ratio"] >= 0.9)
