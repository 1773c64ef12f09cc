"""Ascend's rank table (RANK_TABLE_FILE) as a launcher gives it: a process's slot on its host (its local rank: the
core binding's, its --device-list entry) is kept apart from its device id (the table's device_id), through main.py
and the ModelZoo driver on the CPU; a table of the wrong shape is one line. (The same tables on the NPU, trained on
the torch_npu double and compared with the CPU: tests/test_npu_jobs.py.)"""
import json
import os
import re
import subprocess

import pytest

from conftest import (ONCE, PY, RANKS, ROOT, SMALL, assert_one_line_error, child_env, finish, free_port, read_summary,
                      run_main)
from trainer.job import affinity, launch
from trainer.config import parse_config
from trainer.device import runtime

pytestmark = [ONCE, pytest.mark.timeout(300)]

TRAIN = ["-a", "tiny_cnn", "-b", "8", "--epochs", "1", "--max-steps-per-epoch", "2", "--seed", "0",
         "--dist-timeout", "120"] + SMALL
FAKE = os.path.join(ROOT, "tests", "fake_npu")
CORES = sorted(os.sched_getaffinity(0))
# what a launcher or an earlier job may have left in the environment: each test gives its own
PLACE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK_ID", "RANK_SIZE", "DEVICE_ID",
         "ASCEND_DEVICE_ID", "MASTER_ADDR", "MASTER_PORT", "RANK_TABLE_FILE", "CPU_AFFINITY_CONF", "PYTHON",
         "etp_running_flag", "ASCEND_RT_VISIBLE_DEVICES")


def write_table(tmp_path, version, devices, host="127.0.0.1", name="rank_table.json"):
    """One server (``host``) of a job as the scheduler's table lists it: ``devices`` (ids) with rank ids from 0."""
    device = [{"device_id": str(d), "device_ip": "192.168.100.{}".format(101 + d), "rank_id": str(r)}
              for r, d in enumerate(devices)]
    server = {"server_id": host} if version == "1.0" else {"server_id": "node-0", "host_ip": host}
    server["device"] = device
    return write_json(tmp_path / name, {"version": version, "status": "completed", "server_count": "1",
                                        "server_list": [server]})


def write_json(path, table):
    path.write_text(json.dumps(table, indent=2))
    return str(path)


def launcher_env(**given):
    env = {k: v for k, v in child_env().items() if k not in PLACE + runtime.CANN_VARIABLES}
    env.update(given)
    return env


