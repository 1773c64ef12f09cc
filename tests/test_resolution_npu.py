"""The training resolution schedule, BlurPool and the flipped validation on the torch_npu double
(tests/fake_npu): main.py --device npu trains across a size change as the CPU does."""
import pytest

from conftest import DOUBLE, STACK, read_summary, run_main
from test_npu_double import double, fake_env  # noqa: F401 (double: the module's autouse fixture)

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(600)]

TRAIN = ["-a", "resnet18", "--seed", "1", "--epochs", "2", "--max-steps-per-epoch", "2", "-b", "8", "--lr", "0.02",
         "--wd", "0", "--no-channels-last", "-j", "0", "-p", "1", "--min-res", "32", "--max-res", "64",
         "--start-ramp", "0", "--end-ramp", "1", "--val-resize-size", "32", "--val-crop-size", "32", "--val-tta",
         "flip", "--blurpool"]


def test_a_size_change_blurpool_and_flips_on_the_double_as_on_the_cpu(shapes, tmp_path):
    out = {}
    for device in ("npu", "cpu"):
        proc = run_main([shapes, "--device", device, "--output-dir", str(tmp_path / device)] + TRAIN,
                        env=fake_env() if device == "npu" else None)
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
        assert "=> training resolution 32 from epoch 0" in proc.stdout
        assert "=> training resolution 64 from epoch 1" in proc.stdout
        out[device] = read_summary(tmp_path / device)
    npu, cpu = out["npu"], out["cpu"]
    assert npu["device"].startswith("npu") and npu["versions"]["torch_npu"].endswith("+fake")
    assert npu["train_resolutions"] == cpu["train_resolutions"] == [{"from_epoch": 0, "size": 32},
                                                                    {"from_epoch": 1, "size": 64}]
    assert npu["val_images"] == cpu["val_images"] == 100 and npu["final_acc1"] == cpu["final_acc1"]
    for key in ("final_loss", "val_loss", "train_acc1"):
        assert npu[key] == pytest.approx(cpu[key], rel=1e-4, abs=1e-4), key
