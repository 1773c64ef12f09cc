"""ModelZoo's script arguments typed at our drivers (test/*.sh): each switch's effect on the plan, the ranks'
environment and main.py's command line; bad values one line and exit 2; the 16p and cluster scripts on localhost
(two "nodes" of one rank each, on this CPU)."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ONCE, PY, RANKS, ROOT, STACK, assert_one_line_error, dataset
from modelzoo import drivers, plan
from test_drivers import TINY_IMAGES, assert_case_log, assert_final_lines, driver_env, read_json, run_driver

pytestmark = [ONCE, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return dataset(tmp_path_factory, "imagenet", 4, 8, 4, seed=7)


@pytest.fixture(scope="module")
def empty_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    (d / "train").mkdir()
    (d / "val").mkdir()
    return str(d)


def planned(mode, scale, args, env=None, data_path=None):
    """The driver's plan and main.py command line for ``args`` (what the driver would start), without starting it."""
    args = ["--data_path=" + data_path if a == "DATA" else a for a in args]
    script = drivers.script_name(mode, scale)
    p = plan.resolve(plan.parse(args, mode, scale, script), mode, scale, script, dict(env or {}))
    return p, plan.command(p)


def after(cmd, flag):
    return cmd[cmd.index(flag) + 1]


# ---------------------------------------------------------------- each switch, in the plan


@pytest.mark.timeout(120)
@pytest.mark.parametrize("switch,var", [("--hf32", "ALLOW_HF32"), ("--fp32", "ALLOW_FP32"),
                                        ("--hf32=True", "ALLOW_HF32"), ("--fp32=true", "ALLOW_FP32")])
def test_hf32_fp32_export_the_variable_and_train_in_float32(switch, var, empty_data, tmp_path):
    p, cmd = planned("full", "8p", ["DATA", switch, "--device=cpu", "--rank_size=2", "--batch_size=8",
                                    "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert p.precision == "fp32" and "--amp" not in cmd  # ModelZoo's main.py turns amp off under ALLOW_*
    env = drivers.rank_env(p, 1, 29500, {"ALLOW_HF32" if var == "ALLOW_FP32" else "UNRELATED": ""})
    assert env[var] == "True" and env["RANK_ID"] == "1"
    assert any(n.startswith(switch.split("=")[0] + ": {}=True".format(var)) for n in p.notes), p.notes


@pytest.mark.timeout(120)
def test_hf32_false_removes_the_variable_for_the_ranks(empty_data, tmp_path):
    p, cmd = planned("full", "1p", ["DATA", "--hf32=False", "--device=cpu", "--output_dir=" + str(tmp_path / "o")],
                     data_path=empty_data)
    assert "ALLOW_HF32" not in drivers.rank_env(p, 0, None, {"ALLOW_HF32": "True"})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,precision", [("allow_mix_precision", "O2"), ("amp", "O2"), ("force_fp16", "O2"),
                                            ("allow_fp32_to_fp16", "O1"), ("must_keep_origin_dtype", "fp32")])
