"""The NPU runtime of today: a broken Ascend stack is an error (not a CPU run), the runtime settings of ModelZoo's
maintained entries (through the fake torch_npu of each lane's release), the profiler of torch_npu 1.11, and the
CPU core binding of each rank and its data workers for spawn, torchrun and the ModelZoo drivers."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import (IMPORTS_FAKE_NPU, ONCE, PY, RANKS, ROOT, SMALL, STACK, assert_one_line_error, read_summary,
                      run_main)
from trainer.job import affinity
from trainer.job.ranks import SIGNAL_GRACE
from trainer.device import runtime
from trainer.device.npu import NpuDevice

pytestmark = ONCE

FAKE = os.path.join(ROOT, "tests", "fake_npu")
BROKEN = os.path.join(FAKE, "broken")  # a torch_npu that raises the guide's "libhccl.so" ImportError
TRAIN = ["-a", "tiny_cnn", "-b", "8", "--epochs", "1", "--max-steps-per-epoch", "2", "--seed", "0"] + SMALL
CORES = sorted(os.sched_getaffinity(0))


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in runtime.CANN_VARIABLES + ("CPU_AFFINITY_CONF",)}
    env.update(extra)
    return env


# ---------------------------------------------------------------- 1. a broken NPU stack is an error


def test_broken_torch_npu_stops_auto_and_npu_with_one_line_and_cpu_still_trains(shapes, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([BROKEN, ROOT])}
    for extra in ([], ["--device", "npu"]):
        out = tmp_path / "o{}".format(len(extra))
        proc = run_main([shapes, "--output-dir", str(out)] + TRAIN + extra, env=env)
        assert_one_line_error(proc, "torch_npu is installed but does not import", "libhccl.so",
                              "source env_npu.sh", "--device cpu")
        assert not out.exists()  # nothing trained, nothing written
    out = tmp_path / "cpu"
    proc = run_main([shapes, "--output-dir", str(out), "--device", "cpu"] + TRAIN, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_summary(out)["status"] == "ok"


def test_cann_variables_without_torch_npu_stop_auto(shapes, tmp_path):
    proc = run_main([shapes, "--output-dir", str(tmp_path / "o")] + TRAIN,
                    env=dict(clean_env(), ASCEND_HOME_PATH="/opt/Ascend/ascend-toolkit/latest"))
    assert_one_line_error(proc, "Ascend's stack (ASCEND_HOME_PATH=/opt/Ascend/ascend-toolkit/latest)",
                          "no torch_npu", "--device cpu")
    assert not (tmp_path / "o").exists()


def test_presence_is_the_package_a_cann_variable_or_the_install_root(tmp_path, monkeypatch):
    for name in runtime.CANN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "Ascend"
    assert runtime.cann_present({}, str(root)) is None
    root.mkdir()
    assert runtime.cann_present({}, str(root)) == str(root)
    assert runtime.cann_present({"ASCEND_TOOLKIT_HOME": "/x"}, str(tmp_path / "none")) == "ASCEND_TOOLKIT_HOME=/x"
    # this host: torch_npu not installed, no CANN: --device auto is free to train on the CPU
    monkeypatch.setattr(runtime, "ASCEND_ROOT", str(tmp_path / "none"))
    assert not runtime.npu_installed() and NpuDevice.broken_stack() is None
    monkeypatch.setattr(runtime, "ASCEND_ROOT", str(root))
    assert str(root) in NpuDevice.broken_stack()


# ---------------------------------------------------------------- 2. runtime settings, 5. the 1.11 profiler


def probe(tmp_path, *flags, **env):
    e = dict(clean_env(), PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8", **env)
    e.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([PY, os.path.join(ROOT, "tests", "npu_runtime_probe.py"), str(tmp_path)] + list(flags),
                          env=e, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@STACK
@IMPORTS_FAKE_NPU
def test_a2_defaults_binary_kernels_no_internal_format_pinned_loaders(tmp_path):
    obs = probe(tmp_path)  # the fake names an Atlas A2 (Ascend910B1)
    s = obs["settings"]
    assert (s["jit_compile"], s["internal_format"], s["pin_memory"]) == (False, False, True)
    assert obs["calls"] == [["set_compile_mode", False], ["allow_internal_format", False]]
    assert obs["jit_compile_false"] is True
    two_one = obs["release"].startswith("2.1.")  # torch 2.1's DataLoader pins for CUDA unless told the device
    assert obs["loader"] == [True, "npu" if two_one else "", True, "npu" if two_one else ""]
    assert obs["binding"]["cpus"] == CORES  # one rank on the node: all of its cores


def test_910a_keeps_torch_npus_compile_mode_and_the_internal_format(tmp_path):
    obs = probe(tmp_path, FAKE_NPU_DEVICE_NAME="Ascend910A")
    s = obs["settings"]
    assert s["jit_compile"] is True and s["jit_compile_from"] == "torch_npu's default"
    assert s["internal_format"] is True
    assert obs["calls"] == [["allow_internal_format", True]]  # set_compile_mode not called


@STACK
@IMPORTS_FAKE_NPU
def test_each_flag_turns_its_setting_the_other_way(tmp_path):
    obs = probe(tmp_path, "--jit-compile", "on", "--internal-format", "on", "--pin-memory", "off")
    s = obs["settings"]
    assert (s["jit_compile"], s["internal_format"], s["pin_memory"]) == (True, True, False)
    assert obs["calls"] == [["set_compile_mode", True], ["allow_internal_format", True]]
    assert obs["loader"][0] is False and obs["loader"][2] is False


def test_cpu_affinity_conf_leaves_binding_to_torch_npu(tmp_path):
    obs = probe(tmp_path, CPU_AFFINITY_CONF="2")
    assert obs["binding"]["by"] == "torch_npu (CPU_AFFINITY_CONF=2)" and obs["binding"]["cpus"] is None


@STACK
@IMPORTS_FAKE_NPU
def test_torch_npu_without_profiler_profiles_through_autograd_use_npu(tmp_path):
    obs = probe(tmp_path, FAKE_NPU_LEGACY_PROFILER="1")
    assert obs["profile_calls"] == [["autograd.profiler.profile", {"use_npu": True}]]
    assert obs["profile_files"] == ["profile_ops_rank0.txt", "profile_rank0.json"]
    assert obs["profile_table_has_mm"]
    assert json.load(open(os.path.join(str(tmp_path), "profile_rank0.json")))  # a Chrome trace


def test_npu_settings_are_refused_elsewhere(shapes, tmp_path):
    for flags, words in ((["--jit-compile", "off"], "--jit-compile off is a torch_npu setting"),
                         (["--internal-format", "on"], "--internal-format on is a torch_npu setting"),
                         (["--pin-memory", "on"], "--pin-memory on: pinned memory serves copies to an accelerator")):
        proc = run_main([shapes, "--device", "cpu", "--output-dir", str(tmp_path / "o")] + TRAIN + flags)
        assert_one_line_error(proc, words)


# ---------------------------------------------------------------- 3. core binding


@pytest.mark.parametrize("cpus,nodes,per_node,expect", [
    (list(range(8)), [list(range(8))], 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (list(range(8)), [[0, 1, 2, 3], [4, 5, 6, 7]], 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (list(range(8)), [[0, 1, 2, 3], [4, 5, 6, 7]], 1, [list(range(8))]),
    (list(range(6)), [[0, 1, 2], [3, 4, 5]], 3, [[0], [1, 2], [3, 4, 5]]),
    ([0, 1], [[0, 1]], 4, [[0], [0], [1], [1]]),  # more ranks than cores: they share
])
def test_slices_are_contiguous_per_numa_node(cpus, nodes, per_node, expect):
    assert [affinity.plan(cpus, nodes, r, per_node)[0] for r in range(per_node)] == expect


def test_numa_nodes_from_sysfs(tmp_path):
    for n, text in ((0, "0-3,8-11\n"), (1, "4-7,12-15\n")):
        (tmp_path / "node{}".format(n)).mkdir()
        (tmp_path / "node{}".format(n) / "cpulist").write_text(text)
    assert affinity.numa_nodes(list(range(2, 14)), str(tmp_path)) == [[2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13]]
    assert affinity.numa_nodes([0, 1], str(tmp_path / "none")) == [[0, 1]]


def _children(pid):
    try:
        with open("/proc/{0}/task/{0}/children".format(pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _affinities_while_running(cmd, env, ranks_at_depth, timeout=120):
    """Start ``cmd``, read os.sched_getaffinity of its ranks (processes at ``ranks_at_depth`` below it) and of their
    children (the data workers) once each rank has one, then interrupt it. Returns ({rank pid: cores},
    {worker pid: cores}, output)."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    ranks, workers = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            level = [proc.pid]
            for _ in range(ranks_at_depth):
                level = [c for p in level for c in _children(p)]
            level = [p for p in level if _children(p)]  # ranks with their workers (not spawn's resource tracker)
            if len(level) >= 2:
                time.sleep(1.0)  # the ranks have bound themselves before starting their workers
                ranks = {p: sorted(os.sched_getaffinity(p)) for p in level}
                workers = {k: sorted(os.sched_getaffinity(k)) for p in level for k in _children(p)}
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        # the ranks stop at an agreed step; one that cannot (a loader worker hung in its fork: CPython gh-112275,
        # Python < 3.11.10) is killed by its supervisor after SIGNAL_GRACE, so the job always ends. torch 2.1's
        # torchrun kills the rank alone: its hung worker, which never ran a line to end with it, holds the output
        try:
            out = proc.communicate(timeout=SIGNAL_GRACE + 60)[0]
        except subprocess.TimeoutExpired:
            if proc.poll() is None:
                raise
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate(timeout=30)[0]
    return ranks, workers, out


