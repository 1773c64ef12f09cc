"""Every file under examples/ is checked: its main.py command is planned as the job would run it, for each worker
the job would start.

How: the file's own shell runs (an sbatch script with bash, an AscendJob container's command with its
/bin/bash -c) with the launcher it calls (srun, torchrun) replaced by a recorder on PATH, so that the command is
the one its shell expands. Each process that launcher would start is then planned with the environment the
launcher gives it: srun's task variables (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_ID, ...) under
sbatch's job variables, or torchrun's worker variables (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_MAX_RESTARTS,
..., read from torchrun's own parser) under the pod's (RANK, MASTER_ADDR, MASTER_PORT). Planning is main.py's
before anything starts: ``parse_config`` then ``plan(cfg, env)``; a command that main.py would refuse fails here
with main.py's one line.

The data path is a generated set (conftest's ``shapes``: the sbatch scripts get it as their data argument, the
AscendJob's /data volume holds it as imagenet) and the output folder a temporary one. The device is left as the
examples say (none: auto): they are written for nodes of 8 NPUs, so the planning runs on such a node, simulated
by tests/fake_npu (FAKE_NPU_DEVICE_COUNT=8), in a child process since importing the fake changes torch for the
process. A file of a kind this test cannot run fails, so that no example goes unchecked."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import ONCE, PY, ROOT

pytestmark = [ONCE, pytest.mark.timeout(300)]

EXAMPLES = os.path.join(ROOT, "examples")
FAKE_NPU = os.path.join(ROOT, "tests", "fake_npu")
NPUS_PER_NODE = 8
MASTER = "ascendjob-master-0"  # the Master pod's name, as the AscendJob gives it to every pod (MASTER_ADDR)
# the environment the examples' shells start from (plus what their launcher adds): nothing of this test's own
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
RECORDER = """#!{py}
import json, os, sys
with open(os.environ["EXAMPLE_RECORD"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}) + "\\n")
"""


def run_recording(tmp_path, launcher, command, env, cwd):
    """Runs ``command`` with ``launcher`` on PATH replaced by a recorder; returns what each call of it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / launcher).write_text(RECORDER.format(py=PY))
    os.chmod(str(bin_dir / launcher), 0o755)
    record = tmp_path / (launcher + ".jsonl")
    env = dict(env, PATH=str(bin_dir) + os.pathsep + env["PATH"], EXAMPLE_RECORD=str(record))
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert record.exists(), "{} never called {}: {}".format(command, launcher, proc.stdout[-2000:])
    return [json.loads(line) for line in record.read_text().splitlines()]


def main_py_argv(argv, cwd):
    """(the launcher's options, main.py's arguments) of a launcher's argv that runs [python3] main.py."""
    scripts = [i for i, a in enumerate(argv) if os.path.basename(a) == "main.py"]
    assert len(scripts) == 1, argv
    assert os.path.samefile(os.path.join(cwd, argv[scripts[0]]), os.path.join(ROOT, "main.py"))
    return argv[:scripts[0]], argv[scripts[0] + 1:]


