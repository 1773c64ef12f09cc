"""Precision alignment on msprobe (trainer/align.py, tools/align.py): main.py --precision-dump writes msprobe's dumps
of the chosen steps, --deterministic gives the same weights and batches whatever the worker count, and tools.align
compares dumps (msprobe's comparison), losses and configurations of real runs; bad input is one line, exit 2. A
comparison without -o writes a new git-ignored folder beside the target's dump each time; its worst list starts with
what msprobe marks error, as its verdict counts; a dump after a mid-epoch resume is labelled with its global step."""
import csv
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from conftest import (ONCE, PY, PY38, ROOT, SMALL, STACK, THREADS, assert_one_line_error, child_env, finish, read_lines,
                      read_summary, run_main, run_python, trained)
from tools import align as tool
from trainer.record.observe import read_records

pytestmark = [STACK, PY38, pytest.mark.clients, pytest.mark.timeout(300)]

MSPROBE = importlib.util.find_spec("msprobe") is not None
needs_msprobe = pytest.mark.skipif(not MSPROBE, reason="msprobe (pip install mindstudio-probe==26.2.0) is not "
                                                       "installed in this environment")
RUN = ["-a", "resnet18", "--seed", "3", "--epochs", "1", "--max-steps-per-epoch", "3", "-b", "8", "-p", "1",
       "--no-tensorboard", "--device", "cpu", "--deterministic"] + [a for a in SMALL if a not in ("-p", "5")]


def align(*args, cwd=ROOT, env=None):
    """python3 -m tools.align ARGS in a fresh process."""
    e = dict(os.environ, OMP_NUM_THREADS=THREADS, PYTHONUNBUFFERED="1")
    e.update(env or {})
    return run_python(["-m", "tools.align"] + list(args), e, 240, cwd)


def dump_run(data, out, workers, *more):
    """A RUN loading with ``workers`` data workers, dumping into ``out``/dump."""
    at = RUN.index("-j")
    args = RUN[:at] + ["-j", str(workers)] + RUN[at + 2:]
    return trained(data, out / "run", args + ["--precision-dump", str(out / "dump")] + list(more))


@pytest.fixture(scope="module")
def runs(shapes, tmp_path_factory):
    """Two CPU runs with the same seed, one loading with no worker and one with two, each dumping steps 0 and 2."""
    if not MSPROBE:
        pytest.skip("msprobe (pip install mindstudio-probe==26.2.0) is not installed in this environment")
    base = tmp_path_factory.mktemp("align")
    a, b = base / "a", base / "b"
    dump_run(shapes, a, 0, "--dump-steps", "0,2")
    dump_run(shapes, b, 2, "--dump-steps", "0,2")
    return a, b


@needs_msprobe
def test_precision_dump_writes_msprobes_dump_of_the_chosen_steps(runs):
    a, _ = runs
    steps = sorted(os.listdir(str(a / "dump")))
    assert steps == ["step0", "step2"], steps
    for step in steps:
        files = sorted(os.listdir(str(a / "dump" / step / "rank0")))
        assert {"dump.json", "stack.json", "construct.json"} <= set(files), files
        with open(str(a / "dump" / step / "rank0" / "dump.json")) as f:
            dump = json.load(f)
        assert dump["task"] == "statistics" and dump["level"] == "L0"
        fc = dump["data"]["Module.fc.Linear.forward.0"]["output"][0]
        assert fc["shape"] == [8, 10] and fc["Max"] is not None and fc["Norm"] > 0


@needs_msprobe
def test_deterministic_runs_have_the_same_weights_and_batches_whatever_the_worker_count(runs):
    a, b = (read_summary(r / "run") for r in runs)
    assert a["data_workers"] == 0 and b["data_workers"] == 2
    xa, xb = a["alignment"], b["alignment"]
    assert xa["seed"] == xb["seed"] == 3 and xa["deterministic"] is True
    assert xa["batches_steps"] == 2 and len(xa["batches_sha256"]) == 64
    assert xa["weights_sha256"] == xb["weights_sha256"]
    assert xa["batches_sha256"] == xb["batches_sha256"]
    assert xa["packages"]["mindstudio-probe"] == "26.2.0"


@needs_msprobe
def test_align_compare_of_two_identical_cpu_runs_is_within_msprobes_thresholds(runs, tmp_path):
    a, b = runs
    out = tmp_path / "cmp"
    proc = align("compare", a / "dump", b / "dump", "-o", out, "--top", "3")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "2 step(s) (0,2), rank(s) 0" in proc.stdout and "0 over msprobe's thresholds" in proc.stdout
    assert "=> within msprobe's thresholds" in proc.stdout
    results = [line.split("full result: ")[1] for line in proc.stdout.splitlines() if "full result: " in line]
    assert len(results) == 2 and all(os.path.isfile(p) and p.endswith(".csv") for p in results)
    assert (out / ".gitignore").read_text() == "*\n"  # the -o it created is git-ignored
    again = align("compare", a / "dump", b / "dump", "-o", out)  # the results are not overwritten unasked
    assert_one_line_error(again, "is not empty", "--force")


