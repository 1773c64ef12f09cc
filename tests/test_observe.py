"""Seeing a run: TensorBoard events, metrics.jsonl, the progress bar on a terminal, plot_runs.py."""
import json
import os
import pty
import re
import select
import subprocess
import time

import pytest

from conftest import (CPU_FLOAT16, ONCE, PY, ROOT, SMALL, STACK, THREADS, assert_one_line_error, read_summary, run_main,
                      run_tool)
from trainer.record.observe import METRICS, read_records

pytestmark = [ONCE, pytest.mark.timeout(240)]

RUN = ["-a", "tiny_cnn", "-b", "20", "--lr", "0.05", "--seed", "4", "--device", "cpu"] + SMALL[:6] + ["-j", "0",
                                                                                                      "-p", "5"]
STEPS = 20  # 400 training images / 20


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(os.path.join(str(folder), "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def resumed(shapes, tmp_path_factory):
    """2 epochs, then a crash's leftovers (a record and events of a third epoch that never reached its
    checkpoint), then --resume auto to 3 epochs."""
    out = tmp_path_factory.mktemp("observed")
    first = run_main([shapes, "--output-dir", str(out), "--epochs", "2"] + RUN)
    assert first.returncode == 0, first.stderr[-2000:]
    with open(os.path.join(str(out), METRICS), "a") as f:
        f.write(json.dumps({"epoch": 2, "train_loss": 99.0}) + "\n")
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(os.path.join(str(out), "tensorboard"))
    w.add_scalar("train/loss", 99.0, 2 * STEPS + 1)
    w.close()
    # TensorBoard reads a folder's event files in the order of their names, which begin with the second each was
    # made in, then the host and the pid: the resumed run's file (with its purge) must come after this one, as a real
    # crash's (made seconds before) does, and not sort before it by its pid within one second
    (made,) = [int(n.split(".")[3]) for n in os.listdir(os.path.join(str(out), "tensorboard"))
               if n.startswith("events.out.tfevents.") and n.rsplit(".", 2)[1] == str(os.getpid())]
    while int(time.time()) <= made:
        time.sleep(0.05)
    second = run_main([shapes, "--output-dir", str(out), "--epochs", "3", "--resume", "auto"] + RUN)
    assert second.returncode == 0, second.stderr[-2000:]
    return out, first, second


@STACK
def test_event_files_cover_one_continuous_step_axis_across_resume(resumed):
    out, _, _ = resumed
    s = scalars(out)
    for tag in ("train/loss", "train/acc1", "train/lr", "train/images_per_second", "train/data_wait_fraction",
                "val/acc1", "val/loss", "train/epoch_seconds"):
        assert tag in s, (tag, sorted(s))
    assert [step for step, _ in s["val/acc1"]] == [STEPS, 2 * STEPS, 3 * STEPS]
    steps = [step for step, _ in s["train/loss"]]
    # print steps 1, 6, 11, 16 and the last of each epoch, epoch after epoch, each once
    per_epoch = [1, 6, 11, 16, 20]
    assert steps == [e * STEPS + k for e in range(3) for k in per_epoch], steps
    assert all(v != 99.0 for _, v in s["train/loss"])  # the crashed attempt's events were purged
    assert all(v == pytest.approx(0.05) for _, v in s["train/lr"])
    assert all(v > 0 for _, v in s["train/images_per_second"])


def test_metrics_jsonl_has_one_record_per_epoch(resumed):
    out, _, _ = resumed
    records = read_records(os.path.join(str(out), METRICS))
    assert [r["epoch"] for r in records] == [0, 1, 2]
    summary = read_summary(out)
    last = records[-1]
    assert last["val_acc1"] == pytest.approx(summary["final_acc1"]) and last["train_loss"] != 99.0
    for key in ("train_loss", "train_acc1", "val_loss", "val_acc5", "lr", "images_per_second",
                "data_wait_fraction", "overflow_steps", "seconds", "time", "arch", "device", "world_size", "amp"):
        assert last.get(key) is not None, key
    assert last["global_step"] == 3 * STEPS


def test_examples_lines_unchanged_when_piped(resumed):
    _, first, _ = resumed
    lines = first.stdout.splitlines()
    epoch_lines = [ln for ln in lines if ln.startswith("Epoch: ")]
    assert len(epoch_lines) == 2 * 5
    for ln in epoch_lines:
        assert re.fullmatch(r"Epoch: \[\d\]\[\s*\d+/20\]\tTime +[\d.]+ \( *[\d.]+\)\tData +[\d.]+ \( *[\d.]+\)\t"
                            r"Loss [\d.e+-]+ \([\d.e+-]+\)\tAcc@1 +[\d.]+ \( *[\d.]+\)\tAcc@5 +[\d.]+ \( *[\d.]+\)",
                            ln), ln
    assert sum(1 for ln in lines if ln.startswith("Test: ")) == 2 * 2 and "\r" not in first.stdout
    assert not any("it/s" in ln or "%|" in ln for ln in lines)


def test_progress_bar_on_a_terminal(shapes, tmp_path):
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=THREADS, COLUMNS="120")
    p = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), shapes, "--output-dir", str(tmp_path), "--epochs", "1",
                          "--max-steps-per-epoch", "6"] + RUN, stdout=slave, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        if select.select([master], [], [], 1)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=60)
    os.close(master)
    text = out.decode("utf-8", "replace")
    assert p.returncode == 0, p.stderr.read()[-2000:]
    assert re.search(r"Epoch 0: +100%\|.*\| 6/6 ", text), text[-2000:]
    assert "loss " in text and "acc1 " in text and "img/s " in text  # the running values in the bar
    assert "\tData " not in text  # the examples' step lines are replaced by the bar
    assert " *   Acc@1 " in text and "=> summary:" in text
    assert read_summary(tmp_path)["status"] == "ok"


