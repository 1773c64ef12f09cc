"""--recipe fast and the named recipes of FFCV's and MLPerf's schedules (trainer/recipes.py, trainer/recipes.json), and
tools/acceptance.py --baseline recipe: the flags a recipe decides, planned in this process through parse_config and
plan; real runs on generated data (CPU) that train to ok, one of two ranks, one resumed exactly across a change of
the training resolution; a run judged against a recipe's published result."""
import io
import json
import os
import subprocess

import pytest
import torch

from conftest import ONCE, PY, RANKS, ROOT, SMALL, STACK, assert_call_error, call, read_metrics, read_summary, run_main
from modelzoo import acceptance
from trainer import recipes
from trainer.config import parse_config
from trainer.data import resolution
from trainer.device import torch_load
from trainer.errors import UsageError
from trainer.plan import plan

pytestmark = [ONCE, pytest.mark.timeout(600)]

# FFCV's configurations (libffcv/ffcv-imagenet rn50_configs / rn18_configs, *_epochs.yaml): epochs -> (start_ramp,
# end_ramp), the same for both networks; and the README's top-1 (%) per network and epochs
FFCV_RAMPS = {16: (11, 13), 24: (17, 20), 32: (23, 27), 40: (29, 34), 56: (41, 48), 88: (65, 76)}
FFCV_TOP1 = {"resnet50": {16: 73.8, 24: 75.6, 32: 76.6, 40: 77.2, 56: 78.0, 88: 78.4},
             "resnet18": {16: 66.9, 24: 68.8, 32: 70.0, 40: 70.6, 56: 71.3, 88: 72.4}}
