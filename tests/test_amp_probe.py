"""--amp-dtype auto on a CPU measures: the run's model timed in float32 and bfloat16 autocast before training,
the faster trained in. Each verdict is forced through the probe's timing function (run(..., amp_timer=)), and
the run is checked for the dtype it trained in, its note and summary.json; the cache of costly verdicts, the
interleaved timer (on a given clock) and the probe leaving the run's model and RNG alone are tested in-process.
No timing is asserted."""
import json
import os

import pytest
import torch

from conftest import ONCE, RANKS, SMALL, STACK, read_summary, run_main
from trainer.precision import amp_probe
from trainer import run as runmod
from trainer.config import parse_config
from trainer.device import Device, torch_load
from trainer.device import cpu as cpumod
from trainer.device import host as hostmod

pytestmark = [ONCE, pytest.mark.timeout(300)]

CPU = Device("cpu", None)
TINY = ["-a", "tiny_cnn", "--device", "cpu", "-b", "8", "--epochs", "1", "--max-steps-per-epoch", "2",
        "--seed", "1"] + SMALL


def forced(float32_s, bfloat16_s, calls):
    """A timing function with ``time_steps``'s contract that runs each probe step once for real and reports the
    given seconds per step."""
    def timer(step, dtypes):
        for name, dtype in dtypes:
            step(dtype)
            calls.append(name)
        return {"float32": float32_s, "bfloat16": bfloat16_s}
    return timer