def _check_two_ranks(ranks, workers, out):
    """Two ranks of a node on this machine's cores, whatever their count: each on its own share (disjoint,
    together all of them, sizes within one core unless the NUMA nodes are uneven), each worker on its rank's."""
    assert len(ranks) == 2 and workers, out[-3000:]
    a, b = sorted(ranks.values())
    assert a and b and not set(a) & set(b) and sorted(a + b) == CORES, (ranks, out[-3000:])
    if len(affinity.numa_nodes(CORES)) == 1:
        assert abs(len(a) - len(b)) <= 1 and a == CORES[:len(a)], (ranks, out[-3000:])
    for cores in workers.values():
        assert cores in (a, b)
    return {cores[0]: affinity.format_cpulist(cores) for cores in (a, b)}


def _slice(out, rank):
    """The cores the log line of local rank ``rank`` names."""
    m = re.search(r"(?:\[rank {0}\] )?=> cpu binding: local rank {0} of 2 on cores (\S+) ".format(rank), out)
    assert m, out[-3000:]
    return m.group(1)


needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs two usable cores")
LONG = ["-a", "tiny_cnn", "-b", "8", "--epochs", "50", "--seed", "0", "--cpu-binding", "on"] + \
    [a for a in SMALL if a not in ("-j", "0")] + ["-j", "2"]