EIGHT = {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
RUN = ["--device", "cpu", "--seed", "3", "-a", "resnet18", "-b", "8", "-j", "0", "-p", "1"]


def planned(*argv, **kw):
    """The plan of ``main.py --dummy --device cpu ARGV`` (env: ``kw['env']``, one process by default)."""
    env = kw.get("env", {})
    parsed = parse_config(["--dummy", "--device", "cpu"] + list(argv), env=env)
    return plan(parsed.cfg, env=env, notes=parsed.notes)


def decided(p):
    """What the recipes decide, from a plan."""
    return {"batch": p.run.batch_size, "lr": p.optim.lr, "epochs": p.run.epochs, "schedule": p.optim.lr_schedule,
            "peak": p.optim.lr_peak_epoch, "smoothing": p.optim.label_smoothing, "wd": p.optim.weight_decay,
            "norm_wd": p.optim.norm_weight_decay, "res": (p.data.min_res, p.data.max_res),
            "ramp": (p.data.start_ramp, p.data.end_ramp), "val": (p.data.val_resize_size, p.data.val_crop_size),
            "tta": p.data.val_tta, "blurpool": p.model.blurpool, "amp": p.precision.amp,
            "optimizer": p.optim.optimizer, "warmup": p.optim.warmup_epochs}


# ---------------------------------------------------------------- the flags --recipe fast decides


@pytest.mark.parametrize("argv,env,want", [
    # FFCV's ResNet-50 configuration on its 8 devices: exactly its values
    (["-a", "resnet50", "--epochs", "16"], EIGHT,
     dict(batch=4096, lr=1.7, epochs=16, peak=2.0, wd=1e-4, ramp=(11, 13))),
    (["-a", "resnet50", "--epochs", "88", "-b", "1024"], {},
     dict(batch=1024, lr=0.425, epochs=88, peak=2.0, wd=1e-4, ramp=(65, 76))),
    (["-a", "resnet101", "--epochs", "40", "-b", "256"], {},
     dict(batch=256, lr=0.10625, epochs=40, wd=1e-4, ramp=(29, 34))),
    # ResNet-18 (and any network but the bottleneck ResNets): FFCV's one-device configuration
    (["-a", "resnet18", "--epochs", "24", "-b", "512"], {},
     dict(batch=512, lr=0.25, epochs=24, peak=2.0, wd=5e-5, ramp=(17, 20))),
    (["-a", "resnet18", "--epochs", "32"], {}, dict(batch=1024, lr=0.5, wd=5e-5, ramp=(23, 27))),
    (["-a", "resnet18"], {}, dict(epochs=16, ramp=(11, 13))),  # no --epochs: the recipe's 16
    (["-a", "resnet18", "--epochs", "100", "-b", "2048"], {}, dict(lr=1.0, peak=2.0, ramp=(74, 87))),
    (["-a", "resnet18", "--epochs", "3", "-b", "8"], {}, dict(lr=0.00390625, peak=0.375, ramp=(1, 2))),
    (["-a", "resnet18", "--epochs", "12", "-b", "8"], {}, dict(peak=1.5, ramp=(8, 10))),
])
def test_fast_decides_ffcvs_choices_as_a_function_of_epochs_network_and_batch(argv, env, want):
    got = decided(planned("--recipe", "fast", *argv, env=env))
    common = dict(schedule="triangular", smoothing=0.1, norm_wd=0.0, res=(160, 192), val=(293, 256), tta="flip",
                  blurpool=True, amp=False, optimizer="sgd", warmup=0.0)
    for key, value in dict(common, **want).items():
        assert got[key] == pytest.approx(value) if isinstance(value, float) else got[key] == value, (key, got)


def test_the_ramp_rule_reproduces_every_ffcv_configuration_and_the_named_recipes():
    for epochs, ramp in FFCV_RAMPS.items():
        assert recipes.ffcv_ramp(epochs) == ramp
        assert recipes.ffcv_peak(epochs) == 2.0
        for arch in ("resnet50", "resnet18"):
            r = recipes.get("{}_ffcv_{}".format(arch, epochs))
            assert (r["start_ramp"], r["end_ramp"], r["epochs"], r["lr_peak_epoch"]) == ramp + (epochs, 2)
    assert recipes.ffcv_ramp(1) is None and recipes.ffcv_ramp(2) == (0, 1)
    for epochs in range(2, 200):  # every run: a ramp ending before its last epoch, the peak below its end
        start, end = recipes.ffcv_ramp(epochs)
        assert 0 <= start < epochs - 1 and start <= end <= epochs - 1 and 0 < recipes.ffcv_peak(epochs) < epochs


@pytest.mark.parametrize("size", [None, "64", "192"])
def test_the_last_epoch_trains_at_the_final_size_for_every_epochs(size):
    """--recipe fast --epochs E (with --train-crop-size C or without), E from 1 to 100: the planned schedule's
    last epoch trains at the final size (C, or FFCV's 192), the first at the ramp's low size where there is a ramp,
    and one epoch trains at the final size throughout."""
    final = int(size) if size else 192
    low = 32 if size == "64" else 160
    crop = ["--train-crop-size", size] if size else []
    for epochs in range(1, 101):
        p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", str(epochs), *crop)
        sizes = [resolution.train_size(p.data, e) for e in range(epochs)]
        assert sizes[-1] == final, (epochs, sizes)
        assert sizes[0] == (final if epochs == 1 else low), (epochs, sizes)
        assert p.data.val_crop_size == (256 if final == 192 else final), epochs


def test_the_recipe_logs_one_line_naming_what_it_set_and_the_device_rule():
    p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "3", "-b", "8")
    line = [n for n in p.notes if n.startswith("recipe fast")]
    assert len(line) == 1
    assert line[0].startswith("recipe fast (from resnet18_ffcv_16) set: ")
    for flag in ("--blurpool", "--lr 0.00390625", "--lr-schedule triangular", "--lr-peak-epoch 0.375",
                 "--min-res 160", "--max-res 192", "--start-ramp 1", "--end-ramp 2", "--val-crop-size 256",
                 "--val-tta flip", "--norm-weight-decay 0", "--label-smoothing 0.1", "--weight-decay 5e-05"):
        assert flag in line[0], flag
    assert "--epochs" not in line[0] and "-b " not in line[0]  # given: not the recipe's
    # the CPU trains in float32 (--amp is the NPU's and CUDA's), in the CPU's own memory format
    assert any("the recipe's --amp is for NPU and CUDA devices" in n for n in p.notes)
    assert p.precision.amp is False and p.model.channels_last is True
    # on CUDA and NPU the recipe turns on AMP; channels-last on CUDA only
    values = {"amp": True, "channels_last": True, "lr": 1.0}
    assert recipes.device_rule(values, "cuda")[0] == values
    assert recipes.device_rule(values, "npu") == ({"amp": True, "lr": 1.0}, [])
    assert recipes.device_rule(values, "cpu", {"amp": True})[1] == []  # --amp given: no note