def results_of(stdout):
    """The folders of the "=> full result: CSV" lines of a compare (the CSV's step folder's parent)."""
    return {os.path.dirname(os.path.dirname(line.split("full result: ")[1])) for line in stdout.splitlines()
            if "full result: " in line}


@needs_msprobe
def test_align_compare_without_o_writes_a_new_ignored_folder_beside_the_target_each_time(runs, tmp_path):
    a, b = runs
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    here = {"PYTHONPATH": ROOT}  # this checkout's tools, started elsewhere
    first, second = (align("compare", a / "dump", b / "dump", "--top", "1", cwd=cwd, env=here) for _ in range(2))
    for proc in (first, second):
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    one, two = results_of(first.stdout), results_of(second.stdout)
    assert one == {str(b / "compare_dump_vs_dump")} and two == {str(b / "compare_dump_vs_dump_2")}, (one, two)
    for folder in one | two:
        assert "=> results into {}".format(folder) in (first.stdout + second.stdout)
        assert open(os.path.join(folder, ".gitignore")).read() == "*\n"
        assert sorted(os.listdir(folder)) == [".gitignore", "step0", "step2"]
    assert os.listdir(str(cwd)) == []  # nothing in the folder it was started in
    step = align("compare", a / "dump" / "step2", b / "dump" / "step2", cwd=cwd, env=here)  # named by their dumps
    assert step.returncode == 0 and results_of(step.stdout) == {str(b / "compare_dump_vs_dump_3")}, step.stdout


CSV_HEAD = ["NPU Name", "Bench Name", "NormRelativeErr", "MaxRelativeErr", "Result", "Err_message"]


@ONCE
def test_the_worst_list_puts_msprobes_errors_first_then_warnings_then_by_relative_error(tmp_path):
    """Rows as msprobe's CSV holds them, read by compare: a pass far off, a warning, three errors, one without a
    relative error. The list starts with the errors the verdict counts, whatever the relative errors."""
    path = tmp_path / "compare_result_rank0_1.csv"
    cells = [("Module.conv1.Conv2d.forward.0.output.0", "40.0%", "pass", "[]"),
             ("Module.layer1.ReLU.forward.0.output.0", "N/A", "error", '["error: There is nan/inf"]'),
             ("Module.bn1.BatchNorm2d.forward.0.output.0", "3.0", "pass", "[]"),
             ("Module.fc.Linear.forward.0.output.0", "0.6", "error", '["error: The NormRelativeErr of output"]'),
             ("Module.layer2.Conv2d.forward.0.output.0", "0.2", "warning", '["warning: 10 times"]'),
             ("Module.layer3.Conv2d.forward.0.output.0", "0.9", "error", '["error: The NormRelativeErr of output"]'),
             ("Module.layer4.Conv2d.forward.0.output.0", "N/A", "pass", "[]")]
    with open(str(path), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_HEAD)
        for name, rel, result, message in cells:
            w.writerow([name, name, rel, "N/A", result, message])
    rows = tool._read_rows(str(path), 0, 0)
    lines = []
    assert tool.verdict(rows, [str(path)], [(0, [0])], 5, lines.append) == 1
    assert lines[0].endswith("7 tensors compared, 3 over msprobe's thresholds (error), 1 warning(s)"), lines[0]
    assert lines[1] == "worst 5: msprobe's errors first, then its warnings, then the rest; each by relative error, " \
                       "largest first:", lines[1]
    listed = [(line.split()[0].split(".")[1], line.split()[-1], line.split()[-2]) for line in lines[2:7]]
    assert listed == [("layer3", "error", "9.000e-01"), ("fc", "error", "6.000e-01"), ("layer1", "error", "N/A"),
                      ("layer2", "warning", "2.000e-01"), ("bn1", "pass", "3.000e+00")], lines
    assert lines[-1].startswith("=> first over msprobe's thresholds in execution order: layer1 ")


def scaled(dump_json, name, where, factor):
    """Multiply the Norm of ``name``'s first ``where`` ("input_args" or "output") tensor in a dump.json by
    ``factor``: that tensor's norm relative error becomes factor - 1."""
    with open(str(dump_json)) as f:
        dump = json.load(f)
    dump["data"][name][where][0]["Norm"] *= factor
    with open(str(dump_json), "w") as f:
        json.dump(dump, f)