def train_in_process(argv, capsys, timer):
    parsed = parse_config([str(a) for a in argv] + ["--no-tensorboard", "--progress", "lines"], env={})
    rc = runmod.run(parsed.cfg, parsed.notes, amp_timer=timer)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def native_bf16(monkeypatch, tmp_path):
    """A CPU and a torch with native bfloat16 (so auto's rule offers it, and the probe decides); verdicts kept
    under tmp_path."""
    monkeypatch.setattr(hostmod, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(cpumod, "slow_bf16", lambda: None)  # torch 1.11's own rule (its kernels) aside
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@STACK
@pytest.mark.parametrize("bf16_faster", [False, True])
def test_amp_trains_in_the_dtype_the_probe_measured_faster(shapes, tmp_path, capsys, native_bf16, bf16_faster):
    calls = []
    timer = forced(0.10, 0.05 if bf16_faster else 0.16, calls)
    rc, out, err = train_in_process([shapes, "--amp", "--output-dir", tmp_path / "run"] + TINY, capsys, timer)
    assert rc == 0, err[-3000:]
    assert calls == ["float32", "bfloat16"]  # the probe's steps ran, in both dtypes
    s = read_summary(tmp_path / "run")
    amp, probe = s["amp"], s["amp"]["probe"]
    # batch 8 per step: 0.10 s -> 80 img/s; 0.05 s -> 160; 0.16 s -> 50
    assert probe["float32_img_s"] == pytest.approx(80.0)
    assert probe["bfloat16_img_s"] == pytest.approx(160.0 if bf16_faster else 50.0)
    assert probe["arch"] == "tiny_cnn" and probe["size"] == 32 and probe["batch"] == 8 and probe["backward"]
    assert probe["cached"] is False and probe["seconds"] >= 0
    note = [ln for ln in out.splitlines() if ln.startswith("note: --amp: bfloat16 autocast measured")]
    assert len(note) == 1, out
    assert "float32 80.0 img/s" in note[0] and "bfloat16 {:.1f} img/s".format(probe["bfloat16_img_s"]) in note[0]
    assert note[0][len("note: "):] in amp["note"] and note[0][len("note: "):] in s["notes"]
    ckpt = torch_load(str(tmp_path / "run" / "checkpoint.pth.tar"), map_location="cpu", weights_only=False)
    if bf16_faster:
        assert amp["enabled"] and amp["impl"] == "native" and amp["dtype"] == "bfloat16"
        assert probe["choice"] == "bfloat16" and "training in bfloat16" in note[0]
        assert "| amp native bfloat16 |" in out
        assert ckpt["precision"]["dtype"] == "bfloat16"
    else:
        assert not amp["enabled"] and amp["dtype"] == "float32" and probe["choice"] == "float32"
        assert "measured no faster" in note[0] and "training in float32 (--amp-dtype bfloat16 forces" in note[0]
        assert "| amp off (float32: measured faster than bfloat16 here) |" in out
        assert ckpt["precision"] == {"impl": "none", "dtype": "float32", "overflow_steps": 0}


def test_a_near_tie_trains_in_float32(shapes, tmp_path, capsys, native_bf16):
    """bfloat16 must be MARGIN faster: 1.02x is within a shared machine's noise."""
    rc, out, err = train_in_process([shapes, "--amp", "--output-dir", tmp_path / "run"] + TINY, capsys,
                                    forced(0.102, 0.100, []))
    assert rc == 0, err[-3000:]
    s = read_summary(tmp_path / "run")
    assert s["amp"]["dtype"] == "float32" and s["amp"]["probe"]["bfloat16_over_float32"] == pytest.approx(1.02)


def test_explicit_bfloat16_is_not_measured(shapes, tmp_path, capsys, native_bf16):
    def timer(step, dtypes):
        raise AssertionError("--amp-dtype bfloat16 must not be measured")
    rc, out, err = train_in_process([shapes, "--amp", "--amp-dtype", "bfloat16", "--output-dir", tmp_path / "run"]
                                    + TINY, capsys, timer)
    assert rc == 0, err[-3000:]
    amp = read_summary(tmp_path / "run")["amp"]
    assert amp["dtype"] == "bfloat16" and amp["probe"] is None and "measured" not in (amp["note"] or "")


def test_no_native_bfloat16_trains_float32_without_measuring(shapes, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hostmod, "cpu_native_bf16", lambda: False)

    def timer(step, dtypes):
        raise AssertionError("bfloat16 is emulated here: nothing to measure")
    rc, out, err = train_in_process([shapes, "--amp", "--output-dir", tmp_path / "run"] + TINY, capsys, timer)
    assert rc == 0, err[-3000:]
    amp = read_summary(tmp_path / "run")["amp"]
    assert amp["dtype"] == "float32" and amp["probe"] is None and "no native bfloat16" in amp["note"]


def test_evaluate_measures_the_forward_at_the_validation_crop(shapes, tmp_path, capsys, native_bf16):
    calls = []
    rc, out, err = train_in_process([shapes, "--amp", "-e", "--output-dir", tmp_path / "ev", "-a", "tiny_cnn",
                                     "--device", "cpu", "-b", "8", "--val-resize-size", "40", "--val-crop-size", "36",
                                     "-j", "0"],
                                    capsys, forced(0.1, 0.05, calls))
    assert rc == 0, err[-3000:]
    s = read_summary(tmp_path / "ev", "eval_summary.json")
    amp = s["amp"]
    assert amp["dtype"] == "bfloat16" and amp["probe"]["backward"] is False and amp["probe"]["size"] == 36
    assert "note: " + amp["note"] in out and amp["note"] in s["notes"] and "(36 px, batch 8, " in amp["note"]
    assert calls == ["float32", "bfloat16"]


# ---------------------------------------------------------------- the probe itself


def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Dropout(0.5), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(4, 5))


SHAPE = {"arch": "tiny", "size": 16, "batch": 4, "channels_last": True, "backward": True}


@STACK
def test_the_probe_leaves_the_model_and_the_rng_as_they_were():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    verdict = amp_probe.measure(model, CPU, SHAPE, cache=False)  # the real timer, real steps
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics too
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # dropout ran in the probe's own RNG state
    assert set(verdict.rates) == {"float32", "bfloat16"} and all(r > 0 for r in verdict.rates.values())
    assert verdict.dtype in (None, torch.bfloat16) and verdict.cache_file is None


