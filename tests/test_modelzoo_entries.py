"""Ascend ModelZoo's own command lines on main.py (ResNet50_ID4149's main.py, Shufflenetv2's 8p_main_med.py): their
flags with their meaning, their launch loops, their defaults, a second run in the same folder, and the log lines
their scripts grep. The command lines and the greps below are written here after those scripts (sizes reduced).
Here on the CPU; their 8p loops on the NPU (the torch_npu double, --device auto): tests/test_npu_jobs.py."""
import json
import os
import subprocess

import pytest

from conftest import ONCE, PY, RANKS, ROOT, THREADS, assert_one_line_error, read_summary
from trainer import config, zoo
from trainer.job import launch, placement
from trainer.errors import UsageError
from trainer.optim.schedule import Schedule

pytestmark = [ONCE, pytest.mark.timeout(300)]

SMALL = ["--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"]


def parsed(argv, env=None, prog=None):
    return config.parse_config([str(a) for a in argv], env={} if env is None else env, prog=prog)


# ---------------------------------------------------------------- which defaults a command line trains

def test_a_modelzoo_script_run_takes_resnet50_id4149s_defaults_with_one_note():
    p = parsed(["--dummy", "-a", "resnet50", "--amp"], env={"RANK_SIZE": "1"})
    o = p.cfg.optim
    assert (o.label_smoothing, o.warmup_epochs, o.lr_schedule, o.lr_step_unit, o.warmup_offset) == \
        (0.1, 8.0, "cosine", "epoch", 0)
    assert p.cfg.precision.loss_scale == 1024.0 and p.cfg.run.modelzoo == "resnet50"
    said = [n for n in p.notes if n.startswith("ModelZoo's resnet50 entry")]
    assert len(said) == 1 and "label smoothing 0.1" in said[0] and "--modelzoo off" in said[0]


def test_pytorch_examples_command_lines_keep_examples_defaults():
    for env, extra in (({}, []), ({"RANK_SIZE": "1"}, ["--modelzoo", "off"]),
                       ({"RANK_SIZE": "1"}, ["--recipe", "resnet50_1p"])):
        p = parsed(["--dummy", "-a", "resnet50"] + extra, env=env)
        assert p.cfg.run.modelzoo is None
        assert not any(n.startswith("ModelZoo's") for n in p.notes)
        if not extra:
            o = p.cfg.optim
            assert (o.label_smoothing, o.warmup_epochs, o.lr_schedule, o.lr_step_unit) == (0.0, 0.0, "step", "step")


def test_8p_main_med_stands_in_for_shufflenetv2_and_flags_given_win():
    p = parsed(["--dummy", "--warm_up_epochs=5", "--momentum=0"], prog="/x/8p_main_med.py")
    o, r = p.cfg.optim, p.cfg.run
    assert (o.warmup_epochs, o.warmup_offset, o.lr_step_unit, o.lr_schedule, o.momentum) == (5.0, 1, "epoch",
                                                                                             "cosine", 0.0)
    assert r.eval_freq == 5 and p.cfg.precision.loss_scale == 64.0 and r.modelzoo == "shufflenetv2"
    p = parsed(["--dummy", "-ef", "2", "--loss-scale", "128", "--lr-schedule", "step"], prog="8p_main_med.py")
    assert (p.cfg.run.eval_freq, p.cfg.precision.loss_scale, p.cfg.optim.lr_schedule) == (2, 128.0, "step")
    assert "eval-freq" not in [n for n in p.notes if n.startswith("ModelZoo's")][0]


def test_the_entries_per_epoch_schedules_are_their_formulas():
    r50 = Schedule(1.6, "cosine", 90, 8, 100, unit="epoch", warmup_offset=0)
    assert [r50(e, 37) for e in (0, 7)] == [pytest.approx(1.6 / 8), pytest.approx(1.6)]
    assert r50(8, 0) == pytest.approx(1.6) and r50(49, 99) == pytest.approx(0.5 * 1.6 * (1 + __import__(
        "math").cos(__import__("math").pi * 41 / 82)))
    snv2 = Schedule(4.0, "cosine", 240, 5, 10, unit="epoch", warmup_offset=1)
    assert snv2(0, 3) == pytest.approx(4.0 / 6) and snv2(4, 9) == pytest.approx(4.0 * 5 / 6)
    assert snv2(5, 0) == pytest.approx(4.0)
    assert zoo.warmup(config.build_parser().parse_args(["--warmup", "3"]), {"mz_warmup"})[:3] == (3.0, "epoch", 0)


# ---------------------------------------------------------------- where a process of their loops sits