def test_run_completes_without_tensorboard_with_one_note(shapes, tmp_path):
    stub = tmp_path / "stub" / "tensorboard"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named tensorboard')\n")
    env = {"PYTHONPATH": str(tmp_path / "stub")}
    proc = run_main([shapes, "--output-dir", str(tmp_path / "o"), "--epochs", "1", "--max-steps-per-epoch", "3"]
                    + RUN, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    notes = [ln for ln in proc.stdout.splitlines() if "TensorBoard" in ln]
    assert len(notes) == 1 and notes[0].startswith("note: TensorBoard is off"), notes
    assert not os.path.exists(str(tmp_path / "o" / "tensorboard"))
    assert len(read_records(str(tmp_path / "o" / METRICS))) == 1
    off = run_main([shapes, "--output-dir", str(tmp_path / "off"), "--epochs", "1", "--no-tensorboard",
                    "--max-steps-per-epoch", "3"] + RUN)
    assert off.returncode == 0 and not os.path.exists(str(tmp_path / "off" / "tensorboard"))


@STACK
def test_plot_runs_writes_a_png_and_rejects_a_folder_without_metrics(resumed, shapes, tmp_path):
    out, _, _ = resumed
    other = tmp_path / "other"  # a float16 run: its loss scale and overflow count are recorded too
    fp16 = [] if CPU_FLOAT16 else ["--amp", "--amp-dtype", "float16"]  # a torch without it: a float32 run
    proc = run_main([shapes, "--output-dir", str(other), "--epochs", "1", "--max-steps-per-epoch", "6"] + fp16 + RUN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = scalars(other)
    if fp16:
        assert [step for step, _ in s["amp/loss_scale"]] == [1, 6]
        assert all(v > 0 for _, v in s["amp/loss_scale"]) and all(v >= 0 for _, v in s["amp/overflow_steps"])
        assert s["amp/overflow_steps"][-1][1] == read_summary(other)["overflow_steps"]
    else:
        assert "amp/loss_scale" not in s
    png = str(tmp_path / "runs.png")
    p = run_tool("plot_runs.py", [str(out), str(other), "-o", png])
    assert p.returncode == 0, p.stderr[-2000:]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10000
    bad = run_tool("plot_runs.py", [str(out), shapes, "-o", str(tmp_path / "x.png")])
    assert_one_line_error(bad, "'{}' has no metrics.jsonl".format(shapes))
    assert not os.path.exists(str(tmp_path / "x.png"))


def test_plot_runs_keeps_an_existing_file(tmp_path, capsys):
    from conftest import assert_call_error
    from tools import plot_runs
    from trainer import errors
    png = tmp_path / "runs.png"
    png.write_bytes(b"an earlier plot")
    assert_call_error(lambda argv: errors.run(plot_runs.main, argv), [str(tmp_path), "-o", str(png)], capsys,
                      "exists: pass --force")
    assert png.read_bytes() == b"an earlier plot"
