"""FFCV's ResNet techniques beside the short schedules: the training resolution schedule (--min-res, --max-res,
--start-ramp, --end-ramp), validation above the training size (--val-crop-size alone takes FFCV's crop ratio),
--val-tta flip and --blurpool. Real runs on generated data (CPU): the sizes the loaders of both backends make
epoch by epoch, persistent workers included; a run resumed across a size change equals the uninterrupted one
bit for bit (one process and two); the flipped validation against a hand computation; BlurPool's layers, weights
and checkpoints; bad values one line."""
import os

import pytest
import torch
import torch.nn.functional as F

import main as entry
from conftest import ONCE, RANKS, STACK, assert_call_error, read_summary, run_main, trained
from conftest import read_checkpoint as ckpt, read_metrics as records
from trainer import data
from trainer.config import DataConfig, parse_config
from trainer.device import Device

pytestmark = [ONCE, pytest.mark.timeout(600)]

CPU_DEVICE = Device.create("cpu")
BASE = ["--device", "cpu", "--seed", "3", "-j", "0", "-p", "1"]
VAL32 = ["--val-resize-size", "32", "--val-crop-size", "32"]
RESNET = ["-a", "resnet18", "-b", "8", "--lr", "0.1"] + BASE
RAMP = ["--min-res", "32", "--max-res", "96", "--start-ramp", "0", "--end-ramp", "2"]  # epochs 0, 1, 2: 32, 64, 96
SHORT_RAMP = ["--min-res", "32", "--max-res", "64", "--start-ramp", "0", "--end-ramp", "2"]  # 32, 64 (48: 1.5 x 32), 64


# ---------------------------------------------------------------- the schedule


def ffcv_sizes(min_res, max_res, start, end, epochs):
    return [data.ResolutionSchedule(min_res, max_res, start, end)(e) for e in range(epochs)]


def test_the_schedule_is_ffcvs_get_resolution_with_numpys_rounding():
    # ffcv-imagenet's rn18_16_epochs.yaml: 160 to 192 between epochs 11 and 13; epoch 12 is 176, 5.5 x 32: even 6
    assert ffcv_sizes(160, 192, 11, 13, 16) == [160] * 12 + [192] * 4
    # rounded to the nearest multiple of 32 (not down): 169.6 -> 160, 179.2 -> 192, 198.4 -> 192, 208 (6.5 x 32) -> 192,
    # 217.6 -> 224
    assert ffcv_sizes(160, 256, 0, 10, 7) == [160, 160, 192, 192, 192, 192, 224]
    # halves go to the even multiple, as numpy's round does: 80 = 2.5 x 32 -> 64; 112 = 3.5 x 32 -> 128
    assert ffcv_sizes(64, 96, 0, 2, 3) == [64, 64, 96]
    assert ffcv_sizes(96, 128, 0, 2, 3) == [96, 128, 128]
    assert ffcv_sizes(32, 96, 0, 2, 4) == [32, 64, 96, 96]
    assert ffcv_sizes(128, 128, 0, 0, 3) == [128] * 3
    assert data.ResolutionSchedule(32, 96, 0, 2).changes(1, 4) == [(1, 64), (2, 96)]


def cfg_of(argv):
    return parse_config(["--dummy"] + argv, env={}).cfg


def test_the_flags_make_the_config_and_val_crop_alone_takes_ffcvs_ratio():
    d = cfg_of(RAMP + ["--epochs", "3"]).data
    assert (d.min_res, d.max_res, d.start_ramp, d.end_ramp, d.train_crop_size) == (32, 96, 0, 2, 96)
    assert [data.train_size(d, e) for e in range(3)] == [32, 64, 96]
    assert data.train_size(cfg_of([]).data, 5) == 224 and cfg_of([]).data.min_res is None
    assert cfg_of(["--min-res", "64", "--max-res", "64"]).data.start_ramp == 0  # one size: no ramp needed
    # validation: resize = crop x 256 / 224, rounded, where --val-resize-size is not given
    assert [(c.val_resize_size, c.val_crop_size) for c in (cfg_of([]).data, cfg_of(["--val-crop-size", "256"]).data,
                                                           cfg_of(["--val-crop-size", "64"]).data)] == \
        [(256, 224), (293, 256), (73, 64)]
    assert cfg_of(["--val-crop-size", "256", "--val-resize-size", "256"]).data.val_resize_size == 256
    c = cfg_of(["--val-tta", "flip", "--blurpool", "-a", "resnet50"])
    assert (c.data.val_tta, c.model.blurpool) == ("flip", True)
    assert c.as_dict()["val_tta"] == "flip" and c.as_dict()["blurpool"] is True