def test_outside_ffcvs_published_batches_a_note_names_the_lr_rule():
    """FFCV published batches 1024 (ResNet-18, one GPU) and 4096 (ResNet-50, 8 x 512): between them the LR is linear
    in the batch with the usual note; below and above them the note names the rule and what stands behind it."""
    assert recipes.published_batches("resnet18_ffcv_16") == recipes.published_batches("fast") == (1024, 4096)
    assert recipes.published_batches("resnet50_8p") is None  # ModelZoo's: linear between its own 1p and 8p

    def lr_notes(*argv, **kw):
        p = planned("--recipe", "fast", *argv, **kw)
        return p.run.batch_size, p.optim.lr, [n for n in p.notes if n.startswith("lr ")]

    batch, lr, notes = lr_notes("-a", "resnet18", "-b", "32")
    assert (batch, lr) == (32, pytest.approx(recipes.scaled_lr("resnet18_ffcv_16", 32)[0]))
    assert len(notes) == 1 and "below the batches FFCV published, 1024 to 4096" in notes[0]
    assert recipes.BELOW_MEASURED in notes[0] and "docs/BENCHMARKS.md" in notes[0]
    batch, lr, notes = lr_notes("-a", "resnet18", env=EIGHT)  # 8 ranks of FFCV's one-GPU recipe: batch 8192
    assert (batch, lr) == (8192, 4.0)
    assert len(notes) == 1 and "above the batches FFCV published, 1024 to 4096: not measured here" in notes[0]
    assert "--optimizer lars" in notes[0]
    batch, lr, notes = lr_notes("-a", "resnet18", "-b", "2048")  # inside: linear, the usual note alone
    assert (batch, lr) == (2048, 1.0) and notes == ["lr 1: recipe resnet18_ffcv_16 has 0.5 for batch 1024, scaled "
                                                    "linearly to batch 2048"]
    assert lr_notes("-a", "resnet18", "-b", "1024")[2] == [] and lr_notes("-a", "resnet18", "-b", "32",
                                                                          "--lr", "0.1")[2] == []


