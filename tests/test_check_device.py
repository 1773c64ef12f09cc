"""tools/check_device.py, the accelerator battery, run for real on the CPU with --small."""
import json

import pytest

from conftest import assert_one_line_error, run_tool
from tools import check_device

pytestmark = pytest.mark.timeout(400)


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


def test_a_failing_check_is_a_fail_row_and_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check_device, "overflow_contract", lambda device, prec, fused: ("momentum changed", "X"))
    out = tmp_path / "r.json"
    rc = check_device.main(["--small", "--device", "cpu", "--only", "contract", "--json", str(out),
                            "--work-dir", str(tmp_path / "w")])
    assert rc == 1
    row = json.loads(out.read_text())["checks"][0]
    assert row["status"] == "FAIL" and "momentum changed" in row["detail"]
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("args,fragment", [(["--only", "contract,bogus"], "unknown check 'bogus'"),
                                           (["--json", "/no/such/dir/x.json"], "does not exist")])
def test_bad_arguments(args, fragment):
    assert_one_line_error(run_tool("check_device.py", ["--small", "--device", "cpu"] + args), fragment)


def test_fps_check_feeds_from_jpegs_with_both_data_backends(tmp_path):
    """fps-shufflenet --small: synthetic, bare loop, and the trainer fed from JPEGs by the default backend
    and by the other one (the device backend's logic runs on CPU tensors here)."""
    out = tmp_path / "results.json"
    proc = run_tool("check_device.py", ["--small", "--device", "cpu", "--work-dir", str(tmp_path / "w"),
                                        "--only", "fps-shufflenet", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = json.loads(out.read_text())["checks"][0]
    assert row["status"] == "PASS" and row["data_backend"] == "cpu"
    assert set(row["jpeg_fps_by_backend"]) == {"cpu", "gpu"}
    assert all(v > 0 for v in row["jpeg_fps_by_backend"].values())
    assert row["jpeg_fps"] == row["jpeg_fps_by_backend"]["cpu"] and row["trainer_fps"] > 0
    assert "gpu backend" in row["detail"]