def plan_all(jobs, tmp_path):
    """Each {"argv", "env"} planned as main.py plans it, on a node of 8 (fake) NPUs: a list of {"plan", "kind",
    "notes"} or {"error"}."""
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = dict(BASE_ENV, PYTHONPATH=FAKE_NPU, FAKE_NPU_DEVICE_COUNT=str(NPUS_PER_NODE), OMP_NUM_THREADS="1")
    proc = subprocess.run([PY, os.path.abspath(__file__), "--plan", str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def assert_planned(results, jobs):
    errors = sorted({r["error"] for r in results if "error" in r})
    assert not errors, "main.py refuses the example's command: {} ({})".format(" | ".join(errors), jobs[0]["argv"])
    for r in results:
        assert r["kind"] == "npu" and r["plan"]["device"] == "npu", r


# ---------------------------------------------------------------- sbatch scripts: bash, srun's tasks


def sbatch_options(text):
    return dict(re.findall(r"^#SBATCH\s+--([\w-]+)=(\S+)", text, re.M))


def check_sbatch(path, shapes, tmp_path):
    opts = sbatch_options(open(path).read())
    nodes, per_node = int(opts.get("nodes", "1")), int(opts["ntasks-per-node"])
    hosts = [socket.gethostname().split(".")[0]] + ["{}-{}".format("node", i) for i in range(1, nodes)]
    tasks = nodes * per_node
    per_node_text = str(per_node) if nodes == 1 else "{}(x{})".format(per_node, nodes)
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": opts.get("job-name", "job"), "SLURM_SUBMIT_DIR": ROOT,
           "SLURM_JOB_NODELIST": ",".join(hosts), "SLURM_NODELIST": ",".join(hosts), "SLURM_NNODES": str(nodes),
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
           "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": per_node_text}
    out = str(tmp_path / "run")
    calls = run_recording(tmp_path, "srun", ["bash", path, shapes, out], dict(BASE_ENV, **job), ROOT)
    assert len(calls) == 1, calls
    call = calls[0]
    options, argv = main_py_argv(call["argv"], call["cwd"])
    # the recorder stands for one step over the whole allocation: options that place tasks otherwise are not modelled
    assert not [o for o in options if re.match(r"-[nNc]$|--(ntasks|nodes|ntasks-per-node)\b", o)], options
    jobs = []
    for rank in range(tasks):
        node, local = divmod(rank, per_node)
        step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
                "SLURM_NODEID": str(node), "SLURMD_NODENAME": hosts[node], "SLURM_STEP_NODELIST": ",".join(hosts),
                "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_NUM_TASKS": str(tasks),
                "SLURM_STEP_TASKS_PER_NODE": per_node_text}
        jobs.append({"argv": argv, "env": dict(call["env"], **step)})
    results = plan_all(jobs, tmp_path)
    assert_planned(results, jobs)
    port = int(call["env"]["MASTER_PORT"])  # what the script exports for the ranks
    for rank, r in enumerate(results):
        p = r["plan"]
        assert (p["launch"], p["world_size"], p["rank"], p["local_rank"], p["device_index"]) == (
            "process", tasks, rank, rank % per_node, rank % per_node), p
        assert (p["nodes"], p["node_rank"], p["procs_per_node"]) == (nodes, rank // per_node, per_node), p
        assert (p["addr"], p["port"]) == (hosts[0], port)  # rank 0's host: the node list's first
        assert p["data"] == shapes and p["output_dir"] == out and p["resume"] == "auto"  # continues after a requeue


# ---------------------------------------------------------------- AscendJob: the pod's command, torchrun's workers


def folded_scalar(text, key):
    """The text of a YAML "KEY:\\n  - >-" folded block (the container's single argument): lines joined by spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == key + ":")
    assert lines[start + 1].strip() == "- >-", lines[start + 1]
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    block = []
    for line in lines[start + 2:]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line.strip())
    return " ".join(block)


def value(text, key):
    found = re.findall(r"^\s*(?:- )?{}:\s*(.+?)\s*$".format(re.escape(key)), text, re.M)
    assert len(set(found)) == 1, (key, found)
    return found[0]


def torchrun_workers(argv, pod_env):
    """The processes torchrun ``argv`` starts on one node, each (main.py's arguments, its environment), as
    torch.distributed.elastic's local agent sets it (RANK, LOCAL_RANK, ..., TORCHELASTIC_MAX_RESTARTS)."""
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes
    args = get_args_parser().parse_args(argv)
    nodes_min, nodes_max = parse_min_max_nnodes(args.nnodes)
    assert nodes_min == nodes_max, "an elastic node range is not modelled here: {}".format(args.nnodes)
    per_node = int(args.nproc_per_node)
    assert os.path.basename(args.training_script) == "main.py" and not args.module, argv
    world = nodes_max * per_node
    workers = []
    for local in range(per_node):
        env = dict(pod_env, RANK=str(args.node_rank * per_node + local), LOCAL_RANK=str(local),
                   GROUP_RANK=str(args.node_rank), ROLE_RANK=str(args.node_rank * per_node + local),
                   ROLE_NAME=args.role, LOCAL_WORLD_SIZE=str(per_node), WORLD_SIZE=str(world),
                   GROUP_WORLD_SIZE=str(nodes_max), ROLE_WORLD_SIZE=str(world), MASTER_ADDR=args.master_addr,
                   MASTER_PORT=str(args.master_port), TORCHELASTIC_RESTART_COUNT="0",
                   TORCHELASTIC_MAX_RESTARTS=str(args.max_restarts), TORCHELASTIC_RUN_ID=args.rdzv_id,
                   TORCHELASTIC_USE_AGENT_STORE=str(args.rdzv_backend == "static"))
        workers.append((list(args.training_script_args), env))
    return args, workers


def check_ascendjob(path, shapes, tmp_path):
    text = open(path).read()
    assert value(text, "kind") == "AscendJob"
    command = json.loads(value(text, "command"))
    assert command[:2] == ["/bin/bash", "-c"], command
    script = folded_scalar(text, "args")
    pods = int(value(text, "minAvailable"))  # the Master pod and the Workers: one torchrun agent each
    npus = int(value(text, "huawei.com/Ascend910"))
    # the pod's volumes, here: /data holds the generated set as imagenet, the output volume a temporary folder
    mounts = dict(re.findall(r"\{name: (\w+), mountPath: (\S+?)\}", text))
    volumes = {"data": tmp_path / "data", "output": tmp_path / "output"}
    volumes["data"].mkdir()
    os.symlink(shapes, str(volumes["data"] / "imagenet"))
    assert set(mounts) == set(volumes), mounts

    def local(arg):
        for name, mount in mounts.items():
            if arg == mount or arg.startswith(mount + "/"):
                return str(volumes[name]) + arg[len(mount):]
        return arg

    jobs = []
    for pod in range(pods):
        pod_env = dict(BASE_ENV, RANK=str(pod), MASTER_ADDR=MASTER, MASTER_PORT=value(
            text, "containerPort"))
        calls = run_recording(tmp_path, "torchrun", command + [script], pod_env, ROOT)  # the image's workdir
        assert len(calls) == 1, calls
        (tmp_path / "torchrun.jsonl").unlink()
        args, workers = torchrun_workers(calls[0]["argv"], calls[0]["env"])
        assert (args.nnodes, int(args.nproc_per_node), args.node_rank) == (str(pods), npus, pod), vars(args)
        jobs += [{"argv": [local(a) for a in argv], "env": env} for argv, env in workers]
    results = plan_all(jobs, tmp_path)
    assert_planned(results, jobs)
    assert len(results) == pods * npus
    for rank, r in enumerate(results):
        p = r["plan"]
        assert (p["launch"], p["world_size"], p["rank"], p["local_rank"], p["device_index"]) == (
            "process", pods * npus, rank, rank % npus, rank % npus), p
        assert (p["nodes"], p["node_rank"], p["addr"]) == (pods, rank // npus, MASTER), p
        assert p["data"] == str(volumes["data"] / "imagenet") and p["output_dir"] == str(volumes["output"])
        if int(jobs[rank]["env"]["TORCHELASTIC_MAX_RESTARTS"]):
            assert p["resume"] == "auto"  # a restarted attempt continues from the last checkpoint


# ---------------------------------------------------------------- every file


def checker(name):
    """The check of examples/NAME, by its kind; None for a kind this test cannot run."""
    path = os.path.join(EXAMPLES, name)
    if name.endswith(".sbatch"):
        return check_sbatch
    if name.endswith((".yaml", ".yml")) and re.search(r"^kind:\s*AscendJob\s*$", open(path).read(), re.M):
        return check_ascendjob
    return None


@pytest.mark.parametrize("name", sorted(os.listdir(EXAMPLES)))
def test_the_example_plans_on_every_worker_it_starts(name, shapes, tmp_path):
    check = checker(name)
    if check is None:
        pytest.fail("examples/{} is of a kind tests/test_examples.py cannot run: add its check there".format(name))
    check(os.path.join(EXAMPLES, name), shapes, tmp_path)


def test_the_examples_are_files_this_test_covers():
    names = os.listdir(EXAMPLES)
    assert names, "examples/ is empty"
    assert [n for n in names if checker(n) is None] == []


def _plan_jobs(path):
    """The child: each job of ``path`` parsed and planned as main.py does (trainer/config.py, trainer/plan.py)."""
    sys.path.insert(0, ROOT)
    import torch_npu  # noqa: F401  the fake (tests/fake_npu): a node of FAKE_NPU_DEVICE_COUNT NPUs
    from trainer.config import parse_config
    from trainer.errors import UsageError
    from trainer.plan import plan
    results = []
    with open(path) as f:
        jobs = json.load(f)
    for job in jobs:
        try:
            parsed = parse_config(job["argv"], env=job["env"], prog="main.py")
            p = plan(parsed.cfg, job["env"], parsed.notes)
            results.append({"plan": p.as_dict(), "kind": p.kind, "notes": list(p.notes)})
        except UsageError as exc:
            results.append({"error": str(exc)})
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--plan":
    _plan_jobs(sys.argv[2])
