"""Every way to start a job of several NPU ranks, trained to the end on the torch_npu double (tests/fake_npu) and
compared with the same job on the CPU (same seed, same world size): torchrun, ModelZoo's RANK_SIZE/RANK_ID loop,
the 8p driver, Ascend's rank tables 1.0 and 1.2 naming devices 2-3 of a 4-NPU host, and ModelZoo's own
ResNet50_ID4149 and Shufflenetv2 command lines with --device auto. (main.py --multiprocessing-distributed
--device-list 0,1: tests/test_npu_double.py.)"""
import json
import os
import re
import subprocess

import pytest

from conftest import DOUBLE, PY, RANKS, ROOT, SMALL, STACK, dataset, finish, free_port, read_summary, run_main
from test_drivers import call_log, driver_env, pids_of, run_driver
from test_modelzoo_entries import RESNET50, grep, number, start, zoo_env
from test_npu_double import TRAIN, assert_same_run, fake_env
from test_rank_tables import binding, launcher_env, write_table

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(300)]

JOB = TRAIN + ["--dist-timeout", "120"]  # resnet18, 32 px, 4 steps of 16 images (test_npu_double.py)


@pytest.fixture(scope="module")
def cpu_job(npu_double, shapes, tmp_path_factory):
    """The CPU job every NPU job of JOB is compared with: two ranks spawned by main.py."""
    out = tmp_path_factory.mktemp("cpu_job")
    proc = run_main([shapes, "--device", "cpu", "--output-dir", str(out), "--multiprocessing-distributed",
                     "--device-list", "0,1", "--port", "0"] + JOB, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_summary(out)["world_size"] == 2
    return out


def npu_env(calls=None, count="8", **extra):
    """A launcher's environment on a host of ``count`` NPUs whose torch_npu is the double; each call of the
    double logged to ``calls`` (with the pid) when given."""
    env = launcher_env(OMP_NUM_THREADS="1", FAKE_NPU_DEVICE_COUNT=count, **extra)
    env["PYTHONPATH"] = fake_env()["PYTHONPATH"]
    if calls is not None:
        env["FAKE_NPU_CALL_LOG"] = str(calls)
    return env


def devices_set(calls, pids):
    """The first device each process made current (torch_npu.npu.set_device), in the order of ``pids``."""
    first = {}
    for c in call_log(calls):
        if c["call"][0] == "set_device":
            first.setdefault(c["pid"], c["call"][1])
    return [first.get(p) for p in pids]


def drop(args, *names):
    """``args`` without the flags ``names`` and the value after each."""
    out, skip = [], False
    for a in args:
        if skip or a in names:
            skip = not skip
            continue
        out.append(a)
    return out


def loop(shapes, out, per_rank, env, extra=()):
    """One main.py per rank from a shell loop's environment (``per_rank(r)``), run to the end: their outputs."""
    procs = [subprocess.Popen([PY, os.path.join(ROOT, "main.py"), shapes, "--output-dir", str(out)] + JOB
                              + list(extra), env=dict(env, **per_rank(r)), cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in (0, 1)]
    outs = [finish(p, timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    return procs, outs


# ---------------------------------------------------------------- launchers


@RANKS
def test_torchrun_trains_two_npu_ranks_as_two_cpu_ranks(shapes, cpu_job, tmp_path):
    """torchrun --nproc_per_node 2 main.py DIR --device npu: each worker on the NPU of its LOCAL_RANK."""
    out = tmp_path / "torchrun"
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           os.path.join(ROOT, "main.py"), shapes, "--device", "npu", "--output-dir", str(out)] + JOB,
                          env=npu_env(PYTHONUNBUFFERED="1"), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(out, cpu_job, "npu:0")
    assert "[rank 1] => resnet18 on npu:1 | 2 process(es) |" in proc.stdout
    assert read_summary(out)["config"]["launch"] == "process"


@RANKS
def test_modelzoo_rank_size_loop_trains_as_two_cpu_ranks(shapes, cpu_job, tmp_path):
    """ModelZoo's loop: one process per rank, RANK_ID=$i RANK_SIZE=2 exported, --device auto (the NPU found).
    --modelzoo off keeps pytorch/examples' defaults of the CPU job (the loop's own defaults:
    test_modelzoo_resnet50_id4149_loop_on_npu_with_device_auto)."""
    out, calls = tmp_path / "loop", tmp_path / "calls.jsonl"
    env = npu_env(calls, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK_SIZE="2")
    procs, outs = loop(shapes, out, lambda r: {"RANK_ID": str(r)}, env, ["--modelzoo", "off"])
    assert_same_run(out, cpu_job, "npu:0")
    assert devices_set(calls, [p.pid for p in procs]) == ["npu:0", "npu:1"]
    assert "Epoch: [0]" in outs[0][0] and "Epoch: [0]" not in outs[1][0]  # rank 0 logs the metrics


@RANKS
def test_8p_driver_with_two_ranks_trains_as_two_cpu_ranks(shapes, cpu_job, tmp_path):
    """bash test/train_full_8p.sh --data_path=DIR --rank_size=2 with its defaults (--device auto, no recipe for
    resnet18: float32 with torch_npu's fused SGD), main.py's flags of the CPU job after "--"."""
    out, calls = tmp_path / "run8", tmp_path / "calls.jsonl"
    flags = drop(JOB, "-a", "-b", "--lr", "--epochs", "-j")  # the driver's own flags give these
    proc = run_driver("train_full_8p.sh", ["--data_path=" + shapes, "--arch=resnet18", "--rank_size=2",
                                           "--batch_size=16", "--lr=0.02", "--epochs=1", "--workers=0",
                                           "--output_dir=" + str(out), "--"] + flags, timeout=240,
                      env=driver_env({"PYTHONPATH": fake_env()["PYTHONPATH"], "FAKE_NPU_DEVICE_COUNT": "8",
                                      "FAKE_NPU_CALL_LOG": str(calls)}))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "2 processes on auto devices 0,1" in proc.stdout and "--device auto " in proc.stdout
    assert_same_run(out, cpu_job, "npu:0")
    s = read_summary(out)
    assert s["amp"]["optimizer"] == "torch_npu.optim.NpuFusedSGD"
    assert devices_set(calls, pids_of(proc.stdout.splitlines())) == ["npu:0", "npu:1"]
    case = dict(ln.split(" = ", 1) for ln in (out / "resnet18_bs16_2p_acc.log").read_text().splitlines())
    assert case["RankSize"] == "2" and case["TrainAccuracy"] == "{:.3f}".format(s["final_acc1"])
    assert "Final Train Accuracy : {}\n".format(case["TrainAccuracy"]) in proc.stdout


# ---------------------------------------------------------------- rank tables


@RANKS
@pytest.mark.parametrize("version,per_rank", [
    ("1.0", lambda r: {"DEVICE_ID": str(2 + r)}),  # a loop over this host's devices: DEVICE_ID=$i
    ("1.2", lambda r: {"RANK_ID": str(r), "RANK_SIZE": "2"}),  # ModelZoo's loop: RANK_ID / RANK_SIZE
], ids=["1.0-DEVICE_ID", "1.2-RANK_ID"])
def test_a_rank_table_of_devices_2_and_3_of_a_4_npu_host_trains_as_two_cpu_ranks(shapes, cpu_job, tmp_path,
                                                                                   version, per_rank):
    """The table gives the job NPUs 2-3 of a host of 4: each rank makes its table device current (npu:2, npu:3)
    and binds the cores of its slot on the server (0, 1), not of its device id."""
    table = write_table(tmp_path, version, [2, 3])
    out, calls = tmp_path / "run", tmp_path / "calls.jsonl"
    env = npu_env(calls, count="4", RANK_TABLE_FILE=table, MASTER_PORT=str(free_port()))
    procs, outs = loop(shapes, out, per_rank, env, ["--modelzoo", "off", "--cpu-binding", "on"])
    assert_same_run(out, cpu_job, "npu:2")
    assert devices_set(calls, [p.pid for p in procs]) == ["npu:2", "npu:3"]
    assert "[rank 1] => resnet18 on npu:3 | 2 process(es) |" in outs[1][0]
    assert [binding(o[0])[:2] for o in outs] == [(0, 2), (1, 2)]
    config = read_summary(out)["config"]
    assert config["device_list"] == [2, 3] and config["device_index"] == 2 and config["local_rank"] == 0


# ---------------------------------------------------------------- ModelZoo's own command lines


@pytest.fixture(scope="module")
def zoo_data(tmp_path_factory):
    """4 classes x 8 train / 4 val images: two steps of 16 images, one validation batch per rank."""
    return dataset(tmp_path_factory, "imagenet", 4, 8, 4, seed=3)


def first_loss(log):
    """The first step's loss, from rank 0's progress line (pytorch/examples' format, any prefix)."""
    return float(re.search(r"Epoch: \[0\]\[\s*1/\d+\].*?\tLoss (\S+) ", log).group(1))


def zoo_pair(entry, argv, tmp_path, rank_flags, rank_env, **shared):
    """``entry`` with ``argv`` (ModelZoo's line, their 8p loop cut to two processes sharing one log) run twice:
    on a host whose torch_npu is the double, and on a host without an NPU in float32 (ALLOW_FP32=True, their
    main.py's switch). Both with --device auto; their summaries and logs."""
    runs = {}
    for host, extra in (("npu", fake_env(FAKE_NPU_DEVICE_COUNT="8")), ("cpu", {"ALLOW_FP32": "True"})):
        folder = tmp_path / host
        folder.mkdir()
        log = folder / "train_0.log"
        env = zoo_env(**dict(shared, **extra))
        env.update(OMP_NUM_THREADS="1")
        running = [start(entry, argv + rank_flags(r), folder, log, dict(env, **rank_env(r))) for r in (0, 1)]
        codes = [p.wait(timeout=240) for p in running]
        text = log.read_text()
        assert codes == [0, 0], text[-3000:]
        assert "Traceback" not in text
        runs[host] = (read_summary(str(folder)), text, log)
    return runs


def assert_trained_on_the_double(runs, loss_scale):
    """The NPU run: --device auto found the double's NPUs, trained in the entry's float16 with its loss scale, to
    the end; its first loss is the float32 CPU run's within float16's rounding (the later steps are not compared:
    the CPU trains channels-last, NCHW on the NPU, and the entries' large learning rates magnify that rounding)."""
    npu, cpu = runs["npu"][0], runs["cpu"][0]
    assert npu["status"] == cpu["status"] == "ok" and npu["world_size"] == cpu["world_size"] == 2
    assert npu["device"] == "npu:0" and cpu["device"] == "cpu"
    assert npu["versions"]["torch_npu"].endswith("+fake")
    assert (npu["amp"]["impl"], npu["amp"]["dtype"], npu["amp"]["loss_scale"]) == ("native", "float16", loss_scale)
    assert cpu["amp"]["enabled"] is False
    assert first_loss(runs["npu"][1]) == pytest.approx(first_loss(runs["cpu"][1]), rel=2e-2)
    assert re.search(r"^\[rank 1\] => \S+ on npu:1 \| 2 process\(es\) \|", runs["npu"][1], re.M), runs["npu"][1]


@RANKS
def test_modelzoo_resnet50_id4149_loop_on_npu_with_device_auto(zoo_data, npu_double, tmp_path):
    """ResNet50_ID4149's train_full_8p.sh loop (8 -> 2, resnet50 -> resnet18): --gpu ${RANK_ID} with RANK_SIZE /
    RANK_ID exported, --amp, no --device; their greps read the NPU run's log."""
    line = [zoo_data if a is None else a for a in RESNET50]
    line[line.index("resnet50")] = "resnet18"
    line[line.index("-b") + 1] = "16"
    runs = zoo_pair("main.py", line + ["--epochs", "1", "--rank", "0", "--multiprocessing-distributed",
                                       "--max-steps-per-epoch", "2"], tmp_path, lambda r: ["--gpu", str(r)],
                    lambda r: {"RANK_ID": str(r)}, RANK_SIZE="2", MASTER_PORT=str(free_port()))
    assert_trained_on_the_double(runs, 1024.0)  # the entry's static loss scale
    s, text, log = runs["npu"]
    acc = number(grep("grep -a '*   Acc@1' LOG | awk 'END {print}' | awk -F 'Acc@1 ' '{print $NF}' | "
                      "awk -F ' ' '{print $1}'", log))
    assert acc == pytest.approx(s["final_acc1"], abs=1e-3)
    assert text.count("=> summary:") == 1


@RANKS
def test_modelzoo_shufflenetv2_8p_line_on_npu_with_device_auto(zoo_data, npu_double, tmp_path):
    """Shufflenetv2's train_full_8p.sh loop (8 -> 2): 8p_main_med.py with --dist-backend=hccl, a tcp:// URL,
    --local_rank=$i and --amp, no --device; their greps read the NPU run's log."""
    argv = ["--data={}".format(zoo_data), "--addr=127.0.0.1", "--seed=49", "--workers=0", "--learning-rate=0.4",
            "--print-freq=1", "--eval-freq=5", "--arch=shufflenet_v2_x0_5",
            "--dist-url=tcp://127.0.0.1:{}".format(free_port()), "--dist-backend=hccl",
            "--multiprocessing-distributed", "--world-size=1", "--batch-size=16", "--epochs=1",
            "--warm_up_epochs=1", "--device_num=2", "--rank=0", "--amp", "--momentum=0", "--device-list=0,1",
            "--max-steps-per-epoch=2", "--benchmark", "0"] + SMALL[:6]
    runs = zoo_pair("8p_main_med.py", argv, tmp_path, lambda r: ["--local_rank={}".format(r)], lambda r: {},
                    RANK_SIZE="2")
    assert_trained_on_the_double(runs, 64.0)  # the entry's loss scale
    s, text, log = runs["npu"]
    assert [ln for ln in text.splitlines() if "FPS" in ln][0].startswith("[npu id: 0 ] * FPS@all ")
    assert number(grep("grep 'FPS@all' LOG | awk 'END {print $7}' | tr -d ,", log)) > 0
    acc = number(grep("grep -a '* Acc@1' LOG | awk 'END {print}' | awk -F 'Acc@1' '{print $NF}' | "
                      "awk -F ' ' '{print $1}'", log))
    assert acc == pytest.approx(s["final_acc1"], abs=1e-3)
    assert json.dumps(s["config"]["device_list"]) == "[0, 1]"
