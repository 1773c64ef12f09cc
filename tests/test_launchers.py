"""Where a process sits under the launchers users run (torchrun's restarts, Slurm's srun) and the checks of the
rendezvous that need no process group (the master's address, the one-line failures)."""
import json
import socket

import pytest

from conftest import ONCE, assert_one_line_error, run_main
from trainer.job import clusters, rendezvous
from trainer.config import parse_config
from trainer.errors import UsageError

pytestmark = [ONCE, pytest.mark.timeout(120)]


def _cfg(argv, env):
    return parse_config(["--dummy", "--device", "cpu"] + list(argv), env=env)


SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2",
        "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_srun_tasks_find_rank_world_local_rank_and_the_first_host_as_master():
    section = _cfg(["-b", "8"], SRUN).cfg.launch
    assert (section.mode, section.rank, section.world_size, section.local_rank) == ("process", 3, 4, 1)
    assert (section.nodes, section.node_rank, section.procs_per_node) == (2, 1, 2)
    assert (section.addr, section.port) == ("gpu07", 29688)
    assert _cfg(["-b", "8", "--addr", "10.0.0.1"], SRUN).cfg.launch.addr == "10.0.0.1"  # the flag wins
    assert _cfg(["-b", "8"], dict(SRUN, MASTER_ADDR="10.0.0.2")).cfg.launch.addr == "10.0.0.2"
    # torchrun inside srun (one agent per node) is torchrun's job; an sbatch script itself (no step) is no rank
    assert _cfg(["-b", "8"], dict(SRUN, RANK="0", WORLD_SIZE="1")).cfg.launch.world_size == 1
    no_step = dict(SRUN)
    del no_step["SLURM_STEP_ID"]
    assert _cfg(["-b", "8"], no_step).cfg.launch.mode == "single"
    with pytest.raises(UsageError, match="SLURM_PROCID 4 is outside SLURM_NTASKS 4"):
        _cfg(["-b", "8"], dict(SRUN, SLURM_PROCID="4"))


def test_slurm_host_lists_expand_as_scontrol_show_hostnames_does():
    assert clusters.expand_hostlist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert clusters.expand_hostlist("a1,b[9-10]-ib") == ["a1", "b9-ib", "b10-ib"]
    assert clusters._tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]


def test_torchrun_restarts_require_resume_auto():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0",
           "TORCHELASTIC_MAX_RESTARTS": "3"}
    with pytest.raises(UsageError, match="torchrun --max-restarts 3 restarts the workers after a failure: add "
                                         "--resume auto"):
        _cfg(["-b", "8"], env)
    assert _cfg(["-b", "8", "--resume", "auto"], env).cfg.run.resume == "auto"
    assert _cfg(["-b", "8"], dict(env, TORCHELASTIC_MAX_RESTARTS="0")).cfg.run.resume is None


def test_local_addresses_are_told_from_others():
    assert rendezvous.is_local_address("127.0.0.1") and rendezvous.is_local_address("localhost")
    assert rendezvous.is_local_address(socket.gethostname()) is True
    assert rendezvous.is_local_address("1.1.1.1") is False  # a public address no interface here holds
    assert rendezvous.is_local_address("no-such-host.invalid") is None


