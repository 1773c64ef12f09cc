"""--recipe fast on the torch_npu double (tests/fake_npu): main.py --device npu takes the recipe's AMP (the NPU computes
in half precision) and keeps the NPU's memory format, and trains across the recipe's change of resolution."""
import pytest

from conftest import DOUBLE, ONCE, STACK, read_summary, run_main
from test_npu_double import double, fake_env, on_double  # noqa: F401 (double: the module's autouse fixture)

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(600)]


def test_fast_on_the_double_trains_with_amp_across_the_size_change(shapes, tmp_path):
    proc = run_main([shapes, "--device", "npu", "--output-dir", str(tmp_path), "--recipe", "fast", "-a", "resnet18",
                     "--seed", "1", "--epochs", "3", "--max-steps-per-epoch", "1", "-b", "8", "-j", "0", "-p", "1",
                     "--min-res", "32", "--max-res", "64", "--val-crop-size", "32", "--eval-freq", "3"],
                    env=fake_env())
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    line = [n for n in proc.stdout.splitlines() if n.startswith("note: recipe fast (from resnet18_ffcv_16) set: ")]
    assert len(line) == 1 and " --amp " in line[0] and "--channels-last" not in line[0]
    assert "=> training resolution 64 from epoch 2" in proc.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["device"].startswith("npu") and s["versions"]["torch_npu"].endswith("+fake")
    assert s["config"]["amp"] is True and s["channels_last"] is False
    assert s["train_resolutions"] == [{"from_epoch": 0, "size": 32}, {"from_epoch": 2, "size": 64}]
    assert (s["config"]["blurpool"], s["config"]["val_tta"], s["config"]["lr_schedule"]) == (True, "flip",
                                                                                              "triangular")


def test_the_recipes_switches_turn_off_on_the_double(shapes, tmp_path):
    # on an NPU the recipe turns --amp on: --no-amp trains in float32, --no-blurpool without the blur
    proc = run_main([shapes, "--device", "npu", "--output-dir", str(tmp_path), "--recipe", "fast", "-a", "resnet18",
                     "--seed", "1", "--epochs", "1", "--max-steps-per-epoch", "1", "-b", "8", "-j", "0", "-p", "1",
                     "--train-crop-size", "32", "--no-amp", "--no-blurpool"], env=fake_env())
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    line = [n for n in proc.stdout.splitlines() if n.startswith("note: recipe fast (from resnet18_ffcv_16) set: ")]
    assert len(line) == 1 and "--amp" not in line[0] and "--blurpool" not in line[0]
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["device"].startswith("npu")
    assert (s["config"]["amp"], s["config"]["blurpool"]) == (False, False)


@ONCE
def test_every_recipe_that_sets_amp_turns_it_on_and_no_amp_off_on_the_double():
    # the NPU keeps a recipe's --amp (a CPU run leaves it off: tests/test_recipes_fast.py covers the other booleans)
    out = on_double("""
from trainer import recipes
from trainer.config import parse_config
EIGHT = {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
seen = []
for name in recipes.names():
    for arch in (("resnet18", "resnet50") if recipes.get(name).get("base") else (None,)):
        if recipes.get(recipes.base_of(name, arch) if arch else name).get("amp") is not True:
            continue
        env = EIGHT if recipes.get(name).get("rank_size") == 8 else {}
        argv = ["--dummy", "--device", "npu", "--recipe", name] + (["-a", arch] if arch else [])
        on = parse_config(argv, env=env).cfg.as_dict()["amp"]
        off = parse_config(argv + ["--no-amp"], env=env).cfg.as_dict()["amp"]
        seen.append([name, arch, on, off])
print(json.dumps(seen))
""")
    assert ["fast", "resnet18", True, False] in out
    assert out and all((on, off) == (True, False) for _, _, on, off in out), out