def test_a_costly_verdict_is_kept_and_read_back_per_model_and_shape(tmp_path):
    folder = str(tmp_path / "cache")
    idle = lambda: 0.0  # noqa: E731 (the load average: an idle machine)
    first = amp_probe.measure(tiny(), CPU, SHAPE, timer=forced(0.2, 0.1, []), cache=folder, cache_after_s=0.0,
                              load=idle)
    assert first.dtype == torch.bfloat16 and first.cache_file and os.path.dirname(first.cache_file) == folder
    entry = json.loads(open(first.cache_file).read())
    assert entry["choice"] == "bfloat16" and entry["key"]["arch"] == "tiny" and entry["key"]["size"] == 16

    def must_not_run(step, dtypes):
        raise AssertionError("a kept verdict is read, not measured again")
    again = amp_probe.measure(tiny(), CPU, SHAPE, timer=must_not_run, cache=folder)
    assert again.cached and again.dtype == torch.bfloat16 and again.rates == first.rates
    assert "read from {}".format(first.cache_file) in again.note() and "delete it to measure again" in again.note()
    # another shape is another verdict; a cheap probe is not kept
    other = amp_probe.measure(tiny(), CPU, dict(SHAPE, size=20), timer=forced(0.1, 0.2, []), cache=folder)
    assert other.dtype is None and not other.cached and other.cache_file is None
    # a verdict measured on a busy machine (load average above its cores) is not kept either
    busy = amp_probe.measure(tiny(), CPU, dict(SHAPE, size=24), timer=forced(0.2, 0.1, []), cache=folder,
                             cache_after_s=0.0, load=lambda: 99.0)
    assert busy.cache_file is None and busy.as_dict()["busy_load_average"] == 99.0
    assert "busy (load average 99.0 on" in busy.note()
    assert sorted(os.listdir(folder)) == [os.path.basename(first.cache_file)]
    # an unreadable file is measured again (and replaced)
    with open(first.cache_file, "w") as f:
        f.write("{not json")
    redo = amp_probe.measure(tiny(), CPU, SHAPE, timer=forced(0.1, 0.2, []), cache=folder, cache_after_s=0.0,
                             load=idle)
    assert not redo.cached and redo.dtype is None
    assert json.loads(open(first.cache_file).read())["choice"] == "float32"


def test_the_cache_lives_under_xdg_cache_home():
    assert amp_probe.cache_dir({"XDG_CACHE_HOME": "/x/c"}) == "/x/c/imagenet-npu-trainer/amp_dtype"
    assert amp_probe.cache_dir({}).endswith(os.path.join(".cache", "imagenet-npu-trainer", "amp_dtype"))


def test_time_steps_warms_up_then_interleaves_and_keeps_each_fastest_step():
    ticks = iter(range(1000))
    order = []
    best = amp_probe.time_steps(lambda dtype: order.append(dtype), (("float32", None), ("bfloat16", "bf")),
                                clock=lambda: float(next(ticks)))
    warm, timed = order[:2], order[2:]
    assert warm == [None, "bf"]
    assert len(timed) >= 2 * amp_probe.MIN_ROUNDS and len(timed) <= 2 * amp_probe.MAX_ROUNDS
    assert timed[:4] == [None, "bf", "bf", None]  # each round reverses the last one's order
    assert best == {"float32": 1.0, "bfloat16": 1.0}  # one tick per step on this clock


@STACK
def test_a_cpu_run_with_amp_records_its_measurement(shapes, tmp_path):
    """main.py as users run it, on this machine's CPU: whatever the verdict, the run trained in it and said why."""
    proc = run_main([shapes, "--amp", "--output-dir", str(tmp_path / "run")] + TINY,
                    env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    amp = read_summary(tmp_path / "run")["amp"]
    if amp["probe"] is None:  # no native bfloat16 on this CPU: float32 by the flags
        assert amp["dtype"] == "float32" and "no native bfloat16" in amp["note"]
    else:
        assert amp["dtype"] == amp["probe"]["choice"] and "note: --amp: bfloat16 autocast measured" in proc.stdout


@STACK
@RANKS
def test_every_rank_trains_in_rank_0s_verdict(shapes, tmp_path):
    """Two processes: rank 0 measures (this CPU's real verdict, or float32 by the flags) and both ranks train in
    its choice: each rank's start line names the same precision."""
    proc = run_main([shapes, "--amp", "--multiprocessing-distributed", "--device-list", "0,1", "--port", "0",
                     "--output-dir", str(tmp_path / "run")] + TINY, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    amp = read_summary(tmp_path / "run")["amp"]
    label = "| amp native bfloat16 |" if amp["dtype"] == "bfloat16" else "| amp off"
    starts = [ln for ln in proc.stdout.splitlines() if "=> tiny_cnn on cpu" in ln]
    assert len(starts) == 2 and all(label in ln for ln in starts), proc.stdout[-3000:]
    if amp["probe"] is not None:
        assert amp["dtype"] == amp["probe"]["choice"]