def test_a_one_node_job_whose_master_is_not_this_machine_is_one_line_before_any_wait(tmp_path):
    """The guide's placeholder --addr='1.1.1.1' on one node: exit 2 at once instead of --dist-timeout's wait."""
    proc = run_main(["--dummy", "--device", "cpu", "--output-dir", str(tmp_path), "--multiprocessing-distributed",
                     "--device-list", "0,1", "--addr=1.1.1.1", "-b", "8", "--epochs", "1"], timeout=60)
    assert_one_line_error(proc, "the master address 1.1.1.1", "not an address of this machine",
                          "leave --addr out")
    proc = run_main(["--dummy", "--device", "cpu", "--output-dir", str(tmp_path), "-b", "8"],
                    env={"WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "no-such-host.invalid"}, timeout=60)
    assert_one_line_error(proc, "'no-such-host.invalid'", "does not resolve")


def test_group_errors_are_told_apart_and_read_as_one_line():
    closed = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:541: "
                          "Connection reset by peer. This is typically caused by a remote worker hanging\nmore")
    assert rendezvous.failure_kind(closed) == "peer"
    assert rendezvous._first(closed) == "Read error [127.0.0.1]:541: Connection reset by peer"
    refused = RuntimeError("Gloo connectFullMesh failed with [pair.cc:144] Connection refused")
    assert rendezvous.failure_kind(refused) == "refused"
    assert rendezvous.failure_kind(RuntimeError("CUDA out of memory. Connection reset by peer")) is None
    assert rendezvous.failure_kind(ValueError("Connection refused")) is None
    assert rendezvous.failure_kind(RuntimeError("size mismatch for fc.weight")) is None


def _table(tmp_path, version="1.0", servers=(("127.0.0.1", ((0, 0), (1, 1))), ("10.9.9.9", ((0, 2), (1, 3)))),
           name="rank_table.json"):
    server_list = [dict({"device": [{"device_id": str(d), "device_ip": "192.168.1.{}".format(r), "rank_id": str(r)}
                                    for d, r in devices]},
                        **({"server_id": "node_{}".format(i), "host_ip": host} if version == "1.2"
                           else {"server_id": host}))
                   for i, (host, devices) in enumerate(servers)]
    table = {"status": "completed", "version": version, "server_count": str(len(servers)), "server_list": server_list}
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_a_rank_table_places_this_process_and_raises_hccls_connect_timeout(tmp_path, version):
    path = _table(tmp_path, version)
    parsed = _cfg(["-b", "8"], {"RANK_TABLE_FILE": path, "DEVICE_ID": "1"})
    section = parsed.cfg.launch
    assert (section.mode, section.rank, section.world_size, section.local_rank) == ("process", 1, 4, 1)
    assert (section.nodes, section.node_rank, section.procs_per_node, section.addr) == (2, 0, 2, "127.0.0.1")
    assert any("HCCL_CONNECT_TIMEOUT=1200 s" in n for n in parsed.notes)
    assert clusters.hccl_timeout({"RANK_TABLE_FILE": path}) == {"HCCL_CONNECT_TIMEOUT": "1200"}
    assert clusters.hccl_timeout({"RANK_TABLE_FILE": path, "HCCL_CONNECT_TIMEOUT": "1800"}) == {}
    assert clusters.hccl_timeout({}) == {}
    # the ModelZoo loop's RANK_SIZE/RANK_ID with the table: checked against it
    loop = _cfg(["-b", "8"], {"RANK_TABLE_FILE": path, "RANK_SIZE": "4", "RANK_ID": "0"}).cfg.launch
    assert (loop.rank, loop.world_size, loop.nodes, loop.procs_per_node) == (0, 4, 2, 2)
    with pytest.raises(UsageError, match="RANK_SIZE 8 / RANK_ID 0 do not match RANK_TABLE_FILE"):
        _cfg(["-b", "8"], {"RANK_TABLE_FILE": path, "RANK_SIZE": "8", "RANK_ID": "0"})
    with pytest.raises(UsageError, match="puts rank 2 on server 10.9.9.9, which is not this host"):
        _cfg(["-b", "8"], {"RANK_TABLE_FILE": path, "RANK_ID": "2"})


def test_each_bad_rank_table_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", // a comment as in the docs\n}')
    cases = [
        (str(bad), "is not JSON"),
        (str(tmp_path / "missing.json"), "cannot be read"),
        (_table(tmp_path, servers=(("10.9.9.8", ((0, 0), (1, 1))), ("10.9.9.9", ((0, 2),))), name="away.json"),
         "this host is not in RANK_TABLE_FILE"),
        (_table(tmp_path, servers=(("127.0.0.1", ((0, 0), (0, 1))),), name="twice.json"),
         "server 127.0.0.1 lists device 0 twice"),
        (_table(tmp_path, servers=(("127.0.0.1", ((0, 0), (1, 2))),), name="gap.json"), "rank ids are [0, 2]"),
        (_table(tmp_path, version="2.0", name="v2.json"), "versions 1.0 and 1.2 are read"),
    ]
    for path, fragment in cases:
        proc = run_main(["--dummy", "--device", "cpu", "--output-dir", str(tmp_path / "out"), "-b", "8"],
                        env={"RANK_TABLE_FILE": path, "DEVICE_ID": "0"}, timeout=60)
        assert_one_line_error(proc, fragment)


def test_torch_npu_run_workers_meet_through_torch_npus_own_store():
    """torch_npu_run is torchrun with torch_npu's parallel store: its workers' env:// is torch_npu's to open."""
    section = _cfg(["-b", "8"], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}).cfg.launch
    assert section.mode == "process" and section.world_size == 2
    assert rendezvous.open_store(section, env={"TORCH_NPU_USE_PARALLEL_TCPSTORE": "True"}) is None


def test_a_local_rank_is_a_slot_and_names_the_device_of_a_node_of_one_process(shapes, tmp_path):
    """LOCAL_RANK in a run of one process per node (a single run, --world-size/--rank alone) names its device, not a
    slot among several: --cpu-binding on bound slot 1 of 1 and died with an IndexError before."""
    cfg = _cfg([], {"LOCAL_RANK": "3"}).cfg
    assert (cfg.launch.local_rank, cfg.launch.device_list, cfg.launch.procs_per_node) == (0, (3,), 1)
    cfg = _cfg(["--device-list", "4,5", "--world-size", "2", "--rank", "1"], {"LOCAL_RANK": "1"}).cfg
    assert (cfg.launch.local_rank, cfg.launch.device_list) == (0, (5,))
    out = tmp_path / "run"
    proc = run_main([shapes, "-a", "tiny_cnn", "--device", "cpu", "--cpu-binding", "on", "-b", "8", "--epochs", "1",
                     "--max-steps-per-epoch", "1", "--output-dir", str(out), "-j", "0", "--train-crop-size", "32",
                     "--val-resize-size", "32", "--val-crop-size", "32"], env={"LOCAL_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and s["cpu_binding"]["local_rank"] == 0 and s["config"]["device_list"] == [1], s


def test_a_local_rank_beyond_its_nodes_processes_is_one_line():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    with pytest.raises(UsageError, match=r"local rank 2 is outside this node's 2 processes \(local ranks 0..1\)"):
        _cfg([], env)