@needs_msprobe
def test_align_compare_lists_the_errors_of_its_verdict_first(runs, tmp_path):
    """A real comparison against a copy of the dump whose fc output is off (an error: its inputs are not), a
    conv's input and output both 100 times off (pass: its inputs carry it) and a conv's output 20 times its
    input's error (a warning): the list starts with the error, the verdict's first, then the warning."""
    a, b = runs
    target = tmp_path / "target"
    shutil.copytree(str(b / "dump" / "step0"), str(target / "step0"))
    dump_json = target / "step0" / "rank0" / "dump.json"
    scaled(dump_json, "Module.fc.Linear.forward.0", "output", 3.0)
    scaled(dump_json, "Module.layer1.0.conv1.Conv2d.forward.0", "input_args", 100.0)
    scaled(dump_json, "Module.layer1.0.conv1.Conv2d.forward.0", "output", 100.0)
    scaled(dump_json, "Module.layer2.0.conv1.Conv2d.forward.0", "input_args", 1.01)
    scaled(dump_json, "Module.layer2.0.conv1.Conv2d.forward.0", "output", 1.2)
    proc = align("compare", a / "dump", target, "--top", "4")
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "1 over msprobe's thresholds (error), 1 warning(s)" in proc.stdout, proc.stdout[-3000:]
    at = proc.stdout.splitlines().index("worst 4: msprobe's errors first, then its warnings, then the rest; each by "
                                        "relative error, largest first:")
    listed = [line.split() for line in proc.stdout.splitlines()[at + 1:at + 5]]
    conv1, conv2 = "Module.layer1.0.conv1.Conv2d.forward.0.", "Module.layer2.0.conv1.Conv2d.forward.0."
    assert [(w[0], w[-1]) for w in listed[:2]] == [
        ("Module.fc.Linear.forward.0.output.0", "error"), (conv2 + "output.0", "warning")], proc.stdout[-3000:]
    # the two passes tie (both 100 times off): in msprobe's order, which its releases do not keep alike
    assert sorted((w[0], w[-1]) for w in listed[2:]) == [(conv1 + "input.0", "pass"), (conv1 + "output.0", "pass")], \
        proc.stdout[-3000:]
    assert "=> first over msprobe's thresholds in execution order: fc (Module.fc.Linear.forward.0, step 0" in \
        proc.stdout
    assert results_of(proc.stdout) == {str(tmp_path / "compare_dump_vs_target")}


@needs_msprobe
def test_align_losses_and_config_show_what_differs_between_two_real_runs(runs, shapes, tmp_path):
    a, b = runs
    same = align("losses", a / "run", b / "run")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "largest relative gap 0.000e+00" in same.stdout
    other = tmp_path / "lr"
    trained(shapes, other, RUN + ["--lr", "0.5"])
    plot = tmp_path / "losses.png"
    proc = align("losses", a / "run", other, "--plot", plot)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the gap first exceeds --rtol 0.01 at step 2" in proc.stdout  # the first step's loss is the same
    assert plot.stat().st_size > 1000
    assert_one_line_error(align("losses", a / "run", other, "--plot", plot), "exists", "--force")
    cfg = align("config", a / "run", other)
    assert cfg.returncode == 1, cfg.stdout + cfg.stderr
    lines = [line for line in cfg.stdout.splitlines() if line.startswith("  ")]
    assert any(" lr " in line and "A 0.1" in line and "B 0.5" in line for line in lines), lines
    assert not [line for line in lines if "sha256" in line or "seed" in line]  # same weights and batches
    ok = align("config", a / "run", b / "run")  # only the worker count differs: not a numerical difference
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "same hyper-parameters, seed, initial weights and first batches" in ok.stdout