def place(argv, env):
    ns = config.build_parser().parse_args([str(a) for a in argv])
    return placement.place(placement.Asked.of(vars(ns)), env)


def test_resnet50_8p_loop_passes_gpu_of_its_rank():
    argv = ["--dummy", "--amp", "--world-size", "1", "--seed", "60", "-a", "resnet50", "-b", "8", "--lr", "1.6",
            "--rank", "0", "--multiprocessing-distributed"]
    out = place(argv + ["--gpu", "1"], {"RANK_SIZE": "2", "RANK_ID": "1"})
    assert (out.mode, out.world_size, out.rank, out.local_rank) == ("process", 2, 1, 1)
    with pytest.raises(UsageError, match="--gpu 0 contradicts this process's place: local rank 1 uses device 1"):
        place(argv + ["--gpu", "0"], {"RANK_SIZE": "2", "RANK_ID": "1"})
    # the cluster script: --world-size counts nodes, --rank is this node's
    out = place(["--dummy", "-b", "8", "--world-size", "2", "--rank", "1", "--gpu", "1",
                 "--multiprocessing-distributed"], {"RANK_SIZE": "2", "RANK_ID": "1"})
    assert (out.world_size, out.rank, out.nodes, out.node_rank) == (4, 3, 2, 1)


def test_shufflenetv2_8p_loop_places_each_process_by_local_rank():
    argv = ["--dummy", "--dist-url=tcp://127.0.0.1:50000", "--dist-backend=hccl", "--multiprocessing-distributed",
            "--world-size=1", "--batch-size=8", "--device_num=2", "--rank=0", "--device-list=0,1", "--benchmark", "0"]
    for i in (0, 1):
        out = place(argv + ["--local_rank={}".format(i)], {"RANK_SIZE": "2"})
        assert (out.world_size, out.rank, out.local_rank) == (2, i, i)
    p = parsed(argv + ["--local_rank=1"], env={"RANK_SIZE": "2"}, prog="8p_main_med.py")
    assert p.cfg.launch.device_list == (0, 1) and p.cfg.launch.rank == 1


@pytest.mark.parametrize("argv,env,fragment", [
    (["--benchmark", "1"], {}, "--benchmark 1"),
    (["--device_num", "4", "--device-list", "0,1"], {}, "--device_num 4 but --device-list 0,1 names 2"),
    (["--device_num", "2", "--multiprocessing-distributed"], {"RANK_SIZE": "8", "RANK_ID": "0"},
     "--device_num 2 but RANK_SIZE=8"),
    (["--warmup", "2", "--warm_up_epochs", "2"], {}, "give one"),
    (["--skip_steps", "3", "--fps-warmup-steps", "4"], {}, "--skip_steps 3 and --fps-warmup-steps 4 disagree"),
    (["--workspace", "a", "--output-dir", "b"], {}, "--workspace 'a' and --output-dir 'b' disagree"),
    (["--checkpoint-nameprefix", "a/b"], {}, "--checkpoint-nameprefix must be a file name"),
    ([], {"ALLOW_HF32": "True", "ALLOW_FP32": "True"}, "ALLOW_FP32 and ALLOW_HF32 cannot be set at the same time"),
])
def test_bad_modelzoo_flags_are_one_line_errors(argv, env, fragment):
    with pytest.raises(UsageError, match=fragment):
        parsed(["--dummy", "-b", "8"] + argv, env=env)


def test_allow_fp32_trains_float32_as_their_main_py_does():
    p = parsed(["--dummy", "--amp"], env={"ALLOW_FP32": "True"})
    assert p.cfg.precision.amp is False and p.cfg.precision.float32_math == "full"
    assert any(n.startswith("ALLOW_FP32 is set: float32 training") for n in p.notes)
    assert parsed(["--dummy"], env={"ALLOW_HF32": "True"}).cfg.precision.float32_math == "reduced"
    assert parsed(["--dummy"], env={"ALLOW_HF32": "False"}).cfg.precision.float32_math is None


# ---------------------------------------------------------------- their command lines, run, and their greps

def zoo_env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID",
                                                           "MASTER_PORT", "MASTER_ADDR")}
    e.update(OMP_NUM_THREADS=THREADS, PYTHONUNBUFFERED="1", **extra)
    return e


def start(entry, argv, cwd, log, env):
    with open(log, "w") as f:  # as their scripts do: `> train_0.log 2>&1`, one open per process
        return subprocess.Popen([PY, os.path.join(ROOT, entry)] + [str(a) for a in argv], cwd=str(cwd),
                                stdout=f, stderr=subprocess.STDOUT, env=env)