def test_the_readme_claim_states_what_its_figures_exclude():
    """README's digits claim carries BENCHMARKS.md's caveats: the target's swing, validation left out of the times
    (and the flips' cost there), and the LR rule outside FFCV's batches."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(root, "docs", "BENCHMARKS.md")) as f:
        bench = f.read()
    claim = readme[readme.index("On real scans at a small scale"):readme.index("Against the 90-epoch recipes")]
    claim = " ".join(claim.split())
    for fact in ("examples' last epoch", "up to 25 points", "validation excluded", "1.89×", "linear in the batch"):
        assert fact in claim, fact
    for fact in ("swings by up to 25 points", "1.885", "### The LR at batches FFCV did not publish"):
        assert fact in bench, fact


def test_flags_given_win_over_the_recipe():
    p = planned("--recipe", "fast", "-a", "resnet50", "--epochs", "16", "-b", "64", "--lr", "0.3",
                "--label-smoothing", "0", "--val-tta", "none", "--lr-schedule", "cosine", "--wd", "3e-5",
                "--min-res", "128", "--start-ramp", "4", "--val-crop-size", "224", "--amp", "--no-channels-last")
    got = decided(p)
    assert (got["batch"], got["lr"], got["smoothing"], got["tta"], got["schedule"], got["wd"]) == \
        (64, 0.3, 0.0, "none", "cosine", 3e-5)
    assert got["res"] == (128, 192) and got["ramp"] == (4, 13) and got["val"] == (256, 224)
    assert got["amp"] is True and p.model.channels_last is False
    line = [n for n in p.notes if n.startswith("recipe fast")][0]
    for given in ("--lr ", "--label-smoothing", "--val-tta", "--lr-schedule", "--weight-decay", "--min-res",
                  "--start-ramp", "--val-crop-size", "-b "):
        assert given not in line, given
    assert "--max-res 192" in line and "--end-ramp 13" in line


def test_a_train_crop_size_given_ends_the_ramp_and_scales_the_test_size():
    # the ramp rises to the size given from the multiple of 32 at or below FFCV's 160/192 of it
    p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "16", "--train-crop-size", "160")
    assert (p.data.min_res, p.data.max_res, p.data.start_ramp, p.data.end_ramp) == (128, 160, 11, 13)
    assert not any("is not used" in n for n in p.notes)  # the schedule is kept, not dropped with a note
    assert (p.data.val_crop_size, p.data.val_resize_size) == (213, 243)  # round(160 x 256/192), then / (224/256)
    p = planned("--recipe", "fast", "-a", "resnet50", "--epochs", "24", "--train-crop-size", "192")
    assert (p.data.min_res, p.data.max_res, p.data.start_ramp, p.data.end_ramp) == (160, 192, 17, 20)  # FFCV's own
    assert (p.data.val_crop_size, p.data.val_resize_size) == (256, 293)  # FFCV's own: 256 after 192
    p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "8", "--train-crop-size", "64")
    assert (p.data.min_res, p.data.max_res, p.data.start_ramp, p.data.end_ramp) == (32, 64, 5, 6)
    assert (p.data.val_crop_size, p.data.val_resize_size) == (64, 73)  # under 128 px: the last training size
    assert recipes.MULTIPLE == resolution.MULTIPLE  # the recipe's ramp is one the schedule can train
    # no multiple of 32 at or below 160/192 of 32 (or a size not a multiple of 32): that size throughout
    for size in ("32", "40"):
        p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "8", "--train-crop-size", size)
        assert p.data.min_res is None and p.data.train_crop_size == int(size)
    p = planned("--recipe", "fast", "-a", "resnet18", "--train-crop-size", "128")
    assert (p.data.val_crop_size, p.data.val_resize_size) == (171, 195)
    # below 128 px the test size is the training size (the resize at the crop ratio as ever)
    p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "16", "--train-crop-size", "32")
    assert (p.data.val_crop_size, p.data.val_resize_size) == (32, 37)
    p = planned("--recipe", "fast", "-a", "resnet18", "--train-crop-size", "112")
    assert (p.data.val_crop_size, p.data.val_resize_size) == (112, 128)
    p = planned("--recipe", "fast", "-a", "mobilenet_v2", "--epochs", "16")
    assert p.model.blurpool is False and any("--blurpool is for ResNets" in n for n in p.notes)


def test_the_test_size_is_ffcvs_one_rule():
    """FFCV validates at 256 after training ends at 192: every FFCV recipe's pair is that one ratio, and --recipe
    fast validates a --train-crop-size C at round(C x 256/192): 192 (FFCV's own size) at FFCV's own 256."""
    ffcv = [n for n in recipes.names() if recipes.get(n).get("rule") == "ffcv" and not recipes.get(n).get("base")]
    assert len(ffcv) == 12
    for name in ffcv:
        r = recipes.get(name)
        assert r["val_crop_size"] / float(r["max_res"]) == recipes.FFCV_TEST_RATIO == 256 / 192.0, name
    mine = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "16", "--train-crop-size", "192").data
    theirs = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "16").data
    assert (mine.val_crop_size, mine.val_resize_size) == (theirs.val_crop_size, theirs.val_resize_size) == (256, 293)
    for crop, test in ((224, 299), (160, 213), (128, 171), (96, 96)):
        p = planned("--recipe", "fast", "-a", "resnet18", "--epochs", "16", "--train-crop-size", str(crop))
        assert p.data.val_crop_size == test, crop
    # ImageNet's resize-then-crop of a run without a recipe is unchanged: 256 for 224
    assert planned().data.val_resize_size == 256 and planned().data.val_crop_size == 224


def switches():
    """[(recipe, -a, dest)] of every boolean a recipe sets (``fast``: those of the recipe it takes for -a)."""
    out = []
    for name in recipes.names():
        for arch in (("resnet18", "resnet50") if recipes.get(name).get("base") else (None,)):
            values = recipes.get(recipes.base_of(name, arch) if arch else name)
            out.extend((name, arch, k) for k, v in sorted(values.items()) if v is True and k not in recipes.META)
    return out


def test_every_boolean_a_recipe_sets_has_its_off_switch():
    """For every recipe and every boolean it sets: --no-X turns it off in the planned config (on a CPU), and where
    the CPU keeps the recipe's value, the recipe turns it on without the switch (--amp, which a CPU run leaves off:
    tests/test_recipes_fast_npu.py, on the double)."""
    found = switches()
    assert {k for _, _, k in found} == {"amp", "blurpool", "channels_last"} and ("fast", "resnet18", "amp") in found

    def argv(name, arch, *more):
        return ["--recipe", name] + (["-a", arch] if arch else []) + list(more)

    for name, arch, key in found:
        env = EIGHT if recipes.get(name).get("rank_size") == 8 else {}
        off = "--no-" + key.replace("_", "-")
        p = planned(*argv(name, arch, off), env=env)
        assert p.as_dict()[key] is False, (name, arch, off)
        assert not any("--{} ".format(key.replace("_", "-")) in n for n in p.notes if n.startswith("recipe "))
    kept = [(name, arch, key) for name, arch, key in found if key != "amp"]
    assert {k for _, _, k in kept} == {"blurpool", "channels_last"}
    for name, arch, key in kept:
        env = EIGHT if recipes.get(name).get("rank_size") == 8 else {}
        on = planned(*argv(name, arch), env=env).as_dict()
        off = planned(*argv(name, arch, "--no-" + key.replace("_", "-")), env=env).as_dict()
        assert (on[key], off[key]) == (True, False), (name, arch, key)


def test_a_value_given_to_a_switch_is_one_error_naming_its_pair(shapes, tmp_path, capsys):
    import main as entry
    out = str(tmp_path / "out")
    for flag, value, pair in (("--blurpool", "false", "--no-blurpool"), ("--amp", "0", "--no-amp")):
        assert_call_error(entry.main, [shapes, "--recipe", "fast", "--output-dir", out, "{}={}".format(flag, value)],
                          capsys, "{} is a switch and takes no value (got '{}')".format(flag, value),
                          "or {} for the opposite".format(pair))
    assert not os.path.exists(out)


# ---------------------------------------------------------------- the named recipes


def named():
    return [n for n in recipes.names() if recipes.get(n).get("expect")]


def test_every_recipe_key_is_a_flag_and_every_named_recipe_has_a_sourced_result():
    from trainer.flags import build_parser
    dests = {a.dest for a in build_parser()._actions}
    for name in recipes.names():
        r = recipes.get(name)
        assert set(r) - set(recipes.META) <= dests, (name, set(r) - set(recipes.META) - dests)
        assert r["source"].strip()
    assert set(named()) == {"{}_ffcv_{}".format(a, e) for a in ("resnet50", "resnet18") for e in FFCV_RAMPS} | {
        "resnet50_mlperf_lars"}
    for arch, table in FFCV_TOP1.items():
        for epochs, top1 in table.items():
            expect = recipes.get("{}_ffcv_{}".format(arch, epochs))["expect"]
            assert expect["acc1"] == top1 and expect["source"].startswith("https://github.com/libffcv/ffcv-imagenet")
            assert expect["hardware"] == ("8 x A100" if arch == "resnet50" else "1 x A100")


@pytest.mark.parametrize("name", sorted(named()))
def test_each_named_recipe_plans_its_values_at_its_device_count(name):
    r = recipes.get(name)
    env = EIGHT if r["rank_size"] == 8 else {}
    got = decided(planned("--recipe", name, env=env))
    assert (got["batch"], got["lr"], got["epochs"], got["schedule"], got["wd"], got["smoothing"], got["norm_wd"]) == \
        (r["batch_size"], r["lr"], r["epochs"], r["lr_schedule"], r["weight_decay"], 0.1, 0.0)
    if r.get("rule") == "ffcv":
        assert got["ramp"] == FFCV_RAMPS[r["epochs"]] and got["res"] == (160, 192) and got["peak"] == 2.0
        assert (got["val"], got["tta"], got["blurpool"], got["optimizer"]) == ((293, 256), "flip", True, "sgd")
    else:  # MLPerf's: LARS, 2 warm-up epochs, polynomial decay
        assert (got["optimizer"], got["warmup"], got["res"]) == ("lars", 2.0, (None, None))
    one = decided(planned("--recipe", name))  # one device: the per-device batch kept, the LR linear in the batch
    assert one["batch"] == r["batch_size"] // r["rank_size"]
    assert one["lr"] == pytest.approx(r["lr"] / r["rank_size"])


def test_a_named_recipe_run_shorter_is_placed_for_its_epochs():
    got = decided(planned("--recipe", "resnet50_ffcv_88", "--epochs", "24", "-b", "256"))
    assert (got["ramp"], got["peak"], got["lr"]) == (FFCV_RAMPS[24], 2.0, pytest.approx(1.7 * 256 / 4096))


def test_an_unknown_recipe_is_one_line():
    with pytest.raises(UsageError, match="unknown recipe 'fastest'"):
        planned("--recipe", "fastest")


# ---------------------------------------------------------------- real runs


def _run(data, out, args):
    proc = run_main([data, "--output-dir", str(out)] + args)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def test_fast_trains_to_ok_at_32_px(shapes, tmp_path):
    proc = _run(shapes, tmp_path, RUN + ["--recipe", "fast", "--epochs", "3", "--max-steps-per-epoch", "1",
                                         "--eval-freq", "3", "--train-crop-size", "32"])
    assert "note: recipe fast (from resnet18_ffcv_16) set: " in proc.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["recipe"] == "fast" and s["epochs_completed"] == 3
    c = s["config"]
    assert (c["lr_schedule"], c["lr_peak_epoch"], c["blurpool"], c["val_tta"], c["val_crop_size"],
            c["label_smoothing"], c["norm_weight_decay"]) == ("triangular", 0.375, True, "flip", 32, 0.1, 0.0)


def test_fast_at_a_size_given_trains_its_ramp_up_to_that_size(shapes, tmp_path):
    # --train-crop-size 64 for 3 epochs: the ramp from 32 px (epochs 0 and 1) to 64 px (epoch 2), validated at 64
    proc = _run(shapes, tmp_path, RUN + ["--recipe", "fast", "--epochs", "3", "--max-steps-per-epoch", "1",
                                         "--eval-freq", "3", "--train-crop-size", "64"])
    assert "=> training resolution 32 from epoch 0" in proc.stdout
    assert "=> training resolution 64 from epoch 2" in proc.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok"
    assert s["train_resolutions"] == [{"from_epoch": 0, "size": 32}, {"from_epoch": 2, "size": 64}]
    assert (s["config"]["min_res"], s["config"]["max_res"], s["config"]["val_crop_size"]) == (32, 64, 64)


@pytest.mark.parametrize("epochs,want", [("1", None),  # no schedule: --train-crop-size throughout
                                         ("2", [{"from_epoch": 0, "size": 32}, {"from_epoch": 1, "size": 64}])])
def test_a_short_fast_run_trains_its_last_epoch_at_the_size_given(shapes, tmp_path, epochs, want):
    # --epochs 2 --train-crop-size 64: 32 px, then 64 px in the last epoch, validated at 64; --epochs 1: 64 px only
    proc = _run(shapes, tmp_path, RUN + ["--recipe", "fast", "--epochs", epochs, "--max-steps-per-epoch", "1",
                                         "--eval-freq", epochs, "--train-crop-size", "64"])
    assert ("=> training resolution 64 from epoch 1" in proc.stdout) == (epochs == "2")
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["epochs_completed"] == int(epochs)
    assert s.get("train_resolutions") == want
    assert (s["config"]["train_crop_size"], s["config"]["val_crop_size"]) == (64, 64)


@STACK
def test_a_run_resumed_across_the_resolution_change_equals_the_uninterrupted_run(shapes, tmp_path):
    # epochs 0 and 1 at 32 px, epoch 2 at 64 (the recipe's ramp for 3 epochs: 1, 2); resumed after epoch 1
    args = RUN + ["--recipe", "fast", "--epochs", "3", "--max-steps-per-epoch", "2", "--min-res", "32",
                  "--max-res", "64", "--val-crop-size", "32", "--eval-freq", "3"]
    full = _run(shapes, tmp_path / "full", args + ["--checkpoint-freq", "1"])
    assert "=> training resolution 32 from epoch 0" in full.stdout
    assert "=> training resolution 64 from epoch 2" in full.stdout
    kept = os.path.join(str(tmp_path / "full"), "checkpoint_epoch2.pth.tar")
    part = _run(shapes, tmp_path / "part", args + ["--resume", kept])
    assert "=> resumed" in part.stdout and "=> training resolution 64 from epoch 2" in part.stdout
    a, b = torch_load(os.path.join(str(tmp_path / "full"), "checkpoint.pth.tar")), \
        torch_load(os.path.join(str(tmp_path / "part"), "checkpoint.pth.tar"))
    assert a["epoch"] == b["epoch"] == 3
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    ra, rb = read_metrics(tmp_path / "full")[-1], read_metrics(tmp_path / "part")[-1]
    for key in ("step_lrs", "step_losses", "train_loss", "val_acc1"):
        assert ra[key] == rb[key], key


@STACK
@RANKS
def test_fast_on_two_ranks(shapes, tmp_path):
    proc = _run(shapes, tmp_path, RUN + ["-b", "16", "--recipe", "fast", "--epochs", "3", "--max-steps-per-epoch", "1",
                                         "--min-res", "32", "--max-res", "64", "--val-crop-size", "32",
                                         "--eval-freq", "3", "--multiprocessing-distributed", "--device-list", "0,1",
                                         "--port", "0", "--dist-timeout", "120"])
    assert "=> training resolution 64 from epoch 2" in proc.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["world_size"] == 2 and s["config"]["blurpool"] is True
    assert s["lr"] == pytest.approx(0.5 * 16 / 1024)


# ---------------------------------------------------------------- acceptance against a recipe's result


def _acceptance(argv):
    """tools/acceptance.py's main in this process: (exit code, output, the error line)."""
    out = io.StringIO()
    try:
        return acceptance.main(argv, out=out), out.getvalue(), ""
    except acceptance.AcceptanceError as exc:
        return exc.exit_code, out.getvalue(), str(exc)


