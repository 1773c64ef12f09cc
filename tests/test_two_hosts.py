"""Two servers of one rank table as two hosts run them: each server a network namespace of its own with its own
address (192.0.2.1 and 192.0.2.2, a veth pair between them), one ModelZoo driver (test/train_full_8p.sh) per server
on the torch_npu double, one device each. The master is the table's server of rank 0, HCCL_IF_IP binds each
server's links to its address, the server of rank 0 reports; the job trains as two CPU ranks on one host do."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import DOUBLE, PY, RANKS, ROOT, STACK, finish, read_summary, run_main

pytestmark = [STACK, DOUBLE, RANKS, pytest.mark.timeout(600)]

FAKE = os.path.join(ROOT, "tests", "fake_npu")
ADDRESSES = ("192.0.2.1", "192.0.2.2")  # TEST-NET-1 (RFC 5737), only inside the namespaces
TRAIN = ["--seed", "1", "--max-steps-per-epoch", "3", "--wd", "0", "--no-channels-last", "--train-crop-size", "32",
         "--val-resize-size", "32", "--val-crop-size", "32", "-p", "2", "--dist-timeout", "120"]
COMPARED = ("final_acc1", "final_acc5", "final_loss", "val_loss", "train_acc1")


def _ip(*args):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)


@pytest.fixture
def hosts(request):
    """Two network namespaces joined by a veth pair, ``ADDRESSES`` on its ends and loopback up in each; removed
    at the end, whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("two hosts are two network namespaces: needs root (uid {})".format(os.geteuid()))
    if shutil.which("ip") is None:
        pytest.skip("two hosts are two network namespaces: needs iproute2's ip")
    tag = "th{}".format(os.getpid())
    names = (tag + "a", tag + "b")
    request.addfinalizer(lambda: [_ip("netns", "del", n) for n in names])  # their veth ends go with them
    made = _ip("netns", "add", names[0])
    if made.returncode != 0:
        pytest.skip("ip netns add failed: {}".format(made.stderr.strip()))
    for step in (["netns", "add", names[1]],
                 ["link", "add", tag + "x", "type", "veth", "peer", "name", tag + "y"],
                 ["link", "set", tag + "x", "netns", names[0]], ["link", "set", tag + "y", "netns", names[1]],
                 ["-n", names[0], "addr", "add", ADDRESSES[0] + "/24", "dev", tag + "x"],
                 ["-n", names[1], "addr", "add", ADDRESSES[1] + "/24", "dev", tag + "y"],
                 ["-n", names[0], "link", "set", tag + "x", "up"], ["-n", names[1], "link", "set", tag + "y", "up"],
                 ["-n", names[0], "link", "set", "lo", "up"], ["-n", names[1], "link", "set", "lo", "up"]):
        done = _ip(*step)
        assert done.returncode == 0, (step, done.stderr)
    return names


def write_table(path):
    servers = [{"server_id": address, "device": [{"device_id": "0", "device_ip": "192.168.100.{}".format(101 + r),
                                                  "rank_id": str(r)}]} for r, address in enumerate(ADDRESSES)]
    path.write_text(json.dumps({"version": "1.0", "status": "completed", "server_count": "2",
                                "server_list": servers}, indent=2))
    return str(path)


def test_two_servers_of_a_rank_table_train_as_two_hosts(shapes, tmp_path, hosts):
    table = write_table(tmp_path / "rank_table.json")
    outs = [tmp_path / "server{}".format(s) for s in (0, 1)]  # each server's own local disk
    drivers = []
    for s, (name, address) in enumerate(zip(hosts, ADDRESSES)):
        env = {k: v for k, v in os.environ.items() if k not in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK_ID", "RANK_SIZE", "DEVICE_ID", "ASCEND_DEVICE_ID",
            "MASTER_ADDR", "MASTER_PORT", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_IF_IP")}
        env.update(PATH=os.path.dirname(PY) + os.pathsep + env.get("PATH", ""), RANK_TABLE_FILE=table,
                   HCCL_IF_IP=address, PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="1",
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", etp_running_flag="true")
        drivers.append(subprocess.Popen(
            ["ip", "netns", "exec", name, "bash", os.path.join(ROOT, "test", "train_full_8p.sh"),
             "--data_path=" + shapes, "--arch=resnet18", "--device=npu", "--batch_size=16", "--epochs=1",
             "--workers=0", "--lr=0.02", "--output_dir=" + str(outs[s]), "--"] + TRAIN,
            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    logs = [finish(d, timeout=400) for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], [(o[-2000:], e[-2000:]) for o, e in logs]
    first, second = logs[0][0], logs[1][0]
    # each driver plans its server's part of the table: its device's rank, the job's size, the master
    assert "(server 0 of 2 in RANK_TABLE_FILE, 2 ranks in all, master 192.0.2.1:29688)" in first, first
    assert "(server 1 of 2 in RANK_TABLE_FILE, 2 ranks in all, master 192.0.2.1:29688)" in second, second
    assert "\nrank 0: pid " in first and "\nrank 1: pid " in second
    # the server of rank 0 reports (ModelZoo's report); the other says where the results are
    assert "Final Train Accuracy" in first and "reports the results" not in first
    assert "node 1: done; the server of rank 0 (192.0.2.1) reports the results" in second, second
    assert "Final Train Accuracy" not in second
    summary = read_summary(outs[0])
    config = summary["config"]
    assert summary["status"] == "ok" and summary["world_size"] == 2 and summary["device"] == "npu:0"
    assert (config["addr"], config["port"], config["rank"], config["nodes"], config["node_rank"]) == (
        "192.0.2.1", 29688, 0, 2, 0)
    assert read_summary(outs[1])["status"] == "ok"  # server 1's own copy (its --output-dir is its own disk)
    # the same job as two CPU ranks on one host (127.0.0.1)
    cpu = tmp_path / "cpu"
    proc = run_main([shapes, "--device", "cpu", "--output-dir", str(cpu), "-a", "resnet18", "-b", "16", "--lr",
                     "0.02", "--epochs", "1", "-j", "0", "--multiprocessing-distributed", "--device-list", "0,1",
                     "--port", "0"] + TRAIN, env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = read_summary(cpu)
    assert reference["world_size"] == 2 and reference["config"]["addr"] == "127.0.0.1"
    assert summary["final_acc1"] == reference["final_acc1"]
    for key in COMPARED:
        assert summary[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-4), key