def test_precision_mode_maps_to_our_precision(mode, precision, empty_data, tmp_path):
    p, cmd = planned("full", "1p", ["DATA", "--arch=tiny_cnn", "--device=cpu", "--precision_mode=" + mode,
                                    "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert p.precision == precision
    assert ("--amp" in cmd) == (precision != "fp32")
    if precision != "fp32":
        assert after(cmd, "--opt-level") == precision
    assert "--precision_mode={}: precision {}".format(mode, precision) in p.notes


@pytest.mark.timeout(120)
def test_profiling_is_our_step_profiler(empty_data, tmp_path):
    out = ["--output_dir=" + str(tmp_path / "o"), "--device=cpu"]
    for value in ("TORCH", "CANN", "GE", "True", "torch"):
        _, cmd = planned("full", "1p", ["DATA", "--profiling=" + value] + out, data_path=empty_data)
        assert after(cmd, "--profile-steps") == "10:12"  # ModelZoo's PROFILE_START_STEP default, two steps
    _, cmd = planned("full", "1p", ["DATA", "--profiling=TORCH"] + out, env={"PROFILE_START_STEP": "4"},
                     data_path=empty_data)
    assert after(cmd, "--profile-steps") == "4:6"
    with pytest.raises(plan.UsageError, match="PROFILE_START_STEP='x' is not a whole number"):
        planned("full", "1p", ["DATA", "--profiling=TORCH"] + out, env={"PROFILE_START_STEP": "x"},
                data_path=empty_data)
    # a bounded performance run: the window is moved into its steps
    _, cmd = planned("performance", "1p", ["DATA", "--profiling=CANN", "--steps=3"] + out, data_path=empty_data)
    assert after(cmd, "--profile-steps") == "1:3"
    for off in ("False", "false", "none"):
        _, cmd = planned("full", "1p", ["DATA", "--profiling=" + off] + out, data_path=empty_data)
        assert "--profile-steps" not in cmd


@pytest.mark.timeout(120)
def test_lr_epochs_device_id_and_the_notes(empty_data, tmp_path):
    p, cmd = planned("full", "8p", ["DATA", "--device=cpu", "--rank_size=2", "--batch_size=8", "--device_id=5",
                                    "--learning_rate=0.4", "--train_epochs=3", "--over_dump=True",
                                    "--data_dump_flag=True", "--data_dump_step=10", "--autotune=True",
                                    "--more_path1=/extra", "--output_dir=" + str(tmp_path / "o")],
                     data_path=empty_data)
    assert after(cmd, "--lr") == "0.4" and after(cmd, "--epochs") == "3"
    assert after(cmd, "--device-list") == "0,1" and "--gpu" not in cmd  # --device_id ignored on 8p, as theirs
    notes = "\n".join(p.notes)
    assert "--device_id=5 is ignored by train_full_8p.sh" in notes
    assert "--over_dump: " in notes and "tools.compare_precision" in notes
    assert "--data_dump_flag/--data_dump_step: " in notes and "tools.op_report" in notes
    assert "--autotune=True has no effect here" in notes
    assert "--more_path1=/extra is not used" in notes
    p, cmd = planned("full", "8p", ["DATA", "--device=cpu", "--rank_size=2", "--batch_size=8", "--over_dump=False",
                                    "--autotune=False", "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert not any(n.startswith(("--over_dump", "--autotune")) for n in p.notes)


@pytest.mark.timeout(120)
def test_shufflenet_scripts_default_switches_as_typed(empty_data, tmp_path):
    """ShuffleNetV2's scripts' switches at their defaults: the recipe's O2, no profiler, no note of a dump."""
    p, cmd = planned("full", "8p", ["DATA", "--arch=shufflenet_v2_x1_0", "--device=cpu", "--rank_size=2",
                                    "--batch_size=8", "--precision_mode=allow_mix_precision", "--over_dump=False",
                                    "--data_dump_flag=False", "--data_dump_step=10", "--profiling=False",
                                    "--autotune=False", "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert p.recipe == "shufflenet_v2_x1_0_8p" and p.precision == "O2" and after(cmd, "--opt-level") == "O2"
    assert "--profile-steps" not in cmd
    assert not any(n.startswith(("--over_dump", "--data_dump", "--autotune", "--profiling")) for n in p.notes)


@pytest.mark.timeout(120)
def test_ckpt_path_is_the_initial_weights(empty_data, tmp_path):
    weights = tmp_path / "ckpt" / "checkpoint.pth.tar"
    weights.parent.mkdir()
    weights.write_bytes(b"x")
    out = "--output_dir=" + str(tmp_path / "o")
    for given in (str(weights), str(weights.parent)):  # a file, or the folder holding checkpoint.pth.tar
        p, cmd = planned("full", "1p", ["DATA", "--device=cpu", "--ckpt_path=" + given, out], data_path=empty_data)
        assert after(cmd, "--pretrained") == str(weights) and "--resume" not in cmd


@pytest.mark.timeout(120)
def test_16p_places_this_node_and_shares_the_recipe(empty_data, tmp_path):
    p, cmd = planned("full", "16p", ["DATA", "--device=cpu", "--node_rank=1", "--master_addr=10.0.0.1",
                                     "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert (p.nodes, p.node_rank, p.ranks, p.world, p.recipe) == (2, 1, 8, 16, "resnet50_8p")
    assert p.batch == 8192 and p.lr == pytest.approx(3.2)  # the 8p recipe for 16 devices: per-device batch kept
    assert after(cmd, "-j") == "256"  # the recipe's 256 workers for 8 devices, per node
    assert cmd[cmd.index("--multiprocessing-distributed"):cmd.index("--multiprocessing-distributed") + 5] == [
        "--multiprocessing-distributed", "--world-size", "2", "--rank", "1"]
    env = drivers.rank_env(p, 3, int(p.port), {"RANK_ID": "9", "RANK_SIZE": "16"})
    assert (env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("3", "10.0.0.1", "29688")
    assert "RANK_ID" not in env and "RANK_SIZE" not in env
    # one machine of 16 devices, as ModelZoo's own 16p scripts: --world_size=1 --rank_size=16
    p, cmd = planned("full", "16p", ["DATA", "--device=cpu", "--world_size=1", "--rank_size=16",
                                     "--output_dir=" + str(tmp_path / "o")], data_path=empty_data)
    assert (p.nodes, p.ranks, p.world) == (1, 16, 16) and "--multiprocessing-distributed" not in cmd


BAD = [
    ("train_full_8p.sh", ["--precision_mode=fp64"], "--precision_mode must be one of allow_mix_precision, amp, "
                                                     "force_fp16, allow_fp32_to_fp16, must_keep_origin_dtype, "
                                                     "got 'fp64'"),
    ("train_full_1p.sh", ["--hf32", "--fp32"], "--hf32 and --fp32 (ALLOW_HF32 and ALLOW_FP32) cannot be set"),
    ("train_full_1p.sh", ["--hf32", "--precision=O2"], "--hf32 trains in float32"),
    ("train_full_1p.sh", ["--fp32", "--precision_mode=allow_mix_precision"], "--fp32 trains in float32"),
    ("train_full_1p.sh", ["--precision=fp32", "--precision_mode=force_fp16"], "disagree"),
    ("train_full_1p.sh", ["--lr=0.1", "--learning_rate=0.2"], "--lr=0.1 and --learning_rate=0.2 disagree"),
    ("train_full_1p.sh", ["--learning_rate=fast"], "--learning_rate must be a non-negative number"),
    ("train_full_1p.sh", ["--epochs=2", "--train_epochs=3"], "--epochs=2 and --train_epochs=3 disagree"),
    ("train_full_1p.sh", ["--profiling=yes_please"], "--profiling must be one of TORCH, CANN, GE, True or False"),
    ("train_full_1p.sh", ["--profiling=TORCH", "--", "--profile-steps", "1:2"], "give one"),
    ("train_full_1p.sh", ["--over_dump=maybe"], "--over_dump takes True or False, got 'maybe'"),
    ("train_full_1p.sh", ["--autotune=2"], "--autotune takes True or False"),
    ("train_full_1p.sh", ["--data_dump_step=ten"], "--data_dump_step must be a whole number"),
    ("train_full_1p.sh", ["--ckpt_path=/no/such/weights.pth"], "--ckpt_path '/no/such/weights.pth' does not exist"),
    ("train_full_1p.sh", ["--ckpt_path=DATA"], "is a folder without checkpoint.pth.tar"),
    ("train_full_8p.sh", ["--world_size=2"], "--world_size is for train_full_16p.sh"),
    ("train_full_1p.sh", ["--node_rank=1"], "--node_rank is for train_full_16p.sh"),
    ("train_cluster.sh", ["--master_addr=127.0.0.1"], "--world_size=N (the number of nodes) is required"),
    ("train_cluster.sh", ["--world_size=2"], "--master_addr=IP (node 0's address"),
    ("train_cluster.sh", ["--world_size=2", "--node_rank=2", "--master_addr=h"], "--node_rank=2 must be below"),
    ("train_cluster.sh", ["--world_size=0"], "--world_size must be at least 1"),
    ("train_full_16p.sh", ["--node_rank=1"], "--master_addr=IP (node 0's address"),
    ("train_full_16p.sh", ["--master_addr=a b"], "is not a host name or address"),
    ("train_performance_16p.sh", ["--master_addr=h", "--rank_size=2", "--batch_size=6"],
     "does not divide over 4 ranks"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script,args,fragment", BAD, ids=["{}:{}".format(s, " ".join(a)) for s, a, _ in BAD])
def test_bad_modelzoo_arguments_exit_2_with_one_line(script, args, fragment, empty_data, tmp_path):
    out = tmp_path / "out"
    args = ["--data_path=" + empty_data] + [a.replace("DATA", empty_data) for a in args]
    i = args.index("--") if "--" in args else len(args)
    proc = run_driver(script, args[:i] + ["--output_dir=" + str(out)] + args[i:], timeout=120)
    assert_one_line_error(proc, fragment)
    assert not out.exists()


@pytest.mark.timeout(120)
def test_allow_variables_already_exported_count_too(empty_data, tmp_path):
    out = tmp_path / "out"
    proc = run_driver("train_full_1p.sh", ["--data_path=" + empty_data, "--fp32", "--output_dir=" + str(out)],
                      env=driver_env({"ALLOW_HF32": "True"}), timeout=120)
    assert_one_line_error(proc, "cannot be set at the same time")
    assert not out.exists()


@pytest.mark.timeout(120)
def test_test_env_npu_sh_is_the_projects(tmp_path):
    """ModelZoo's scripts source test/env_npu.sh: the same settings, quiet where CANN is missing, under set -eu,
    from the model root or from test/."""
    env = driver_env()
    for k in ("TASK_QUEUE_ENABLE", "HCCL_CONNECT_TIMEOUT", "CANN_INSTALL_PATH"):
        env.pop(k, None)
    env["ASCEND_CANN_INSTALL_INFO"] = str(tmp_path / "none.info")
    for cwd, path in ((ROOT, "test/env_npu.sh"), (os.path.join(ROOT, "test"), "./env_npu.sh")):
        proc = subprocess.run(["bash", "-c", "set -euo pipefail; source {}; echo \"ALIVE $TASK_QUEUE_ENABLE "
                               "$HCCL_CONNECT_TIMEOUT\"".format(path)], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        lines = proc.stdout.splitlines()
        if not any(os.path.exists(p) for p in ("/usr/local/Ascend", "/opt/Ascend")):
            assert len(lines) == 2 and lines[0].startswith("env_npu.sh: no CANN found")
        assert lines[-1] == "ALIVE 1 1200"


# ---------------------------------------------------------------- real runs


@STACK
def test_modelzoo_switches_on_a_real_1p_run(data, tmp_path):
    """A performance run typed with ModelZoo's switches: the profiler records its window, the weights of an
    earlier run are the start (--ckpt_path), --learning_rate is the lr, the notes say what each switch did."""
    first = tmp_path / "first"
    proc = run_driver("train_full_1p.sh", ["--data_path=" + data, "--arch=tiny_cnn", "--device=cpu",
                                           "--batch_size=8", "--epochs=1", "--workers=0",
                                           "--output_dir=" + str(first)] + TINY_IMAGES)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    out = tmp_path / "perf"
    proc = run_driver("train_performance_1p.sh", ["--data_path=" + data, "--arch=tiny_cnn", "--device=cpu",
                                                  "--batch_size=8", "--steps=3", "--workers=0", "--fp32",
                                                  "--profiling=TORCH", "--learning_rate=0.05", "--over_dump=False",
                                                  "--data_dump_flag=True", "--data_dump_step=10", "--autotune=False",
                                                  "--ckpt_path=" + str(first), "--more_path1=" + str(tmp_path),
                                                  "--output_dir=" + str(out)] + TINY_IMAGES)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    for line in ("note: --fp32: ALLOW_FP32=True for the ranks", "note: --data_dump_flag/--data_dump_step: ",
                 "note: --ckpt_path: the run starts from the weights in {}".format(first / "checkpoint.pth.tar"),
                 "note: --profiling=TORCH: main.py's step profiler records global steps 1..2",
                 "note: --more_path1={} is not used".format(tmp_path)):
        assert line in proc.stdout, (line, proc.stdout[-3000:])
    s = read_json(out / "summary.json")
    assert s["status"] == "ok" and s["config"]["lr"] == 0.05 and s["config"]["amp"] is False
    assert s["config"]["pretrained"] == str(first / "checkpoint.pth.tar")
    assert (out / "profile_rank0.json").exists() or (out / "profile_rank0").exists()
    values = assert_case_log(out, "tiny_cnn_bs8_1p_perf", "tiny_cnn", 1, 8, s)
    assert_final_lines(proc.stdout, values)


def free_port():
    return subprocess.run([PY, "-c", "from trainer.job.launch import free_port; print(free_port())"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def two_nodes(script, data, tmp_path, args):
    """Node 1 started in the background, node 0 in front: (node 0's process, node 1's, their output folders)."""
    port = free_port()
    outs = [tmp_path / "node0", tmp_path / "node1"]
    procs = []
    for rank in (1, 0):
        cmd = ["bash", os.path.join(ROOT, "test", script), "--data_path=" + data, "--node_rank={}".format(rank),
               "--master_addr=127.0.0.1", "--output_dir=" + str(outs[rank])] + args + TINY_IMAGES + [
               "--port", port, "--dist-timeout", "120"]
        procs.append(subprocess.Popen(cmd, env=driver_env(), cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        results = [p.communicate(timeout=500) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    (out1, err1), (out0, err0) = results
    assert procs[1].returncode == 0 and procs[0].returncode == 0, (out0[-3000:], err0[-3000:], out1[-3000:],
                                                                   err1[-3000:])
    return out0, out1, outs


@RANKS
def test_cluster_two_nodes_on_localhost_with_modelzoos_arguments(data, tmp_path):
    """ModelZoo's train_cluster.sh arguments (--batch_size --lr --train_epochs --world_size --node_rank
    --master_addr), one driver per node."""
    out0, out1, outs = two_nodes("train_cluster.sh", data, tmp_path, [
        "--arch=tiny_cnn", "--device=cpu", "--rank_size=1", "--batch_size=8", "--lr=0.05", "--train_epochs=1",
        "--world_size=2", "--workers=0"])
    assert "(node 0 of 2, 2 ranks in all, master 127.0.0.1:" in out0 and "rank 0: pid" in out0
    assert "rank 1: pid" in out1 and "node 1: done; node 0 reports the results" in out1
    s = read_json(outs[0] / "summary.json")
    assert s["status"] == "ok" and s["world_size"] == 2 and s["per_device_batch_size"] == 4
    assert s["config"]["lr"] == 0.05 and s["epochs_completed"] == 1
    values = assert_case_log(outs[0], "tiny_cnn_bs8_2p_acc", "tiny_cnn", 2, 8, s)
    assert_final_lines(out0, values)
    assert not [f for f in os.listdir(str(outs[1])) if f.endswith("_acc.log")]  # node 0 reports
    assert "[rank 1]" in (outs[1] / "train_0.log").read_text()  # node 1 ran rank 1


@RANKS
def test_performance_16p_two_nodes_on_localhost(data, tmp_path):
    out0, _, outs = two_nodes("train_performance_16p.sh", data, tmp_path, [
        "--arch=tiny_cnn", "--device=cpu", "--rank_size=1", "--batch_size=8", "--steps=2", "--workers=0",
        "--precision_mode=must_keep_origin_dtype"])
    s = read_json(outs[0] / "summary.json")
    assert s["status"] == "ok" and s["world_size"] == 2 and s["steps_per_epoch"] == 2
    assert s["config"]["amp"] is False
    values = assert_case_log(outs[0], "tiny_cnn_bs8_2p_perf", "tiny_cnn", 2, 8, s)
    assert_final_lines(out0, values)
    assert re.search(r"train_performance_16p.sh: tiny_cnn \| 1 processes on cpu devices 0 \(node 0 of 2", out0)


def test_drivers_module_usage_names_the_scales():
    proc = subprocess.run([sys.executable, "-m", "modelzoo.drivers", "performance", "cluster"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "full cluster" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert json.dumps(plan.SCALES) == '["1p", "8p", "16p", "cluster"]'