def _check(summary, *more):
    return _acceptance(["check", "--summary", summary, "--rank-size", "1", "--mode", "acc", "--arch", "resnet18"]
                       + list(more))


def test_a_run_is_judged_against_its_recipes_published_result(shapes, tmp_path):
    # a run of FFCV's 16-epoch ResNet-18 schedule (fast at 16 epochs): judged against 66.9 % with 1 point
    _run(shapes, tmp_path, RUN + ["--recipe", "fast", "--epochs", "16", "--max-steps-per-epoch", "1",
                                  "--eval-freq", "16"] + SMALL)
    summary = os.path.join(str(tmp_path), "summary.json")
    rc, out, err = _check(summary, "--baseline", "recipe")
    assert rc == acceptance.EXIT_FAIL, (out, err)
    assert "FAIL Acc@1" in out and "vs baseline 66.900: needs >= 65.900 (tolerance 1 point(s) below)" in out
    assert "recipe resnet18_ffcv_16: https://github.com/libffcv/ffcv-imagenet" in out and "1 x A100" in out
    assert "SKIP FPS" in out
    # typed as a user would: the summary says the arch, the rank size and the mode
    typed = subprocess.run([PY, "-m", "tools.acceptance", "check", "--summary", summary, "--baseline", "recipe"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert typed.returncode == acceptance.EXIT_FAIL and typed.stderr == "", typed.stderr
    assert typed.stdout == out and "(resnet18 1p, accuracy run" in out

    # the same run at the result (within the tolerance) passes; below it fails
    s = read_summary(tmp_path)
    for acc1, want in ((66.0, acceptance.EXIT_OK), (65.9, acceptance.EXIT_OK), (65.8, acceptance.EXIT_FAIL)):
        path = str(tmp_path / "s{}.json".format(acc1))
        with open(path, "w") as f:
            json.dump(dict(s, final_acc1=acc1), f)
        rc, out, _ = _check(path, "--baseline", "recipe")
        assert rc == want, (acc1, out)
        assert ("acceptance: PASS" if want == acceptance.EXIT_OK else "acceptance: FAIL: acc1") in out
    # recipe:NAME names the recipe; the published figure applies only to its network and epochs
    rc, out, _ = _check(str(tmp_path / "s66.0.json"), "--baseline", "recipe:resnet18_ffcv_16")
    assert rc == acceptance.EXIT_OK
    rc, out, err = _check(str(tmp_path / "s66.0.json"), "--baseline", "recipe:resnet18_ffcv_24")
    assert rc == 2 and "recipe resnet18_ffcv_24's published result is for -a resnet18 and 24 epochs" in err
    path = str(tmp_path / "short.json")
    with open(path, "w") as f:
        json.dump(dict(s, epochs=3), f)
    rc, out, err = _check(path, "--baseline", "recipe")
    assert rc == 2 and "recipe fast has no published result for -a resnet18 at 3 epochs" in err
    with open(path, "w") as f:
        json.dump(dict(s, recipe=None), f)
    rc, out, err = _check(path, "--baseline", "recipe")
    assert rc == 2 and "the run was not trained with --recipe" in err


def test_before_a_run_the_recipes_result_is_checked(capsys):
    def baseline(name, mode):
        return ["baseline", "--baseline", "recipe:" + name, "--arch", "resnet50", "--rank-size", "8", "--mode", mode]
    assert _acceptance(baseline("resnet50_mlperf_lars", "acc"))[0] == 0
    rc, _, err = _acceptance(baseline("resnet50_ffcv_16", "perf"))
    assert rc == 2 and "no fps figure" in err
    rc, _, err = _acceptance(baseline("resnet50_8p", "acc"))
    assert rc == 2 and "records no published result" in err
    # the command line: one error line, exit 2
    rc, out, err = call(acceptance.cli, baseline("resnet50_8p", "acc"), capsys)
    assert rc == 2 and err.startswith("error: recipe resnet50_8p records no published result")
