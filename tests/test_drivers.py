"""The ModelZoo-style drivers (test/*.sh), env_npu.sh, and the acceptance tool, on CPU; the drivers' NPU runs on the
torch_npu double (tests/fake_npu; a job of several NPU ranks compared with the CPU's: tests/test_npu_jobs.py)."""
import csv
import glob
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import (DOUBLE, ONCE, PY, RANKS, ROOT, SMALL, STACK, WAYS, assert_one_line_error, dataset, finish, gone,
                      read_lines, read_summary, trained)
from modelzoo import acceptance
from trainer.job.ranks import SIGNAL_GRACE
from trainer.device import cpu_slow_bf16, torch_load

pytestmark = ONCE

SCRIPTS = ("train_full_1p.sh", "train_full_8p.sh", "train_performance_1p.sh", "train_performance_8p.sh",
           "train_full_16p.sh", "train_performance_16p.sh", "train_cluster.sh")
# main.py flags for 32-pixel images, after the drivers' "--"
TINY_IMAGES = ["--", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-p", "2"]
CASE_KEYS = ["Network", "RankSize", "BatchSize", "DeviceType", "CaseName", "ActualFPS", "TrainingTime",
             "TrainAccuracy", "ActualLoss", "E2ETrainingTime", "CompileTime"]


def driver_env(extra=None):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")  # python3 = the project's python
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHON", None)
    env.pop("etp_running_flag", None)
    env.pop("ASCEND_DEVICE_ID", None)
    for k in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    if extra:
        env.update(extra)
    return env


def run_driver(script, args, timeout=600, env=None, cwd=None):
    return subprocess.run(["bash", os.path.join(ROOT, "test", script)] + list(args), env=env or driver_env(),
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)


def _sigint_default():
    # a shell that starts with SIGINT ignored (pytest run as a background job) cannot trap it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_driver(script, args):
    return subprocess.Popen(["bash", os.path.join(ROOT, "test", script)] + list(args), env=driver_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def assert_case_log(out_dir, case, network, rank_size, batch, summary):
    path = os.path.join(str(out_dir), case + ".log")
    with open(path) as f:
        lines = f.read().splitlines()
    assert [ln.split(" = ", 1)[0] for ln in lines] == CASE_KEYS, lines
    values = dict(ln.split(" = ", 1) for ln in lines)
    assert values["Network"] == network
    assert values["RankSize"] == str(rank_size)
    assert values["BatchSize"] == str(batch)
    assert values["DeviceType"] == platform.machine() and summary["device"].startswith("cpu")  # ModelZoo: uname -m
    assert values["CaseName"] == case
    # every figure comes from summary.json, formatted
    assert values["ActualFPS"] == "{:.2f}".format(summary["train_fps"])
    assert values["TrainingTime"] == "{:.2f}".format(summary["train_step_time_ms"])
    if summary["final_acc1"] is None:  # performance runs skip validation
        assert values["TrainAccuracy"] == acceptance.MISSING and "perf" in case
    else:
        assert values["TrainAccuracy"] == "{:.3f}".format(summary["final_acc1"])
    assert_loss_values(out_dir, case, values, summary)
    assert values["E2ETrainingTime"] == str(int(round(summary["e2e_seconds"])))
    return values


def assert_loss_values(out_dir, case, values, summary):
    """ActualLoss: the last printed step's loss; CompileTime: the first two steps; train_<case>_loss.txt: the loss
    of every printed step, from metrics.jsonl (the names main.py writes them under)."""
    assert values["ActualLoss"] == "{:.4f}".format(summary["last_loss"])
    assert values["CompileTime"] == "{:.2f}".format(sum(summary["first_steps_seconds"][:2]))
    with open(os.path.join(str(out_dir), "metrics.jsonl")) as f:
        printed = [v for r in map(json.loads, f) for _, v in r.get("step_losses") or ()]
    with open(os.path.join(str(out_dir), "train_{}_loss.txt".format(case))) as f:
        lines = f.read().splitlines()
    assert printed and lines == ["{:.4f}".format(v) for v in printed]
    assert lines[-1] == values["ActualLoss"]


def assert_final_lines(stdout, values):
    assert "Final Performance images/sec : {}\n".format(values["ActualFPS"]) in stdout
    assert "Final Train Accuracy : {}\n".format(values["TrainAccuracy"]) in stdout
    assert "E2E Training Duration sec : {}\n".format(values["E2ETrainingTime"]) in stdout


def pids_of(stdout_lines):
    return [int(m.group(1)) for m in (re.search(r"\bpid (\d+)", ln) for ln in stdout_lines) if m]


def wait_for_ranks(proc, n, timeout=120):
    """Read the driver's stdout (time-limited) until it printed n rank pids."""
    return pids_of(read_lines(proc, lambda lines: len(pids_of(lines)) >= n, timeout))


@pytest.fixture(scope="module")
def imagenet_small(tmp_path_factory):
    return dataset(tmp_path_factory, "imagenet", 4, 8, 4, seed=3)


@pytest.fixture(scope="module")
def tiny_small(tmp_path_factory):
    return dataset(tmp_path_factory, "tiny-imagenet-200", 4, 8, 4, seed=4, layout="tiny-imagenet")


# ---------------------------------------------------------------- runs


def test_full_1p_imagenet_layout_moves_an_earlier_run_aside(imagenet_small, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier run\n")
    proc = run_driver("train_full_1p.sh", ["--data_path=" + imagenet_small, "--arch=tiny_cnn", "--device=cpu",
                                           "--batch_size=8", "--epochs=1", "--workers=0",
                                           "--output_dir=" + str(out)] + TINY_IMAGES)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    moved = glob.glob(str(out) + ".prev-*")
    assert len(moved) == 1 and open(os.path.join(moved[0], "earlier.txt")).read() == "an earlier run\n"
    assert "moved to {}".format(moved[0]) in proc.stdout
    assert proc.stdout.startswith("env_npu.sh: ")  # sourced first
    assert "no recipe tiny_cnn_1p" in proc.stdout
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["world_size"] == 1 and s["global_batch_size"] == 8
    assert s["data_layout"] == "imagenet" and s["recipe"] is None
    assert s["amp"]["enabled"] is False  # no recipe: main.py's default precision (fp32)
    assert s["config"]["lr"] == 0.1 and s["config"]["workers"] == 0  # main.py default lr, given workers
    values = assert_case_log(out, "tiny_cnn_bs8_1p_acc", "tiny_cnn", 1, 8, s)
    assert_final_lines(proc.stdout, values)
    log = (out / "train_0.log").read_text()
    assert "Epoch: [0][" in log and " *   Acc@1 " in log  # pytorch/examples line formats
    assert sorted(os.listdir(str(out))) == sorted(["checkpoint.pth.tar", "model_best.pth.tar", "summary.json",
                                                   "metrics.jsonl", "step_losses.csv", "tensorboard", "train_0.log",
                                                   "tiny_cnn_bs8_1p_acc.log",
                                                   "train_tiny_cnn_bs8_1p_acc_loss.txt"])  # run.lock released

    # --resume=auto continues in the same folder: nothing moved, the log appended
    proc = run_driver("train_full_1p.sh", ["--data_path=" + imagenet_small, "--arch=tiny_cnn", "--device=cpu",
                                           "--batch_size=8", "--epochs=2", "--workers=0", "--resume=auto",
                                           "--output_dir=" + str(out)] + TINY_IMAGES)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "continuing the run in {}".format(out) in proc.stdout
    assert len(glob.glob(str(out) + ".prev-*")) == 1
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["epochs_completed"] == 2
    log = (out / "train_0.log").read_text()
    assert "Epoch: [0][" in log and "Epoch: [1][" in log and "=> resumed" in log
    assert_case_log(out, "tiny_cnn_bs8_1p_acc", "tiny_cnn", 1, 8, s)


@RANKS
def test_full_8p_two_ranks_tiny_imagenet_layout(tiny_small, tmp_path):
    out = tmp_path / "run8"
    proc = run_driver("train_full_8p.sh", ["--data_path=" + tiny_small, "--arch=tiny_cnn", "--device=cpu",
                                           "--rank_size=2", "--batch_size=8", "--epochs=1", "--workers=0",
                                           "--precision=O1", "--output_dir=" + str(out)] + TINY_IMAGES,
                      env=driver_env({"etp_running_flag": "true"}))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "env_npu.sh" not in proc.stdout  # the platform set the environment up
    assert "rank 0: pid" in proc.stdout and "rank 1: pid" in proc.stdout
    assert (out / "train_0.log").exists() and (out / "train_1.log").exists()
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["world_size"] == 2 and s["per_device_batch_size"] == 4
    assert s["data_layout"] == "tiny-imagenet" and s["val_images"] == 16
    assert s["config"]["device_list"] == [0, 1]
    # O1 on CPU is --amp: where the CPU has native bfloat16, the faster of bfloat16 and float32 as rank 0
    # measured it (both ranks trained in it), float32 (with a note) elsewhere
    assert s["config"]["amp"] is True and s["config"]["opt_level"] == "O1"
    assert s["amp"]["dtype"] == ("float32" if cpu_slow_bf16() else s["amp"]["probe"]["choice"])
    values = assert_case_log(out, "tiny_cnn_bs8_2p_acc", "tiny_cnn", 2, 8, s)
    assert_final_lines(proc.stdout, values)


def test_performance_1p_recipe_mapping_and_failed_baseline(imagenet_small, tmp_path):
    baseline = tmp_path / "baseline.csv"
    with open(str(baseline), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", "rank_size", "acc1", "fps", "source"])
        w.writerow(["shufflenet_v2_x1_0", "1", "", "1000000", "a figure no CPU reaches"])
    out = tmp_path / "perf"
    proc = run_driver("train_performance_1p.sh", ["--data_path=" + imagenet_small, "--arch=shufflenet_v2_x1_0",
                                                  "--device=cpu", "--batch_size=8", "--steps=2", "--workers=0",
                                                  "--baseline=" + str(baseline), "--output_dir=" + str(out)]
                      + TINY_IMAGES)
    assert proc.returncode == 3, (proc.stdout[-3000:], proc.stderr[-3000:])
    s = read_json(out / "summary.json")
    assert s["status"] == "ok"
    assert s["arch"] == "shufflenet_v2_x1_0_npu" and s["recipe"] == "shufflenet_v2_x1_0_1p"
    assert s["epochs"] == 1 and s["steps_per_epoch"] == 2  # bounded run
    cfg = s["config"]
    assert cfg["momentum"] == 0.0 and cfg["weight_decay"] == 3.0517578125e-05 and cfg["loss_scale"] == 64.0
    assert cfg["lr"] == pytest.approx(0.75 * 8 / 1536)  # recipe lr scaled to the batch given
    assert s["config"]["amp"] is True and s["config"]["opt_level"] == "O2"  # the recipe's O2 -> --amp
    # on a CPU with native bfloat16 the probe measured which dtype trains (docs/PRECISION.md); elsewhere float32
    assert s["amp"]["enabled"] is (not cpu_slow_bf16() and s["amp"]["probe"]["choice"] == "bfloat16")
    values = assert_case_log(out, "shufflenet_v2_x1_0_bs8_1p_perf", "shufflenet_v2_x1_0", 1, 8, s)
    assert_final_lines(proc.stdout, values)
    assert "acceptance: FAIL FPS {} vs baseline 1000000.00: needs >= 900000.00 (90% of the baseline)".format(
        values["ActualFPS"]) in proc.stdout
    assert "acceptance: FAIL: fps" in proc.stdout


# ---------------------------------------------------------------- failures and interruption


def start_8p_two_ranks(data, out, epochs, extra=()):
    """train_full_8p.sh with two tiny_cnn ranks on the CPU, for ``epochs`` epochs (running: Popen)."""
    return start_driver("train_full_8p.sh", ["--data_path=" + data, "--arch=tiny_cnn", "--device=cpu",
                                             "--rank_size=2", "--batch_size=8", "--epochs={}".format(epochs),
                                             "--workers=0", "--output_dir=" + str(out)] + TINY_IMAGES + list(extra))


@STACK
@RANKS
def test_8p_rank_killed_stops_the_others_and_names_it(imagenet_small, tmp_path):
    out = tmp_path / "killed"
    proc = start_8p_two_ranks(imagenet_small, out, 200, ["--dist-timeout", "60"])
    try:
        pids = wait_for_ranks(proc, 2)
        os.kill(pids[1], signal.SIGKILL)  # rank 1 dies, as under the OOM killer
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (stdout[-2000:], stderr[-2000:])
    err = stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: rank 1 (pid {}) was killed by signal 9".format(pids[1])), err
    assert "the other ranks were stopped" in err and err.endswith("log: {}".format(out / "train_1.log"))
    assert all(gone(p) for p in pids)
    assert not glob.glob(str(out / "*_acc.log"))  # no CaseName log for a failed run


def test_rank_usage_error_exits_2_with_its_message(imagenet_small, tmp_path):
    out = tmp_path / "usage"
    proc = run_driver("train_full_1p.sh", ["--data_path=" + imagenet_small, "--arch=tiny_cnn", "--device=cpu",
                                           "--output_dir=" + str(out), "--", "--no-such-flag"])
    assert_one_line_error(proc, "error: the run (pid ", "failed with exit code 2",
                       "unrecognized arguments: --no-such-flag", "log: {}".format(out / "train_0.log"))


@STACK
@RANKS
def test_ctrl_c_stops_every_rank(imagenet_small, tmp_path):
    out = tmp_path / "interrupted"
    proc = start_8p_two_ranks(imagenet_small, out, 200)
    try:
        pids = wait_for_ranks(proc, 2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        # the ranks stop at once or at an agreed step; the driver kills one that does not after SIGNAL_GRACE (and
        # then says so): a wait past that, on a loaded machine, fails with the driver's stacks (finish)
        stdout, stderr = finish(proc, timeout=SIGNAL_GRACE + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout[-2000:], stderr[-2000:])
    assert "interrupted by SIGINT: " in stderr and "checkpoints in" not in stderr, stderr[-2000:]
    assert all(gone(p) for p in pids)


@STACK
@RANKS
def test_ranks_end_with_their_killed_driver(imagenet_small, tmp_path):
    out = tmp_path / "driver_killed"
    proc = start_8p_two_ranks(imagenet_small, out, 100000)  # still training when the driver is killed
    pids = []
    try:
        pids = wait_for_ranks(proc, 2)
        proc.kill()  # SIGKILL: the driver cannot stop its ranks itself (each leads a process group of its own)
        proc.wait(timeout=30)
        assert all(gone(p, within=30) for p in pids), "ranks went on training without their driver"
    finally:
        for p in pids:
            try:
                os.killpg(p, signal.SIGKILL)
            except OSError:
                pass


# ---------------------------------------------------------------- on the NPU: the torch_npu double


def call_log(path):
    with open(str(path)) as f:
        return [json.loads(line) for line in f]


def fake_npu_env(calls):
    return driver_env({"PYTHONPATH": os.path.join(ROOT, "tests", "fake_npu"), "FAKE_NPU_DEVICE_COUNT": "8",
                       "FAKE_NPU_CALL_LOG": str(calls)})


@STACK
@DOUBLE
def test_npu_1p_uses_device_id_and_apex_at_the_recipe_level(npu_double, imagenet_small, tmp_path):
    """auto finds the NPU and apex: the recipe's O2 becomes apex O2, --device_id becomes --gpu; the run trains on
    that device to the end. (resnet50 at 32 px in float16: its first gradients overflow at the recipe's loss scale
    1024, as they would on an NPU, and those steps are skipped.)"""
    calls = tmp_path / "calls.jsonl"
    out = tmp_path / "o"
    proc = run_driver("train_performance_1p.sh", ["--data_path=" + imagenet_small, "--device_id=3", "--batch_size=8",
                                                  "--steps=1", "--workers=0", "--output_dir=" + str(out)]
                      + TINY_IMAGES, env=fake_npu_env(calls))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    command = [ln for ln in proc.stdout.splitlines() if ln.startswith("command: ")]
    assert len(command) == 1, proc.stdout + proc.stderr
    for part in ("-a resnet50 -b 8 ", "--device auto ", "--recipe resnet50_1p ", "--max-steps-per-epoch 1 ",
                 "--amp --amp-impl apex --opt-level O2 ", "--gpu 3 "):
        assert part in command[0], (part, command[0])
    pid = pids_of(proc.stdout.splitlines())[0]
    assert [c["call"] for c in call_log(calls) if c["pid"] == pid][0] == ["set_device", "npu:3"]
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["device"] == "npu:3" and s["steps_per_epoch"] == 1
    assert (s["amp"]["impl"], s["amp"]["opt_level"], s["amp"]["dtype"]) == ("apex", "O2", "float16")
    assert os.path.isfile(str(out / "resnet50_bs8_1p_perf.log"))


@STACK
@DOUBLE
@RANKS
def test_npu_8p_device_list_maps_ranks_to_devices(npu_double, imagenet_small, tmp_path):
    """--device_list=2,5: rank 0 on npu:2, rank 1 on npu:5, and the job trains with apex O1 to the end."""
    calls = tmp_path / "calls.jsonl"
    out = tmp_path / "o"
    proc = run_driver("train_full_8p.sh", ["--data_path=" + imagenet_small, "--arch=tiny_cnn", "--device=npu",
                                           "--device_list=2,5", "--batch_size=8", "--epochs=1", "--workers=0",
                                           "--precision=O1", "--output_dir=" + str(out)] + TINY_IMAGES,
                      env=fake_npu_env(calls))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "2 processes on npu devices 2,5" in proc.stdout, proc.stdout + proc.stderr
    assert "--amp --amp-impl apex --opt-level O1 " in proc.stdout
    pids = pids_of(proc.stdout.splitlines())
    first = {}
    for c in call_log(calls):
        first.setdefault(c["pid"], c["call"])
    assert [first[p] for p in pids] == [["set_device", "npu:2"], ["set_device", "npu:5"]]
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["device"] == "npu:2" and s["world_size"] == 2
    assert (s["amp"]["impl"], s["amp"]["opt_level"]) == ("apex", "O1")
    assert "[rank 1] => tiny_cnn on npu:5 |" in (out / "train_1.log").read_text()
    assert "Final Train Accuracy : {:.3f}\n".format(s["final_acc1"]) in proc.stdout


# ---------------------------------------------------------------- arguments


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    (d / "train").mkdir()
    (d / "val").mkdir()
    return str(d)


BAD = [
    ("train_full_1p.sh", ["--foo=1"], "unknown argument '--foo' for train_full_1p.sh"),
    ("train_full_1p.sh", ["--foo"], "unknown argument '--foo'"),
    ("train_full_1p.sh", [], "--data_path=DIR is required"),
    ("train_full_1p.sh", ["--data_path"], "--data_path needs a value"),
    ("train_full_1p.sh", ["--data_path="], "--data_path needs a value"),
    ("train_full_1p.sh", ["--data_path=/no/such/folder"], "is not a folder"),
    ("train_full_1p.sh", ["--dummy", "DATA"], "--dummy, not both"),
    ("train_full_1p.sh", ["DATA", "--rank_size=2"], "--rank_size is for the 8p, 16p and cluster scripts"),
    ("train_full_1p.sh", ["DATA", "--epochs=x"], "--epochs must be a whole number"),
    ("train_full_1p.sh", ["DATA", "--lr=fast"], "--lr must be a non-negative number"),
    ("train_full_1p.sh", ["DATA", "--device=tpu"], "--device must be auto, npu, cuda or cpu"),
    ("train_full_1p.sh", ["DATA", "--precision=O3"], "--precision must be O2, O1 or fp32"),
    ("train_full_1p.sh", ["DATA", "--resume=/no/such/file"], "--resume '/no/such/file' is not a file"),
    ("train_full_1p.sh", ["DATA", "--fps_ratio=0.5"], "add --baseline"),
    ("train_full_1p.sh", ["DATA", "--arch=tiny_cnn", "--baseline=published"], "no baseline for tiny_cnn at 1p"),
    ("train_full_1p.sh", ["DATA", "--baseline=/no/such.json"], "baseline file '/no/such.json' does not exist"),
    ("train_full_1p.sh", ["DATA", "--", "-b", "4"], "sets -b itself"),
    ("train_full_1p.sh", ["DATA", "--", "--batch", "4"], "sets --batch-size itself"),
    ("train_full_1p.sh", ["DATA", "--", "--output-dir=/tmp/x"], "sets --output-dir itself"),
    ("train_full_1p.sh", ["DATA", "--steps=3"], "--steps is for the performance scripts"),
    ("train_full_8p.sh", ["DATA", "--rank_size=3", "--batch_size=64"], "does not divide over 3 ranks"),
    ("train_full_8p.sh", ["DATA", "--rank_size=0"], "--rank_size must be at least 1"),
    ("train_full_8p.sh", ["DATA", "--rank_size=2", "--device_list=0-2"], "names 3 device(s)"),
    ("train_full_8p.sh", ["DATA", "--device_list=0,0"], "names device 0 twice"),
    ("train_full_8p.sh", ["DATA", "--device_list=3-1"], "runs backwards"),
    ("train_full_8p.sh", ["DATA", "--rank_size=2", "--", "--port", "0"], "the ranks need one fixed port"),
    ("train_full_8p.sh", ["DATA", "--arch=resnet50", "--rank_size=2", "--baseline=published"],
     "no baseline for resnet50 at 2p"),
    ("train_performance_1p.sh", ["DATA", "--steps=0"], "--steps must be at least 1"),
    ("train_performance_1p.sh", ["DATA", "--", "--max-steps-per-epoch", "3"], "use --steps=N"),
    ("train_performance_8p.sh", ["DATA", "--rank_size=2", "--batch_size=5"], "does not divide over 2 ranks"),
]


@pytest.mark.parametrize("script,args,fragment", BAD, ids=["{}:{}".format(s, " ".join(a)) for s, a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(script, args, fragment, data_dir, tmp_path):
    out = tmp_path / "out"
    args = ["--data_path=" + data_dir if a == "DATA" else a for a in args]
    if "--" in args:
        i = args.index("--")
        args = args[:i] + ["--output_dir=" + str(out)] + args[i:]
    else:
        args = args + ["--output_dir=" + str(out)]
    proc = run_driver(script, args, timeout=120)
    assert_one_line_error(proc, fragment)
    assert not out.exists()


def test_output_dir_that_holds_the_project_is_refused_and_kept(data_dir):
    proc = run_driver("train_full_1p.sh", ["--data_path=" + data_dir, "--output_dir=" + ROOT], timeout=120)
    assert_one_line_error(proc, "cannot be moved aside")
    assert os.path.isfile(os.path.join(ROOT, "main.py")) and not glob.glob(ROOT + ".prev-*")
    assert not os.path.exists(os.path.join(ROOT, "train_0.log"))


def test_missing_device_is_refused_before_anything_starts(data_dir, tmp_path):
    spec = importlib.util.find_spec("torch_npu")
    if spec is not None and "fake_npu" not in str(spec.origin):
        pytest.skip("torch_npu is installed")
    out = tmp_path / "out"
    proc = run_driver("train_full_1p.sh", ["--data_path=" + data_dir, "--device=npu", "--output_dir=" + str(out)],
                      timeout=120)
    assert_one_line_error(proc, "torch_npu is not installed")
    assert not out.exists()


def test_output_dir_that_is_a_file_is_refused(data_dir, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_driver("train_full_1p.sh", ["--data_path=" + data_dir, "--output_dir=" + str(f)], timeout=120)
    assert_one_line_error(proc, "is a file, not a folder")
    assert f.read_text() == "x"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    proc = run_driver(script, ["--help"], timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: bash test/{} --data_path=DIR".format(script))
    assert "--precision=P" in proc.stdout and "--baseline=TABLE" in proc.stdout
    assert "--precision_mode=M" in proc.stdout and "--hf32 | --fp32" in proc.stdout
    assert ("--master_addr=IP" in proc.stdout) == ("16p" in script or "cluster" in script)


def test_shellcheck_passes():
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is not installed (tools/install_system_deps.sh installs it)"
    files = ["env_npu.sh"] + ["test/" + s for s in SCRIPTS] + ["test/common.sh", "test/env_npu.sh"]
    proc = subprocess.run([exe, "-x"] + files, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- env_npu.sh


def source_twice(extra_env=None, before=""):
    script = ("set -euo pipefail\n{}\nsource ./env_npu.sh\nsource ./env_npu.sh\n"
              "echo \"ALIVE $TASK_QUEUE_ENABLE $HCCL_CONNECT_TIMEOUT $HCCL_EXEC_TIMEOUT $ASCEND_GLOBAL_LOG_LEVEL\"\n"
              "echo \"LD=${{LD_LIBRARY_PATH:-}}\"\necho \"FAKE=${{FAKE_CANN_SOURCED:-0}}\"\n"
              "case $- in *e*u*|*u*e*) echo STRICT ;; esac\n").format(before)
    env = driver_env(extra_env)
    env.pop("LD_LIBRARY_PATH", None)
    for k in ("CANN_INSTALL_PATH", "ASCEND_CANN_INSTALL_INFO", "FAKE_CANN_SOURCED", "_ENV_NPU_SET_ENV",
              "ASCEND_SLOG_PRINT_TO_STDOUT", "ASCEND_GLOBAL_LOG_LEVEL", "ASCEND_GLOBAL_EVENT_ENABLE",
              "TASK_QUEUE_ENABLE", "COMBINED_ENABLE", "HCCL_WHITELIST_DISABLE", "HCCL_CONNECT_TIMEOUT",
              "HCCL_EXEC_TIMEOUT"):
        if not extra_env or k not in extra_env:
            env.pop(k, None)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_env_npu_without_cann_is_one_line_and_harmless():
    if any(os.path.exists(p) for p in ("/etc/Ascend/ascend_cann_install.info", "/usr/local/Ascend", "/opt/Ascend")):
        pytest.skip("this machine has CANN")
    proc = source_twice(before="export HCCL_EXEC_TIMEOUT=77")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("env_npu.sh: no CANN found") and lines[1] == lines[0]  # one line per sourcing
    assert lines[2] == "ALIVE 1 1200 77 3"  # defaults set, a value already set kept
    assert lines[3] == "LD=" and lines[4] == "FAKE=0" and lines[5] == "STRICT"


def fake_cann(root, product):
    os.makedirs(os.path.join(root, product, "latest"))
    with open(os.path.join(root, product, "set_env.sh"), "w") as f:
        # like a vendor script: not written for set -eu
        f.write('export FAKE_CANN_SOURCED=$(( ${FAKE_CANN_SOURCED:-0} + 1 ))\n'
                'echo "$SOME_UNSET_VARIABLE" >/dev/null\nfalse\n')


@pytest.mark.parametrize("product", ["ascend-toolkit", "nnae"])
def test_env_npu_sources_cann_once_under_set_eu(tmp_path, product):
    root = str(tmp_path / "Ascend")
    fake_cann(root, product)
    info = tmp_path / "ascend_cann_install.info"
    info.write_text("Install_Path={}\r\n".format(root))
    proc = source_twice({"ASCEND_CANN_INSTALL_INFO": str(info)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expected = "env_npu.sh: CANN at {} ({}/{}/set_env.sh sourced)".format(root, root, product)
    assert lines[:2] == [expected, expected]
    assert lines[2] == "ALIVE 1 1200 1800 3"
    ld = lines[3][len("LD="):].split(":")
    torch_lib = [p for p in ld if p.endswith(os.path.join("torch", "lib"))]
    assert len(torch_lib) == 1 and os.path.isdir(torch_lib[0])  # from the running python, added once
    assert lines[4] == "FAKE=1" and lines[5] == "STRICT"  # sourced once; set -eu restored


def test_env_npu_info_file_without_toolkit_says_so(tmp_path):
    info = tmp_path / "ascend_cann_install.info"
    info.write_text("Install_Path={}\n".format(tmp_path / "empty"))
    proc = source_twice({"ASCEND_CANN_INSTALL_INFO": str(info)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == ("env_npu.sh: no CANN found ({} has no ascend-toolkit/latest or "
                                           "nnae/latest with a set_env.sh): NPU runtime settings exported, "
                                           "nothing sourced".format(tmp_path / "empty"))


# ---------------------------------------------------------------- modelzoo/acceptance.py (and tools/acceptance.py)


def summary(**kw):
    s = {"status": "ok", "error": None, "device": "npu:0", "train_fps": 12000.0, "train_step_time_ms": 343.9,
         "final_acc1": 76.2, "final_loss": 1.91234, "last_loss": 1.70111, "first_steps_seconds": [41.5, 0.36],
         "e2e_seconds": 3600.4}
    s.update(kw)
    return s


def check(summary_dict, arch="resnet50", rank_size=8, mode="acc", table="published-2023", acc_tolerance=None,
          fps_ratio=None, **kw):
    out = io.StringIO()
    rc = acceptance.run_check(summary_dict, table, arch, rank_size, mode, (acc_tolerance, fps_ratio), out=out, **kw)
    return rc, out.getvalue()


def test_acceptance_pass_against_published_resnet50_8p():
    rc, text = check(summary())
    assert rc == 0, text
    assert "acceptance: PASS Acc@1 76.200 vs baseline 76.630: needs >= 75.630 (tolerance 1 point(s) below)" in text
    assert "acceptance: PASS FPS 12000.00 vs baseline 11910.00: needs >= 10719.00 (90% of the baseline)" in text
    assert text.splitlines()[-1].startswith("acceptance: PASS (resnet50 8p, accuracy run")


def test_acceptance_fail_accuracy_and_fps_exit_3():
    rc, text = check(summary(final_acc1=75.5, train_fps=10000.0))
    assert rc == 3
    assert "acceptance: FAIL Acc@1 75.500" in text and "acceptance: FAIL FPS 10000.00" in text
    assert text.splitlines()[-1].startswith("acceptance: FAIL: acc1, fps")


def test_acceptance_boundaries_and_overridden_tolerances():
    assert check(summary(final_acc1=75.63, train_fps=10719.0))[0] == 0  # exactly at the floors
    assert check(summary(final_acc1=75.0))[0] == 3
    rc, text = check(summary(final_acc1=75.0, train_fps=10200.0), acc_tolerance="2", fps_ratio="0.85")
    assert rc == 0 and "tolerance 2 point(s) below" in text and "85% of the baseline" in text


def test_acceptance_performance_run_checks_fps_only():
    rc, text = check(summary(final_acc1=1.0, train_fps=1600.0), rank_size=1, mode="perf")
    assert rc == 0 and "SKIP Acc@1: not checked on a performance run" in text  # 1600 >= 0.9 x 1680
    assert check(summary(train_fps=1500.0), rank_size=1, mode="perf")[0] == 3
    # 1p ResNet50 has no published accuracy: an accuracy run checks FPS and says why Acc@1 is skipped
    rc, text = check(summary(train_fps=1700.0), rank_size=1, mode="acc")
    assert rc == 0 and "SKIP Acc@1: the baseline has no accuracy figure" in text


def test_acceptance_npu_variant_uses_the_published_shufflenet_numbers():
    rc, text = check(summary(final_acc1=64.5, train_fps=16000.0), arch="shufflenet_v2_x1_0_npu")
    assert rc == 0 and "vs baseline 65.158" in text


def test_acceptance_missing_value_fails():
    rc, text = check(summary(train_fps=None))
    assert rc == 3 and "FAIL FPS n/a" in text


def test_published_2023_table_matches_the_readmes_of_2023():
    entries, tol, path = acceptance.load_baselines("published-2023")
    assert tol == {"acc_tolerance": 1.0, "fps_ratio": 0.9} and path.endswith("published_2023.json")
    table = {(e["arch"], e["rank_size"]): e for e in entries}
    assert table[("resnet50", 1)]["fps"] == 1680 and table[("resnet50", 1)]["acc1"] is None
    assert table[("resnet50", 8)]["acc1"] == 76.63 and table[("resnet50", 8)]["fps"] == 11910
    assert 65.1 <= table[("shufflenet_v2_x1_0", 8)]["acc1"] <= 66.3
    assert table[("shufflenet_v2_x1_0", 1)]["acc1"] == 68.5
    assert all("ModelZoo-PyTorch PyTorch/built-in/cv/classification/" in e["source"] for e in entries)


def test_published_table_is_todays_with_source_and_date():
    entries, tol, path = acceptance.load_baselines("published")
    assert tol == {"acc_tolerance": 1.0, "fps_ratio": 0.9} and path.endswith(os.path.join("baselines",
                                                                                          "published.json"))
    with open(path) as f:
        raw = json.load(f)["baselines"]
    assert all(re.fullmatch(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}", r["date"]) and r["source"].startswith("PyTorch/")
               for r in raw)

    def entry(arch, ranks, precision=None):
        return acceptance.find_baseline(entries, arch, ranks, path, precision)
    assert (entry("resnet50", 1)["acc1"], entry("resnet50", 1)["fps"]) == (None, 1678)
    assert (entry("resnet50", 8)["acc1"], entry("resnet50", 8)["fps"]) == (76.3, 14371)  # 2025-05 figure
    assert next(r for r in raw if r["arch"] == "resnet50" and r["rank_size"] == 8)["fps_history"][
        "table 3, 8p-NPU torch 2.1 (since 2024-08-23)"] == 13255
    assert (entry("resnet50", 16)["acc1"], entry("resnet50", 16)["fps"]) == (76.69, 30000)
    # ShuffleNetV2: the frozen O2 entry first (the recipe's settings), the maintained FP32 one for fp32 runs
    assert (entry("shufflenet_v2_x1_0_npu", 8)["acc1"], entry("shufflenet_v2_x1_0", 8, "O2")["fps"]) == (
        65.158, 17420.493)
    fp32 = entry("shufflenet_v2_x1_0", 8, "fp32")
    assert (fp32["acc1"], fp32["fps"]) == (62.714, 14524.82) and "ShuffleNetV2_iflytek_for_Pytorch" in fp32["source"]
    assert entry("shufflenet_v2_x1_0", 1, "fp32")["fps"] == 2081.3


def test_acceptance_against_todays_table_and_a_precision_pick():
    rc, text = check(summary(final_acc1=75.5, train_fps=13000.0), table="published")
    assert rc == 0 and "vs baseline 76.300" in text and "vs baseline 14371.00: needs >= 12933.90" in text, text
    rc, text = check(summary(final_acc1=62.0, train_fps=13100.0), arch="shufflenet_v2_x1_0", table="published",
                     precision="fp32")
    assert rc == 0 and "vs baseline 62.714" in text and "ShuffleNetV2_iflytek" in text, text
    rc, text = check(summary(final_acc1=62.0, train_fps=13100.0), arch="shufflenet_v2_x1_0", table="published")
    assert rc == 3 and "vs baseline 65.158" in text  # O2 runs: the frozen entry


def test_recipes_cite_their_published_scripts():
    with open(os.path.join(ROOT, "trainer", "recipes.json")) as f:
        recipes = {k: v for k, v in json.load(f).items() if k.endswith(("_1p", "_8p"))}  # ModelZoo's (the drivers')
    assert set(recipes) == {"resnet50_1p", "resnet50_8p", "shufflenet_v2_x1_0_1p", "shufflenet_v2_x1_0_8p"}
    for name, r in recipes.items():
        assert r["source"].startswith("published: PyTorch/built-in/cv/classification/"), name
        assert "test/train_full_{}.sh".format(name[-2:]) in r["source"], name
        assert r["batch_size"] % r["rank_size"] == 0
    assert (recipes["resnet50_8p"]["batch_size"], recipes["resnet50_8p"]["lr"]) == (4096, 1.6)
    assert (recipes["resnet50_1p"]["batch_size"], recipes["resnet50_1p"]["lr"]) == (512, 0.2)
    assert (recipes["shufflenet_v2_x1_0_8p"]["batch_size"], recipes["shufflenet_v2_x1_0_8p"]["lr"]) == (8192, 4.0)
    assert (recipes["shufflenet_v2_x1_0_1p"]["batch_size"], recipes["shufflenet_v2_x1_0_1p"]["lr"]) == (1536, 0.75)


def test_case_log_written_from_a_summary(tmp_path):
    values = acceptance.case_values(summary(), "resnet50", 8, 4096, "acc")
    path = acceptance.write_case_log(str(tmp_path), values)
    assert os.path.basename(path) == "resnet50_bs4096_8p_acc.log"
    assert open(path).read() == ("Network = resnet50\nRankSize = 8\nBatchSize = 4096\nDeviceType = {}\n"
                                 "CaseName = resnet50_bs4096_8p_acc\nActualFPS = 12000.00\nTrainingTime = 343.90\n"
                                 "TrainAccuracy = 76.200\nActualLoss = 1.7011\nE2ETrainingTime = 3600\n"
                                 "CompileTime = 41.86\n".format(platform.machine()))
    assert acceptance.final_lines(values)[1:] == ["Final Performance images/sec : 12000.00",
                                                  "Final Train Accuracy : 76.200",
                                                  "E2E Training Duration sec : 3600"]


def write_summary(tmp_path, **kw):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary(**kw)))
    return str(path)


def cli(args):
    return subprocess.run([PY, os.path.join(ROOT, "tools", "acceptance.py")] + args, capture_output=True, text=True,
                          timeout=60)


def test_acceptance_cli_check_and_report(tmp_path):
    s = write_summary(tmp_path, train_fps=9000.0)
    proc = cli(["check", "--summary", s, "--baseline", "published", "--arch", "resnet50", "--rank-size", "8",
                "--mode", "acc"])
    assert proc.returncode == 3 and "acceptance: FAIL: fps" in proc.stdout, proc.stdout + proc.stderr
    proc = cli(["report", "--summary", s, "--network", "resnet50", "--rank-size", "8", "--batch-size", "4096",
                "--mode", "perf", "--baseline", "published", "--fps-ratio", "0.6"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "resnet50_bs4096_8p_perf.log").exists()
    assert "Final Performance images/sec : 9000.00" in proc.stdout and "acceptance: PASS" in proc.stdout


def test_acceptance_check_reads_the_run_from_its_summary_and_flags_override_it(shapes, tmp_path):
    """`check --summary S --baseline TABLE` typed alone: the arch, rank size, mode and precision are the run's, as
    its summary.json holds them; each flag given wins; a summary that does not say one is one line naming the
    flag."""
    trained(shapes, tmp_path / "run", ["-a", "tiny_cnn", "--epochs", "1", "--max-steps-per-epoch", "2", "-b", "16",
                                       "--device", "cpu"] + SMALL)
    s = str(tmp_path / "run" / "summary.json")
    table = tmp_path / "table.csv"
    table.write_text("arch,rank_size,acc1,fps,precision,source\ntiny_cnn,1,0.01,0.01,O2,the O2 entry\n"
                     "tiny_cnn,1,0.01,0.01,fp32,the fp32 entry\ntiny_cnn,2,100,0.01,fp32,two ranks\n")
    proc = cli(["check", "--summary", s, "--baseline", str(table)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS Acc@1" in proc.stdout and "[the fp32 entry]" in proc.stdout  # no --amp: the fp32 entry
    assert proc.stdout.splitlines()[-1].startswith("acceptance: PASS (tiny_cnn 1p, accuracy run")
    proc = cli(["check", "--summary", s, "--baseline", str(table), "--rank-size", "2"])
    assert proc.returncode == 3 and "vs baseline 100.000" in proc.stdout and "(tiny_cnn 2p," in proc.stdout
    proc = cli(["check", "--summary", s, "--baseline", str(table), "--mode", "perf", "--precision", "O2"])
    assert proc.returncode == 0 and "SKIP Acc@1: not checked on a performance run" in proc.stdout
    assert "[the O2 entry]" in proc.stdout and "performance run" in proc.stdout.splitlines()[-1]
    data = read_summary(tmp_path / "run")
    data["config"]["validate"] = False  # a performance script's run (--no-validate): a performance run
    del data["world_size"]
    (tmp_path / "perf.json").write_text(json.dumps(data))
    proc = cli(["check", "--summary", str(tmp_path / "perf.json"), "--baseline", str(table)])
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("error: ") and "does not say the run's rank size" in proc.stderr
    assert "give --rank-size" in proc.stderr
    proc = cli(["check", "--summary", str(tmp_path / "perf.json"), "--baseline", str(table), "--rank-size", "1"])
    assert proc.returncode == 0 and "SKIP Acc@1: not checked on a performance run" in proc.stdout


def test_acceptance_csv_and_json_list_tables(tmp_path):
    csv_path = tmp_path / "b.csv"
    csv_path.write_text("arch,rank_size,acc1,fps,source\nresnet50,8,80.0,,mine\n")
    out = io.StringIO()
    assert acceptance.run_check(summary(), str(csv_path), "resnet50", 8, "acc", out=out) == 3
    assert "FAIL Acc@1 76.200 vs baseline 80.000" in out.getvalue() and "SKIP FPS" in out.getvalue()
    json_path = tmp_path / "b.json"
    json_path.write_text(json.dumps([{"arch": "tiny_cnn", "rank_size": 2, "acc1": 10, "fps": 1}]))
    assert acceptance.run_check(summary(), str(json_path), "tiny_cnn", 2, "acc", out=io.StringIO()) == 0


@pytest.mark.parametrize("args,code,fragment", [
    (["check", "--summary", "S", "--baseline", "published", "--arch", "tiny_cnn", "--rank-size", "1", "--mode",
      "acc"], 2, "no baseline for tiny_cnn at 1p"),
    (["check", "--summary", "MISSING", "--baseline", "published", "--arch", "resnet50", "--rank-size", "8",
      "--mode", "acc"], 2, "no summary at"),
    (["check", "--summary", "FAILED", "--baseline", "published", "--arch", "resnet50", "--rank-size", "8",
      "--mode", "acc"], 1, "the run did not finish"),
    (["check", "--summary", "S", "--baseline", "published", "--arch", "resnet50", "--rank-size", "8", "--mode",
      "acc", "--fps-ratio", "-1"], 2, "FPS ratio must be above 0"),
    (["baseline", "--baseline", "BADTABLE", "--arch", "resnet50", "--rank-size", "8", "--mode", "acc"], 2,
     "rank_size 'eight' is not a whole number"),
    (["baseline", "--baseline", "published", "--arch", "resnet50", "--rank-size", "1", "--mode", "acc"], 0, ""),
])
def test_acceptance_cli_errors(tmp_path, args, code, fragment):
    ok = write_summary(tmp_path)
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps(summary(status="failed", error="RuntimeError: boom")))
    bad = tmp_path / "bad.csv"
    bad.write_text("arch,rank_size,acc1,fps\nresnet50,eight,1,1\n")
    subst = {"S": ok, "MISSING": str(tmp_path / "none.json"), "FAILED": str(failed), "BADTABLE": str(bad)}
    proc = cli([subst.get(a, a) for a in args])
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code:
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: ")
        assert fragment in proc.stderr


def test_the_modules_run_from_the_repository_root_without_the_project_installed():
    """The Ascend machines' way: `python3 -m tools.acceptance` / `-m modelzoo.drivers` from the repository root,
    with no site-packages at all (-S: not this environment's editable install either)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for argv, first in ((["-m", "tools.acceptance", "--help"], "usage: python3 -m tools.acceptance"),
                        (["-m", "modelzoo.drivers", "full", "8p", "--help"], "usage: bash test/train_full_8p.sh")):
        proc = subprocess.run([PY, "-S"] + argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith(first), proc.stdout + proc.stderr


# ---------------------------------------------------------------- one recipe engine


@STACK
@RANKS
@WAYS
def test_driver_and_main_recipe_resolve_alike_and_train_the_same_weights(imagenet_small, tmp_path):
    """train_full_8p.sh --rank_size=2 and main.py --recipe ..._8p on 2 spawned processes: one rule adapts the
    recipe (here: an explicit batch of 8 scales the recipe's lr and warm-up), and the two runs are one run."""
    common = ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32", "-p", "2",
              "--seed", "5", "--max-steps-per-epoch", "2", "-j", "0"]
    drv_out, main_out = tmp_path / "driver", tmp_path / "main"
    proc = run_driver("train_full_8p.sh", ["--data_path=" + imagenet_small, "--arch=shufflenet_v2_x1_0",
                                           "--device=cpu", "--rank_size=2", "--batch_size=8", "--epochs=1",
                                           "--workers=0", "--precision=fp32", "--output_dir=" + str(drv_out), "--"]
                      + common[:-2])
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    proc = subprocess.run([PY, os.path.join(ROOT, "main.py"), imagenet_small, "--recipe", "shufflenet_v2_x1_0_8p",
                           "--device", "cpu", "--multiprocessing-distributed", "--device-list", "0,1", "--port", "0",
                           "-b", "8", "--epochs", "1", "--output-dir", str(main_out)] + common,
                          env=driver_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    a, b = read_json(drv_out / "summary.json"), read_json(main_out / "summary.json")
    keys = ("arch", "batch_size", "lr", "epochs", "warmup_epochs", "lr_schedule", "weight_decay", "momentum",
            "label_smoothing", "world_size", "recipe")
    assert {k: a["config"][k] for k in keys} == {k: b["config"][k] for k in keys}
    assert a["config"]["lr"] == pytest.approx(4.0 * 8 / 8192) and a["config"]["warmup_epochs"] < 1
    import torch
    wa = torch_load(str(drv_out / "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    wb = torch_load(str(main_out / "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    assert wa and set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.timeout(120)
def test_driver_refuses_to_move_aside_a_folder_a_run_holds(shapes, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "train_0.log").write_text("an earlier run\n")
    holder = subprocess.Popen([PY, "-c", "import sys, time; from trainer.record.lock import RunLock; "
                               "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run_driver("train_performance_1p.sh", ["--data_path=" + shapes, "--output_dir=" + str(out)],
                          timeout=90)
        assert_one_line_error(proc, "--output_dir '{}' is in use by the run of pid {}".format(out, holder.pid))
        assert sorted(os.listdir(str(out))) == ["run.lock", "train_0.log"]  # nothing moved, nothing written
    finally:
        holder.kill()
        holder.wait()