def test_a_recipes_schedule_yields_to_a_train_crop_size_given(monkeypatch):
    """Recipes set these flags by name (their argparse dests); a --train-crop-size on the command line then wins,
    with a note; beside the schedule's own flags on the command line it is an error (below)."""
    from trainer import recipes
    table = dict(recipes._table(), ramp={"arch": "resnet18", "batch_size": 8, "lr": 0.1, "epochs": 4,
                                         "min_res": 32, "max_res": 64, "start_ramp": 1, "end_ramp": 3,
                                         "val_crop_size": 64, "val_tta": "flip", "blurpool": True})
    monkeypatch.setattr(recipes, "_table", lambda: table)
    parsed = parse_config(["--dummy", "--recipe", "ramp"], env={})
    d = parsed.cfg.data
    assert (d.min_res, d.max_res, d.start_ramp, d.end_ramp, d.val_crop_size, d.val_resize_size, d.val_tta) == \
        (32, 64, 1, 3, 64, 73, "flip") and parsed.cfg.model.blurpool
    parsed = parse_config(["--dummy", "--recipe", "ramp", "--train-crop-size", "48"], env={})
    assert parsed.cfg.data.min_res is None and parsed.cfg.data.train_crop_size == 48
    assert any("--train-crop-size 48 given" in n and "--min-res" in n for n in parsed.notes)


def test_graph_mode_is_told_that_each_size_compiles(tmp_path):
    from trainer.device import Device as D
    if D.of("cpu").compile_missing():
        pytest.skip(D.of("cpu").compile_missing())
    from trainer.plan import plan
    parsed = parse_config(["--dummy", "--device", "cpu", "--compile", "-a", "resnet18", "--epochs", "3",
                           "--output-dir", str(tmp_path)] + RAMP, env={})
    notes = plan(parsed.cfg, env={}, notes=parsed.notes).notes
    assert [n for n in notes if n.startswith("--compile with a resolution schedule: each training size (32, 64, 96 "
                                             "px) compiles")]


# ---------------------------------------------------------------- the loaders follow it


def first_batches(root, backend, workers, epochs, **sizes):
    section = DataConfig(root=root, data_backend=backend, crop_scale_min=0.25, val_resize_size=36, val_crop_size=32,
                         **sizes)
    train, _, _ = data.build(section, CPU_DEVICE, data.Sampling(8, workers=workers, seed=7))
    out = []
    for epoch in epochs:
        train.sampler.set_epoch(epoch)
        images = next(iter(train))[0]
        out.append(images.clone())
    return out


@STACK
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_persistent_workers_crop_at_each_epochs_size(shapes, backend):
    """-j 2 (persistent workers, started once): each epoch's batches come at the schedule's size, the crops the
    same as a fixed-size loader's at that size (the draws do not depend on the size); the device backend alike."""
    ramp = dict(min_res=32, max_res=96, start_ramp=0, end_ramp=2, train_crop_size=96)
    got = first_batches(shapes, backend, 2, [0, 1, 2, 1], **ramp)
    assert [tuple(b.shape) for b in got] == [(8, 3, 32, 32), (8, 3, 64, 64), (8, 3, 96, 96), (8, 3, 64, 64)]
    fixed = first_batches(shapes, backend, 0, [1], train_crop_size=64)[0]
    assert torch.equal(got[1], fixed) and torch.equal(got[3], fixed)


def test_dummy_batches_follow_the_schedule():
    section = DataConfig(dummy=True, min_res=32, max_res=64, start_ramp=0, end_ramp=1, train_crop_size=64)
    train, val, _ = data.build(section, CPU_DEVICE, data.Sampling(2), num_classes=10)
    sizes = []
    for epoch in (0, 1, 0):
        train.sampler.set_epoch(epoch)
        sizes.append(next(iter(train))[0].shape[-1])
    assert sizes == [32, 64, 32] and next(iter(val))[0].shape[-1] == 224


# ---------------------------------------------------------------- end to end, exact resume