@STACK
@RANKS
@needs_two_cores
def test_spawn_binds_each_rank_and_its_workers(shapes, tmp_path):
    cmd = [PY, os.path.join(ROOT, "main.py"), shapes, "--device", "cpu", "--multiprocessing-distributed",
           "--device-list", "0,1", "--port", "0", "--output-dir", str(tmp_path)] + LONG
    ranks, workers, out = _affinities_while_running(cmd, clean_env(OMP_NUM_THREADS="1"), 1)
    slices = _check_two_ranks(ranks, workers, out)
    assert sorted([_slice(out, 0), _slice(out, 1)]) == sorted(slices.values())
    assert affinity.format_cpulist(read_summary(tmp_path)["cpu_binding"]["cpus"]) == _slice(out, 0)


@STACK
@RANKS
@needs_two_cores
def test_torchrun_binds_each_rank_and_its_workers(shapes, tmp_path):
    from trainer.job.launch import free_port
    cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           os.path.join(ROOT, "main.py"), shapes, "--device", "cpu", "--output-dir", str(tmp_path)] + LONG
    ranks, workers, out = _affinities_while_running(cmd, clean_env(OMP_NUM_THREADS="1"), 1)
    _check_two_ranks(ranks, workers, out)


@STACK
@RANKS
@needs_two_cores
def test_modelzoo_8p_driver_ranks_bind_themselves(shapes, tmp_path):
    out_dir = tmp_path / "run"
    cmd = ["bash", os.path.join(ROOT, "test", "train_full_8p.sh"), "--data_path=" + shapes, "--arch=tiny_cnn",
           "--device=cpu", "--rank_size=2", "--batch_size=16", "--epochs=50", "--workers=4",
           "--output_dir=" + str(out_dir), "--", "--cpu-binding", "on", "--train-crop-size", "32",
           "--val-resize-size", "32", "--val-crop-size", "32"]
    env = clean_env(OMP_NUM_THREADS="1", etp_running_flag="true", PATH=os.path.dirname(PY) + os.pathsep +
                    os.environ.get("PATH", ""))
    for k in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "LOCAL_RANK", "MASTER_PORT", "ASCEND_DEVICE_ID"):
        env.pop(k, None)
    # bash execs python3 -m modelzoo.drivers, which starts the main.py ranks
    ranks, workers, out = _affinities_while_running(cmd, env, 1)
    slices = _check_two_ranks(ranks, workers, out)
    logged = [_slice((out_dir / "train_{}.log".format(r)).read_text(), r) for r in (0, 1)]
    assert sorted(logged) == sorted(slices.values()) and logged[0] != logged[1]


def test_cpu_run_binds_nothing_unless_asked(shapes, tmp_path):
    proc = run_main([shapes, "--device", "cpu", "--output-dir", str(tmp_path)] + TRAIN, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    assert s["cpu_binding"]["cpus"] is None and "binds nothing unless asked" in s["cpu_binding"]["reason"]
    assert s["device_settings"] == {"pin_memory": False}
    assert "=> cpu binding: none (a CPU run binds nothing unless asked)" in proc.stdout