def start(args, env):
    return subprocess.Popen([PY, os.path.join(ROOT, "main.py")] + list(args), env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def binding(out):
    """(local rank, ranks per node, cores) of the ``=> cpu binding`` line in a rank's output."""
    m = re.search(r"=> cpu binding: local rank (\d+) of (\d+) on cores (\S+)", out)
    assert m, out[-3000:]
    return int(m.group(1)), int(m.group(2)), affinity.parse_cpulist(m.group(3))


# ---------------------------------------------------------------- devices that do not start at 0


@RANKS
@pytest.mark.parametrize("version,per_rank", [
    ("1.0", lambda r, device: {"DEVICE_ID": str(device)}),  # a loop over this host's devices: DEVICE_ID=$i
    ("1.2", lambda r, device: {"RANK_ID": str(r), "RANK_SIZE": "2"}),  # ModelZoo's loop: RANK_ID / RANK_SIZE
], ids=["1.0-DEVICE_ID", "1.2-RANK_ID"])
def test_devices_2_and_3_of_a_host_train_with_slots_0_and_1(shapes, tmp_path, version, per_rank):
    """The job is given devices 2-3 of this host: each rank binds the slice of its slot (0, 1), not of its
    device id, and records both; the job trains to the end."""
    table = write_table(tmp_path, version, [2, 3])
    out = tmp_path / "run"
    port = str(free_port())
    procs = [start([shapes, "--device", "cpu", "--cpu-binding", "on", "--output-dir", str(out), "--modelzoo", "off"]
                   + TRAIN, launcher_env(RANK_TABLE_FILE=table, MASTER_PORT=port, **per_rank(r, device)))
             for r, device in enumerate((2, 3))]
    outs = [finish(p, timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    slots = [binding(o[0]) for o in outs]
    assert [s[:2] for s in slots] == [(0, 2), (1, 2)]
    if len(CORES) >= 2:  # each slot its own share of the cores
        assert not set(slots[0][2]) & set(slots[1][2]), slots
    assert outs[1][0].count("[rank 1] => cpu binding: local rank 1 of 2") == 1
    s = read_summary(out)
    assert s["status"] == "ok" and s["world_size"] == 2 and s["epochs_completed"] == 1
    config = s["config"]
    assert (config["launch"], config["rank"], config["local_rank"], config["procs_per_node"]) == ("process", 0, 0, 2)
    assert config["device_list"] == [2, 3] and config["device_index"] == 2  # rank 0: slot 0, device 2
    assert s["cpu_binding"]["local_rank"] == 0 and s["cpu_binding"]["ranks_per_node"] == 2
    assert s["cpu_binding"]["cpus"] == slots[0][2]


def test_a_table_device_the_host_does_not_have_is_one_line(tmp_path):
    table = write_table(tmp_path, "1.0", [8, 9])  # the fake host has NPUs 0-7
    out = tmp_path / "run"
    proc = run_main(["--dummy", "--device", "npu", "-b", "8", "--output-dir", str(out)],
                    env=launcher_env(RANK_TABLE_FILE=table, DEVICE_ID="9", FAKE_NPU_DEVICE_COUNT="8",
                                     PYTHONPATH=os.pathsep.join([FAKE, ROOT])), timeout=120)
    assert_one_line_error(proc, "RANK_TABLE_FILE '{}' asks for npu device 8 but 8 visible (ids 0-7)".format(table))
    assert not out.exists()


def test_the_place_of_a_table_device_keeps_slot_and_device_apart(tmp_path):
    """DEVICE_ID 6 of a table listing 4-7 is slot 2: its cores are slot 2's share, its device 6."""
    table = write_table(tmp_path, "1.2", [4, 5, 6, 7])
    section = parse_config(["--dummy", "--device", "cpu", "-b", "8"],
                           env={"RANK_TABLE_FILE": table, "DEVICE_ID": "6"}).cfg.launch
    assert (section.rank, section.world_size, section.local_rank, section.procs_per_node) == (2, 4, 2, 4)
    assert section.device_list == (4, 5, 6, 7) and launch.device_index(section) == 6
    cpus = list(range(8))
    nodes = [cpus[:4], cpus[4:]]
    # four ranks over two NUMA nodes: slots 0-1 on the first, 2-3 on the second, two cores each
    assert affinity.plan(cpus, nodes, section.local_rank, section.procs_per_node) == ([4, 5], [1])
    # the same with LOCAL_RANK (a slot), and with the rank id
    for env in ({"LOCAL_RANK": "2"}, {"RANK_ID": "2"}, {"DEVICE_ID": "6", "LOCAL_RANK": "2"}):
        again = parse_config(["--dummy", "--device", "cpu", "-b", "8"], env=dict(env, RANK_TABLE_FILE=table))
        assert again.cfg.launch == section


# ---------------------------------------------------------------- the ModelZoo driver


@RANKS
def test_the_8p_driver_runs_this_hosts_devices_of_the_table(shapes, tmp_path):
    """bash test/train_full_8p.sh with RANK_TABLE_FILE exported (devices 2-3 of this host): the driver starts one
    rank per table device (RANK_ID, LOCAL_RANK = slot, DEVICE_ID = device) and the job trains."""
    table = write_table(tmp_path, "1.0", [2, 3])
    out = tmp_path / "run"
    env = launcher_env(RANK_TABLE_FILE=table, etp_running_flag="true", OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")  # python3 = the project's python
    proc = subprocess.run(["bash", os.path.join(ROOT, "test", "train_full_8p.sh"), "--data_path=" + shapes,
                           "--arch=tiny_cnn", "--device=cpu", "--batch_size=8", "--epochs=1", "--workers=0",
                           "--output_dir=" + str(out), "--", "--cpu-binding", "on", "--max-steps-per-epoch", "2",
                           "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "2 processes on cpu devices 2,3" in proc.stdout
    assert re.search(r"^rank 0: pid \d+, device 2,", proc.stdout, re.M), proc.stdout
    assert re.search(r"^rank 1: pid \d+, device 3,", proc.stdout, re.M), proc.stdout
    s = read_summary(out)
    assert s["status"] == "ok" and s["world_size"] == 2
    assert s["config"]["device_list"] == [2, 3] and s["config"]["device_index"] == 2
    assert s["config"]["local_rank"] == 0
    for r in (0, 1):
        assert binding((out / "train_{}.log".format(r)).read_text())[:2] == (r, 2)


def test_the_driver_refuses_a_rank_size_the_table_does_not_have(shapes, tmp_path):
    table = write_table(tmp_path, "1.0", [2, 3])
    env = launcher_env(RANK_TABLE_FILE=table, etp_running_flag="true")
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", os.path.join(ROOT, "test", "train_full_8p.sh"), "--data_path=" + shapes,
                           "--arch=tiny_cnn", "--device=cpu", "--rank_size=4", "--output_dir=" + str(tmp_path / "o")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "--rank_size=4 but RANK_TABLE_FILE", "lists 2 device(s) for this host (2,3)")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- one line for what does not fit


def _server(devices, host="127.0.0.1"):
    return {"server_id": host, "device": [{"device_id": str(d), "device_ip": "192.168.100.1", "rank_id": str(r)}
                                          for r, d in enumerate(devices)]}


BAD_TABLES = {
    "a string in server_list": (
        {"version": "1.0", "status": "completed", "server_count": "1", "server_list": ["10.0.0.1"]},
        ["entry 0 of server_list is a string (\"10.0.0.1\"), not an object", '"server_id"']),
    "server_list an object": (
        {"version": "1.0", "status": "completed", "server_count": "1", "server_list": _server([0, 1])},
        ["server_list is an object, not a list", "write it as [{"]),
    "device an object": (
        {"version": "1.2", "status": "completed", "server_list": [
            {"server_id": "node-0", "host_ip": "127.0.0.1", "device": _server([0])["device"][0]}]},
        ["server 127.0.0.1's device is an object, not a list"]),
    "server_group_list an object": (
        {"version": "1.0", "status": "completed", "server_group_list": {"server_list": [_server([0, 1])]}},
        ["server_group_list is an object, not a list"]),
    "a negative device_id": (
        {"version": "1.0", "status": "completed", "server_list": [
            {"server_id": "127.0.0.1", "device": [{"device_id": "-1", "device_ip": "192.168.100.1", "rank_id": "0"}]}]},
        ["server 127.0.0.1 has a device whose device_id is a string (\"-1\")", "whole numbers from 0"]),
    "a negative rank_id": (
        {"version": "1.2", "status": "completed", "server_list": [
            {"server_id": "node-0", "host_ip": "127.0.0.1", "device": [{"device_id": 0, "rank_id": -1}]}]},
        ["has a device whose rank_id is a number (-1)"]),
    "server_count against the list": (
        {"version": "1.0", "status": "completed", "server_count": "2", "server_list": [_server([0, 1])]},
        ["server_count is 2 but 1 server is listed: make them agree"]),
    "a table that is a list": (
        [_server([0, 1])], ["holds a list", "not an object"]),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_rank_table_of_the_wrong_shape_is_one_line(tmp_path, case):
    table, fragments = BAD_TABLES[case]
    path = write_json(tmp_path / "rank_table.json", table)
    out = tmp_path / "run"
    proc = run_main(["--dummy", "--device", "cpu", "--output-dir", str(out), "-b", "8"],
                    env=launcher_env(RANK_TABLE_FILE=path, DEVICE_ID="0"), timeout=120)
    assert_one_line_error(proc, "RANK_TABLE_FILE '{}'".format(path), *fragments)
    assert not out.exists()


def test_a_place_that_contradicts_the_table_is_one_line(tmp_path):
    table = write_table(tmp_path, "1.0", [2, 3])
    out = tmp_path / "run"
    cases = [
        ({"DEVICE_ID": "0"}, [], ["DEVICE_ID=0 is not a device of this host (127.0.0.1)", "its devices are 2,3"]),
        ({"DEVICE_ID": "3", "LOCAL_RANK": "3"}, [],
         ["local rank 3 (LOCAL_RANK or --local_rank) contradicts RANK_TABLE_FILE", "slot 1 of this host's devices 2,3",
          "export LOCAL_RANK=1"]),
        ({"LOCAL_RANK": "2"}, [],
         ["local rank 2", "this host (127.0.0.1) has 2 device(s) there (2,3), local ranks 0..1"]),
        ({"RANK_ID": "1", "RANK_SIZE": "2", "LOCAL_RANK": "1"}, ["--device-list", "0,1"],
         ["--device-list 0,1 gives local rank 1 device 1, but RANK_TABLE_FILE gives rank 1 device 3",
          "pass --device-list 2,3"]),
    ]
    for env, flags, fragments in cases:
        proc = run_main(["--dummy", "--device", "cpu", "--output-dir", str(out), "-b", "8"] + flags,
                        env=launcher_env(RANK_TABLE_FILE=table, **env), timeout=120)
        assert_one_line_error(proc, *fragments)
        assert not out.exists()