def assert_same_run(a, b, epochs):
    ca, cb = ckpt(a), ckpt(b)
    assert ca["epoch"] == cb["epoch"] == epochs
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for k in ca["state_dict"]:
        assert torch.equal(ca["state_dict"][k], cb["state_dict"][k]), k
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        assert torch.equal(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"]), k
    ra, rb = records(a), records(b)
    for e in range(1, epochs):
        x, y = [r for r in ra if r["epoch"] == e][-1], [r for r in rb if r["epoch"] == e][-1]
        for key in ("step_lrs", "step_losses", "train_loss", "val_acc1", "val_loss"):
            assert x[key] == y[key], (e, key)


@STACK
def test_a_run_resumed_across_a_size_change_equals_the_uninterrupted_run(shapes, tmp_path):
    """32, 64, 64 px in epochs 0, 1, 2, with persistent workers (-j 2), BlurPool and the flipped validation (at the
    end); resumed after epoch 0 it trains epochs 1 and 2 at 64 and ends bit for bit where the uninterrupted run
    does."""
    args = RESNET + VAL32 + SHORT_RAMP + ["--epochs", "3", "--max-steps-per-epoch", "2", "-j", "2", "--blurpool",
                                          "--val-tta", "flip", "--eval-freq", "3"]
    full = trained(shapes, tmp_path / "full", args + ["--checkpoint-freq", "1"])
    lines = [line for line in full.stdout.splitlines() if line.startswith("=> training resolution")]
    assert lines == ["=> training resolution 32 from epoch 0", "=> training resolution 64 from epoch 1"]
    s = read_summary(tmp_path / "full")
    assert s["train_resolutions"] == [{"from_epoch": 0, "size": 32}, {"from_epoch": 1, "size": 64}]
    assert s["val_images"] == 100 and s["config"]["blurpool"] and s["config"]["val_tta"] == "flip"
    kept = os.path.join(str(tmp_path / "full"), "checkpoint_epoch1.pth.tar")
    resumed = trained(shapes, tmp_path / "part", args + ["--resume", kept])
    assert "Epoch: [0]" not in resumed.stdout
    assert [line for line in resumed.stdout.splitlines() if line.startswith("=> training resolution")] == \
        lines[1:]  # the resumed run names epoch 1's size, where it starts
    assert_same_run(tmp_path / "full", tmp_path / "part", 3)
    assert read_summary(tmp_path / "part")["train_resolutions"] == s["train_resolutions"]


@STACK
@RANKS
def test_two_ranks_resumed_across_a_size_change_equal_the_uninterrupted_job(data70, tmp_path):
    """Two ranks, 70 validation images (padded to 72: 4 a process), the flipped validation counting each image
    once; resumed after epoch 0 equal to the uninterrupted job."""
    args = ["-a", "tiny_cnn", "-b", "8", "--lr", "0.1"] + BASE + VAL32 + RAMP + [
        "--epochs", "3", "--max-steps-per-epoch", "2", "--val-tta", "flip", "--multiprocessing-distributed",
        "--device-list", "0,1", "--port", "0", "--dist-timeout", "120"]
    trained(data70, tmp_path / "full", args + ["--checkpoint-freq", "1"])
    s = read_summary(tmp_path / "full")
    assert s["world_size"] == 2 and s["val_images"] == 70
    kept = os.path.join(str(tmp_path / "full"), "checkpoint_epoch1.pth.tar")
    resumed = trained(data70, tmp_path / "part", args + ["--resume", kept])
    assert "=> training resolution 64 from epoch 1" in resumed.stdout
    assert_same_run(tmp_path / "full", tmp_path / "part", 3)
    assert read_summary(tmp_path / "part")["val_images"] == 70


# ---------------------------------------------------------------- --val-tta flip


def by_hand(root, path, arch, crop, resize, flip):
    """(Acc@1, mean loss, images) of a checkpoint's weights on val/, computed here: the project's validation crops,
    torch's model, the logits of each image and its mirror averaged."""
    import models
    sd = ckpt(os.path.dirname(path), os.path.basename(path))["state_dict"]
    model = models.get_model(arch, num_classes=10, blurpool=ckpt(os.path.dirname(path),
                                                                 os.path.basename(path))["config"]["blurpool"])
    model.load_state_dict(sd)
    model.eval()
    classes = data.class_folders(root)
    samples = data.scan_val(os.path.join(root, "val"), {c: i for i, c in enumerate(classes)})
    crop_of = data.val_transform(resize, crop)
    mean, std = torch.tensor(data.MEAN).view(3, 1, 1) * 255, torch.tensor(data.STD).view(3, 1, 1) * 255
    x = torch.stack([(crop_of(data.open_image(data.read_bytes(p), p)).float() - mean) / std for p, _ in samples])
    target = torch.tensor([t for _, t in samples])
    with torch.no_grad():
        logits = model(x.contiguous())
        if flip:
            logits = (logits + model(torch.flip(x, dims=[3]).contiguous())) / 2
    correct = int((logits.argmax(1) == target).sum())
    return 100.0 * correct / len(samples), float(F.cross_entropy(logits, target)), len(samples)


@STACK
def test_flipped_validation_equals_a_hand_computation_and_evaluates_alike(data70, tmp_path):
    common = RESNET + ["-b", "4", "--no-channels-last", "--blurpool", "--val-crop-size", "48"]  # resized to 55
    trained(data70, tmp_path / "run", common + ["--epochs", "1", "--max-steps-per-epoch", "4", "--train-crop-size",
                                                "32", "--val-tta", "flip"])
    s = read_summary(tmp_path / "run")
    assert s["config"]["val_resize_size"] == 55 and s["val_images"] == 70
    path = os.path.join(str(tmp_path / "run"), "checkpoint.pth.tar")
    acc1, loss, n = by_hand(data70, path, "resnet18", 48, 55, flip=True)
    assert n == 70 and s["final_acc1"] == pytest.approx(acc1, abs=1e-9)
    assert s["val_loss"] == pytest.approx(loss, rel=1e-4)
    plain = by_hand(data70, path, "resnet18", 48, 55, flip=False)
    assert plain[1] != pytest.approx(loss, rel=1e-6)  # the mirror changes the logits
    proc = run_main([data70, "-e", "--resume", path, "--output-dir", str(tmp_path / "eval"), "--val-tta", "flip"]
                    + common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    e = read_summary(tmp_path / "eval", "eval_summary.json")
    assert e["final_acc1"] == pytest.approx(acc1, abs=1e-9) and e["val_images"] == 70
    assert e["val_loss"] == pytest.approx(loss, rel=1e-4)


@STACK
def test_evaluate_takes_the_checkpoints_sizes_unless_given_with_a_note(shapes, tmp_path):
    """``-e --resume CKPT`` of a model trained and validated at 32 px, without the size flags, evaluates at 32
    (its run's accuracy), not at the defaults 256 / 224; a size flag given wins, and no note comes."""
    args = ["-a", "tiny_cnn", "-b", "16", "--lr", "0.1"] + BASE
    trained(shapes, tmp_path / "run", args + VAL32 + ["--train-crop-size", "32", "--epochs", "1",
                                                      "--max-steps-per-epoch", "3"])
    kept = os.path.join(str(tmp_path / "run"), "checkpoint.pth.tar")
    proc = run_main([shapes, "-e", "--resume", kept, "--output-dir", str(tmp_path / "eval")] + args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stdout.splitlines() if "at the sizes its run validated at" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "--val-resize-size 32 --val-crop-size 32" in notes[0]
    e = read_summary(tmp_path / "eval", "eval_summary.json")
    assert (e["config"]["val_resize_size"], e["config"]["val_crop_size"]) == (32, 32) and e["val_images"] == 100
    assert e["final_acc1"] == pytest.approx(read_summary(tmp_path / "run")["final_acc1"], abs=1e-9)
    given = run_main([shapes, "-e", "--resume", kept, "--output-dir", str(tmp_path / "given"), "--val-crop-size",
                      "48"] + args)
    assert given.returncode == 0, given.stderr[-3000:]
    assert "at the sizes its run validated at" not in given.stdout
    g = read_summary(tmp_path / "given", "eval_summary.json")
    assert (g["config"]["val_resize_size"], g["config"]["val_crop_size"]) == (55, 48)


@STACK
def test_the_average_is_validated_with_flips_too(shapes, tmp_path):
    proc = trained(shapes, tmp_path, ["-a", "tiny_cnn", "-b", "16", "--lr", "0.1"] + BASE + VAL32 + [
        "--epochs", "1", "--max-steps-per-epoch", "2", "--model-ema", "--model-ema-steps", "1", "--val-tta", "flip",
        "--train-crop-size", "32"])
    s = read_summary(tmp_path)
    assert s["val_images"] == 100 and s["model_ema"]["final_acc1"] is not None
    assert sum(1 for line in proc.stdout.splitlines() if line.startswith("Test EMA: [")) >= 1


# ---------------------------------------------------------------- --blurpool


def test_blurpool_is_ffcvs_rule_and_keeps_the_plain_networks_state_dict():
    import models
    from models.blurpool import BlurPoolConv2d, binomial_filter
    plain, blur = models.get_model("resnet50", num_classes=10), models.get_model("resnet50", num_classes=10,
                                                                               blurpool=True)
    replaced = [n for n, m in blur.named_modules() if isinstance(m, BlurPoolConv2d)]
    expected = [n for n, m in plain.named_modules() if isinstance(m, torch.nn.Conv2d) and max(m.stride) > 1
                and m.in_channels >= 16]
    assert replaced == expected and "conv1" not in replaced and "layer2.0.conv2" in replaced \
        and "layer2.0.downsample.0" in replaced and len(replaced) == 6
    assert {k: v.shape for k, v in blur.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    blur.load_state_dict(plain.state_dict())  # published weights load as they are
    conv = dict(plain.named_modules())["layer2.0.conv2"]
    layer = dict(blur.named_modules())["layer2.0.conv2"]
    x = torch.randn(2, conv.in_channels, 9, 9)
    k = torch.tensor([1.0, 2.0, 1.0])
    assert torch.equal(binomial_filter(1)[0, 0], torch.outer(k, k) / 16)
    blurred = F.conv2d(x, binomial_filter(conv.in_channels), padding=1, groups=conv.in_channels)  # zero padding
    assert torch.allclose(layer(x), conv(blurred), atol=1e-5) and layer.stride == conv.stride == (2, 2)
    assert not torch.allclose(layer(x), conv(x), atol=1e-3)


@STACK
def test_blurpool_trains_from_plain_weights_and_resumes_only_as_itself(shapes, tmp_path, capsys):
    import models
    weights = str(tmp_path / "plain.pth")
    torch.manual_seed(0)
    torch.save(models.get_model("resnet18", num_classes=10).state_dict(), weights)
    args = RESNET + VAL32 + ["--train-crop-size", "32", "--epochs", "2", "--max-steps-per-epoch", "2"]
    trained(shapes, tmp_path / "bp", args + ["--blurpool", "--pretrained", weights, "--epochs", "1"])
    kept = os.path.join(str(tmp_path / "bp"), "checkpoint.pth.tar")
    assert ckpt(tmp_path / "bp")["config"]["blurpool"] is True
    trained(shapes, tmp_path / "more", args + ["--blurpool", "--resume", kept])
    assert ckpt(tmp_path / "more")["epoch"] == 2
    assert_call_error(entry.main, [shapes, "--output-dir", str(tmp_path / "no")] + args + ["--resume", kept],
                      capsys, "was trained with --blurpool", "add --blurpool")
    assert_call_error(entry.main, [shapes, "-e", "--output-dir", str(tmp_path / "no")] + args + ["--resume", kept],
                      capsys, "evaluate it as it was trained")
    assert not os.path.exists(str(tmp_path / "no"))


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize("argv,fragments", [
    (["--min-res", "32"], ("--min-res needs --max-res",)),
    (["--max-res", "64"], ("--max-res needs --min-res",)),
    (["--min-res", "48", "--max-res", "64"], ("--min-res 48 is not a multiple of 32", "give 32 or 64")),
    (["--min-res", "96", "--max-res", "64"], ("--min-res 96 is above --max-res 64",)),
    (["--min-res", "32", "--max-res", "64"], ("need --start-ramp and --end-ramp",)),
    (["--min-res", "32", "--max-res", "64", "--start-ramp", "2", "--end-ramp", "1"], ("--start-ramp 2 is after",)),
    (["--min-res", "32", "--max-res", "64", "--start-ramp", "0", "--end-ramp", "5"],
     ("--end-ramp 5 is beyond --epochs 3",)),
    (RAMP + ["--train-crop-size", "32"], ("--train-crop-size 32 and --min-res contradict",)),
    (["--val-crop-size", "64", "--val-resize-size", "60"], ("--val-crop-size 64 is larger than --val-resize-size 60",)),
    (["--val-tta", "five"], ("--val-tta", "invalid choice")),
    (["-a", "tiny_cnn", "--blurpool"], ("--blurpool applies to torchvision's ResNets", "not to -a tiny_cnn")),
    (["-a", "shufflenet_v2_x0_5", "--blurpool"], ("--blurpool", "not to -a shufflenet_v2_x0_5")),
])
def test_a_bad_value_is_one_line(shapes, tmp_path, capsys, argv, fragments):
    assert_call_error(entry.main, [shapes, "--output-dir", str(tmp_path), "--epochs", "3"] + RESNET + VAL32 + argv,
                      capsys,
                      *fragments)
    assert not os.listdir(str(tmp_path))