def step_losses(run):
    with open(str(run / "step_losses.csv")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "step,loss", lines
    return [(int(s), float(v)) for s, v in (line.split(",") for line in lines[1:])]


@needs_msprobe
def test_align_losses_compares_every_step_whatever_the_print_frequency(shapes, tmp_path):
    """A run records every step's loss (step_losses.csv), read with the meters at print steps: the same
    deterministic run at -p 1 and -p 3 has the same per-step losses, and ``losses`` finds no gap, although the
    printed intervals' means differ (before, ``losses`` compared those and the two "diverged")."""
    p1, p3 = tmp_path / "p1", tmp_path / "p3"
    at = RUN.index("-p")
    trained(shapes, p1, RUN)
    trained(shapes, p3, RUN[:at] + ["-p", "3"] + RUN[at + 2:])
    one, three = step_losses(p1), step_losses(p3)
    assert [s for s, _ in one] == [1, 2, 3] and one == three, (one, three)
    printed = {s: v for r in read_records(str(p1 / "metrics.jsonl")) for s, v in r["step_losses"]}
    assert all(v == pytest.approx(printed[s], rel=1e-6) for s, v in one)  # at -p 1 an interval is one step
    intervals = [v for r in read_records(str(p3 / "metrics.jsonl")) for _, v in r["step_losses"]]
    assert intervals[-1] != pytest.approx(one[-1][1], rel=1e-6)  # at -p 3 the last interval is steps 2 and 3
    proc = align("losses", p1, p3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 common step(s) (1..3); largest relative gap 0.000e+00" in proc.stdout, proc.stdout


@needs_msprobe
def test_precision_dump_user_errors_are_one_line(shapes, runs, tmp_path):
    a, _ = runs
    base = [str(shapes), "--output-dir", str(tmp_path / "o")] + RUN
    assert_one_line_error(run_main(base + ["--precision-dump", str(a / "dump"), "--dump-steps", "2"]),
                          "already holds a dump (step2/)")
    assert_one_line_error(run_main(base + ["--dump-level", "L1"]), "--dump-level needs --precision-dump")
    assert_one_line_error(run_main(base + ["--precision-dump", str(tmp_path / "d"), "--compile"]), "drop --compile")
    seedless = [x for i, x in enumerate(base) if x != "--seed" and (i == 0 or base[i - 1] != "--seed")]
    assert_one_line_error(run_main(seedless), "--deterministic needs --seed")
    assert not os.path.exists(str(tmp_path / "o"))


@ONCE
def test_precision_dump_without_msprobe_names_the_install(shapes, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['msprobe'] = None  # not installed\n")
    proc = run_main([str(shapes), "--output-dir", str(tmp_path / "o"), "--precision-dump", str(tmp_path / "d")] +
                    RUN, env={"PYTHONPATH": os.pathsep.join([str(hide), ROOT])})
    assert_one_line_error(proc, "--precision-dump needs msprobe", "pip install mindstudio-probe==26.2.0")
    assert not os.path.exists(str(tmp_path / "d"))


@ONCE
def test_align_bad_input_is_one_line(tmp_path):
    assert_one_line_error(align("compare", tmp_path / "none", tmp_path), "GOLDEN", "is not a folder")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(align("compare", tmp_path / "empty", tmp_path / "empty"), "holds no msprobe dump")
    assert_one_line_error(align("losses", tmp_path / "empty", tmp_path / "empty"),
                          "has neither step_losses.csv nor metrics.jsonl")
    assert_one_line_error(align("config", tmp_path / "empty", tmp_path / "empty"), "no readable summary.json")


LONG = list(RUN)  # two epochs of 20 steps
LONG[LONG.index("--epochs") + 1], LONG[LONG.index("--max-steps-per-epoch") + 1] = "2", "20"


@needs_msprobe
@pytest.mark.timeout(600)
def test_a_dump_after_a_mid_epoch_resume_is_labelled_with_its_global_step(shapes, tmp_path):
    """Two epochs of 20 steps dumping global step 39: the run stopped by SIGTERM early in epoch 1 and resumed
    (--resume auto, the same command) dumps it into step39/, as the uninterrupted run does, with the same data."""
    args = LONG + ["--dump-steps", "39"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    trained(shapes, whole / "run", args + ["--precision-dump", str(whole / "dump")])
    command = [str(shapes), "--output-dir", str(parts / "run")] + args + ["--precision-dump", str(parts / "dump")]
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py")] + command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    read_lines(proc, lambda lines: re.match(r"Epoch: \[1\]\[\s*2/20\]", lines[-1]), timeout=240)
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc, timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    stop = read_summary(parts / "run")["stopped"]
    assert stop["epoch"] == 1 and 2 <= stop["step"] < 20, stop  # mid-epoch, before the dumped step
    assert not (parts / "dump").exists() or not os.listdir(str(parts / "dump"))
    resumed = run_main(command + ["--resume", "auto"])
    assert resumed.returncode == 0, (resumed.stdout[-2000:], resumed.stderr[-3000:])
    assert "=> continuing epoch 1 at step {} of 20".format(stop["step"]) in resumed.stdout
    for run in (whole, parts):  # the global step's label, after the resume too
        steps = sorted(os.listdir(str(run / "dump"))) if (run / "dump").is_dir() else []
        assert steps == ["step39"], (run, steps)
    dumps = []
    for run in (whole, parts):
        with open(str(run / "dump" / "step39" / "rank0" / "dump.json")) as f:
            dumps.append(json.load(f)["data"])
    assert dumps[0].keys() == dumps[1].keys() and dumps[0] == dumps[1]  # the same step: the same statistics