def grep(cmd, log):
    """One of their scripts' pipelines over the log (bash, as they run it)."""
    return subprocess.run(["bash", "-c", cmd.replace("LOG", str(log))], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def number(text):
    return float(text)  # raises when the grep found nothing


def test_their_step_time_greps_read_a_step_of_10_s_or_more(tmp_path):
    """A busy machine's (or a big model's) step of 10 s or more: the perf script's third word after 'Time ' is the
    average, not the 'Data' that follows (pytorch/examples' format runs the number into its parenthesis there)."""
    from trainer.record.metrics import LoopMeters, Span
    for seconds in (0.25, 12.5, 123.25):
        meters = LoopMeters(100, "Epoch: [0]")
        meters.update(Span(1, seconds, 0.001, None), {"loss": 2.0, "acc1": 50.0, "acc5": 100.0},
                      {"loss": 2.0, "acc1": 50.0, "acc5": 100.0})
        line = meters.line(0)
        assert "Time {:6.3f} (".format(seconds) in line and "Loss 2.0000e+00 (2.0000e+00)" in line, line
        log = tmp_path / "train_{}.log".format(seconds)
        log.write_text(line + "\n")
        avg = grep("grep Epoch LOG | awk -F 'Time ' '{print $2}' | awk -F ' ' '{print $3}' | "
                   "awk -F ')' '{print $1}' | tail -n 1", log)
        val = grep("grep Epoch LOG | awk -F 'Time ' '{print $2}' | awk -F ' ' '{print $1}' | tail -n 1", log)
        assert number(avg) == pytest.approx(seconds, abs=1e-3) and number(val) == pytest.approx(seconds, abs=1e-3)


RESNET50 = ["--data", None, "--amp", "--world-size", "1", "--seed", "60", "-a", "resnet50", "-j", "0", "-b", "8",
            "--lr", "0.2", "-p", "1"] + SMALL


def test_resnet50_performance_then_full_1p_in_one_folder_and_their_greps(shapes, tmp_path):
    """train_performance_1p.sh, then train_full_1p.sh, in the same model root (their way)."""
    root, log = tmp_path, tmp_path / "train_0.log"
    line = [shapes if a is None else a for a in RESNET50]
    env = zoo_env(RANK_SIZE="1")
    perf = start("main.py", line + ["--epochs", "1", "--gpu", "0", "--skip_steps", "2",
                                    "--max-steps-per-epoch", "6"], root, log, env)
    assert perf.wait(timeout=240) == 0, log.read_text()[-2000:]
    first = read_summary(str(root))
    assert first["status"] == "ok" and first["last_loss"] is not None and len(first["first_steps_seconds"]) == 2
    # their perf script: the last Epoch line's Time average (restarted at --skip_steps), and CompileTime
    step_time = number(grep("grep Epoch LOG | awk -F 'Time ' '{print $2}' | awk -F ' ' '{print $3}' | "
                            "awk -F ')' '{print $1}' | tail -n 1", log))
    assert step_time > 0
    assert number(grep("grep step_time LOG | head -2 | awk -F 'step_time = ' '{print $2}' | "
                       "awk '{sum+=$1} END {print sum}'", log)) > 0
    full = start("main.py", line + ["--epochs", "2", "--gpu", "0", "--max-steps-per-epoch", "3"], root, log, env)
    assert full.wait(timeout=240) == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert "held an earlier run" in text and "previous_runs" in text
    moved = [d for d in os.listdir(str(root / "previous_runs"))]
    assert len(moved) == 1
    with open(str(root / "previous_runs" / moved[0] / "summary.json")) as f:
        assert json.load(f) == first  # the first run, kept whole
    assert sorted(os.listdir(str(root / "previous_runs" / moved[0]))) == [
        "checkpoint.pth.tar", "metrics.jsonl", "model_best.pth.tar", "step_losses.csv", "summary.json", "tensorboard"]
    second = read_summary(str(root))
    assert second["status"] == "ok" and second["epochs_completed"] == 2
    # their full script: the mean of the Epoch lines' Time, the last Acc@1 summary, the losses of the Epoch lines
    assert number(grep("grep Epoch LOG | awk -F 'Time ' '{print $2}' | awk -F ' ' '{print $1}' | tail -n 100 | "
                       "awk '{a+=$1} END {if (NR != 0) printf(\"%.3f\",a/NR)}'", log)) > 0
    acc = number(grep("grep -a '*   Acc@1' LOG | awk 'END {print}' | awk -F 'Acc@1 ' '{print $NF}' | "
                      "awk -F ' ' '{print $1}'", log))
    assert acc == pytest.approx(second["final_acc1"], abs=1e-3)
    losses = grep("grep Epoch: LOG | grep -v Test | awk -F 'Loss ' '{print $NF}' | awk -F ' ' '{print $1}'",
                  log).split()
    assert len(losses) == 6 and number(losses[-1]) == pytest.approx(second["last_loss"], rel=1e-3)


@RANKS
def test_shufflenetv2_8p_line_on_two_processes_and_its_greps(shapes, tmp_path):
    """train_full_8p.sh's loop (8 processes -> 2), every process writing the same log as theirs do."""
    log = tmp_path / "train_0.log"
    env = zoo_env(RANK_SIZE="2")
    argv = ["--data={}".format(shapes), "--addr=127.0.0.1", "--seed=49", "--workers=0", "--learning-rate=0.4",
            "--print-freq=1", "--eval-freq=5", "--arch=shufflenet_v2_x0_5",
            "--dist-url=tcp://127.0.0.1:{}".format(launch.free_port()), "--dist-backend=hccl",
            "--multiprocessing-distributed", "--world-size=1", "--batch-size=16", "--epochs=2",
            "--warm_up_epochs=1", "--device_num=2", "--rank=0", "--amp", "--momentum=0", "--device-list=0,1",
            "--max-steps-per-epoch=4", "--benchmark", "0"] + SMALL
    procs = [start("8p_main_med.py", argv + ["--local_rank={}".format(i)], tmp_path, log, env) for i in (0, 1)]
    codes = [p.wait(timeout=280) for p in procs]
    text = log.read_text()
    assert codes == [0, 0], text[-3000:]
    s = read_summary(str(tmp_path))
    assert s["world_size"] == 2 and s["status"] == "ok"
    fps_lines = [ln for ln in text.splitlines() if "FPS" in ln]
    assert len(fps_lines) == 2 and all(ln.startswith("[npu id: 0 ] * FPS@all ") for ln in fps_lines), fps_lines
    mean_fps = number(grep("grep FPS LOG | awk '{print $(NF-2)}' | awk '{sum+=$1} END {print sum/NR}'", log))
    last_fps = number(grep("grep 'FPS@all' LOG | awk 'END {print $7}' | tr -d ,", log))
    assert mean_fps > 0 and last_fps > 0
    acc = number(grep("grep -a '* Acc@1' LOG | awk 'END {print}' | awk -F 'Acc@1' '{print $NF}' | "
                      "awk -F ' ' '{print $1}'", log))
    assert acc == pytest.approx(s["final_acc1"], abs=1e-3)
    last = grep("grep 'Loss' LOG | awk 'END {print $12}'", log)  # the last Test line's loss
    assert number(last) > 0
    assert grep("grep Epoch LOG | awk -F 'Loss' '{print $2}' | awk '{print $1}'", log).split()
    assert "Traceback" not in text
    # each rank's lines land whole at the end of the shared file (O_APPEND), none overwrites another's
    builds = [ln for ln in text.splitlines() if ln.endswith("0 workers per process)")]
    assert sorted(ln.split("=>")[0] for ln in builds) == ["", "[rank 1] "], builds


@RANKS
def test_resnet50_8p_loop_with_gpu_of_each_rank_trains(shapes, tmp_path):
    """train_full_8p.sh's loop (8 -> 2): --gpu ${RANK_ID} with RANK_SIZE / RANK_ID exported, one shared log."""
    log = tmp_path / "train_0.log"
    line = [shapes if a is None else a for a in RESNET50]
    line[line.index("resnet50")] = "resnet18"
    port = str(launch.free_port())
    running = [start("main.py", line + ["--epochs", "1", "--gpu", str(rank), "--rank", "0",
                                        "--multiprocessing-distributed", "--max-steps-per-epoch", "3"], tmp_path,
                     log, zoo_env(RANK_SIZE="2", RANK_ID=str(rank), MASTER_PORT=port)) for rank in (0, 1)]
    codes = [p.wait(timeout=280) for p in running]
    text = log.read_text()
    assert codes == [0, 0], text[-3000:]
    s = read_summary(str(tmp_path))
    assert s["world_size"] == 2 and s["status"] == "ok"
    assert text.count("=> summary:") == 1 and text.index("Epoch: [0]") < text.index(" *   Acc@1")


def test_skip_steps_longer_than_an_epoch_is_one_line(shapes, tmp_path):
    proc = subprocess.run([PY, os.path.join(ROOT, "main.py"), str(shapes), "-a", "tiny_cnn", "-b", "100",
                           "--skip_steps", "4", "--epochs", "1", "--device", "cpu", "--output-dir", str(tmp_path)]
                          + SMALL, capture_output=True, text=True, timeout=120, env=zoo_env())
    assert_one_line_error(proc, "--skip_steps 4 leaves no step of an epoch of 4 steps")
