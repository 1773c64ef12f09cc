"""The porting guides' commands as their users type them (seeds 000 and 002): each runs, or answers with one
line; none stops with a traceback or a refusal the guide gives no reason for."""
import argparse
import inspect
import json
import os
import subprocess

import pytest
import torch

from conftest import ONCE, PY, RANKS, ROOT, SMALL, STACK, WAYS, assert_one_line_error, read_summary, run_main
from trainer.device import torch_load
from trainer import config
from trainer.plan import plan

pytestmark = [ONCE, pytest.mark.timeout(300)]

FAKE_NPU = os.path.join(ROOT, "tests", "fake_npu")  # the test-only fake Ascend stack (tests/fake_npu/README.md)

STEP = ["-a", "tiny_cnn", "--epochs", "1", "--max-steps-per-epoch", "1", "-b", "8", "--lr", "0.1", "--seed", "11",
        "--device", "cpu", "--no-tensorboard"] + SMALL


def parsed(argv, env=None):
    return config.parse_config([str(a) for a in argv], env={} if env is None else env)


def parse(argv, env=None):
    return parsed(argv, env).cfg


def planned(argv):
    """The plan of a command line (trainer/plan.py) and every note: parsing's and the plan's."""
    p = parsed(argv)
    decided = plan(p.cfg)
    return decided, p.notes + decided.notes


@pytest.mark.parametrize("spelling", [["--loss-scale", "-1"], ["--loss_scale", "-1"], ["--loss-scale=-1.0"]])
def test_loss_scale_minus_one_means_dynamic_as_in_the_guides_parser(spelling):
    assert parse(["--dummy", "--amp"] + spelling).precision.loss_scale == "dynamic"
    assert parse(["--dummy", "--amp"]).precision.loss_scale is None  # not given
    assert parse(["--dummy", "--amp", "--loss-scale", "128"]).precision.loss_scale == 128.0


def test_help_says_what_switches_do_without_default_true():
    proc = run_main(["--help"], timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    for noise in ("(default: True)", "(default: False)", "(default: None)"):
        assert noise not in text
    assert "--no-validate skip validation" in text
    assert "(default: 256)" in text  # a real default is still shown (-b)


@pytest.mark.parametrize("env", [
    {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    {"RANK_SIZE": "2", "RANK_ID": "1"},
], ids=["torchrun", "rank_size"])
def test_multiprocessing_distributed_under_a_launcher_is_ignored_with_a_note(env):
    cfg, notes = parsed(["--dummy", "--multiprocessing-distributed", "-b", "8"], env)
    assert cfg.launch.mode == "process" and cfg.launch.world_size == 2 and cfg.launch.rank == 1
    # in ModelZoo's RANK_SIZE loops the flag still says that --world-size / --rank count nodes: no note there
    assert any("--multiprocessing-distributed is ignored" in n for n in notes) == ("RANK" in env), notes


def test_another_devices_backend_is_replaced_by_this_devices_own_with_a_note():
    for asked in ("hccl", "nccl"):
        cfg, notes = planned(["--dummy", "--device", "cpu", "--dist-backend", asked, "--world-size", "2",
                                "--rank", "0", "-b", "8"])
        assert cfg.launch.dist_backend == "gloo"
        assert any(n.startswith("--dist-backend {} is the".format(asked)) and n.endswith("using gloo")
                   for n in notes), notes
    assert planned(["--dummy", "--device", "cpu", "--dist-backend", "gloo"])[0].launch.dist_backend == "gloo"


@STACK
@RANKS
@WAYS
def test_the_guides_launch_py_command_with_hccl_trains_on_cpu(tmp_path):
    """000 "Python命令启动方式": python3 -m torch.distributed.launch --nproc_per_node N main.py DIR
    --multiprocessing-distributed ... --dist-backend 'hccl', here on 2 CPU processes."""
    from tools.make_dataset import generate
    data = generate(str(tmp_path / "d"), classes=4, train_per_class=4, val_per_class=2, size=32, seed=2)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([PY, "-m", "torch.distributed.launch", "--nproc_per_node", "2", os.path.join(ROOT, "main.py"),
                           data, "--output-dir", str(tmp_path / "o"), "--multiprocessing-distributed",
                           "--dist-backend", "hccl"] + STEP, env=env, capture_output=True, text=True, timeout=240,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "--multiprocessing-distributed is ignored under torchrun / torch.distributed.launch" in proc.stdout
    assert "--dist-backend hccl is the NPU collective library" in proc.stdout
    s = read_summary(tmp_path / "o")
    assert s["status"] == "ok" and s["world_size"] == 2
    assert any(n.startswith("--dist-backend hccl is the NPU collective library") for n in s["notes"]), s["notes"]
    assert "notes" not in s["config"]  # the config holds settings only


@STACK
@pytest.mark.skipif("weights_only" not in inspect.signature(torch.load).parameters,
                    reason="torch.load takes weights_only from torch 1.13 on (trainer.device.torch_load loads without)")
def test_a_checkpoint_holding_python_objects_is_refused_in_our_words(tmp_path):
    path = tmp_path / "examples_style.pth.tar"  # e.g. a checkpoint that kept the argparse Namespace
    torch.save({"state_dict": torch.nn.Linear(2, 2).state_dict(), "args": argparse.Namespace(lr=0.1)}, str(path))
    before = path.read_bytes()
    for flag in ("--pretrained", "--resume"):
        proc = run_main(["--dummy", flag, str(path), "--output-dir", str(tmp_path / "o")], timeout=120)
        line = assert_one_line_error(proc, "'{}' holds Python objects beyond tensors and plain data".format(path),
                                     "argparse.Namespace", "unpickling them could run code", "weights.pth")
        assert "Re-running" not in line and "set to `False`" not in line
    assert path.read_bytes() == before and not os.path.exists(str(tmp_path / "o" / "summary.json"))


def _npu_plan_notes(*argvs):
    """The notes of parsing and planning for each command line on the fake NPU host, from one child (importing the fake
    changes torch for the rest of a process)."""
    script = ("import json, sys; from trainer import config, plan\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    p = config.parse_config(argv, env={})\n"
              "    print(json.dumps(list(p.notes + plan.plan(p.cfg).notes)))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_NPU, ROOT]), FAKE_NPU_DEVICE_COUNT="8")
    proc = subprocess.run([PY, "-c", script, json.dumps([list(a) for a in argvs])], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(argvs):]]


def test_single_npu_run_without_amp_gets_a_note_and_stays_float32():
    plain, amp, spawned = _npu_plan_notes(
        ["--dummy", "--device", "npu"], ["--dummy", "--device", "npu", "--amp"],
        ["--dummy", "--device", "npu", "--multiprocessing-distributed", "--device-list", "0,1"])
    notes = [n for n in plain if "--amp" in n]
    assert len(notes) == 1 and notes[0].startswith("no --amp: training in float32"), notes
    assert "the Ascend guides train on NPU with --amp" in notes[0]
    assert not [n for n in amp + spawned if "no --amp" in n]
    assert not [n for n in planned(["--dummy", "--device", "cpu"])[1] if "no --amp" in n]


def _address_space(limit):
    def cap():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return cap


@STACK
def test_out_of_memory_is_one_line_with_the_batch_and_the_fix_and_keeps_the_checkpoint(tmp_path):
    """001's FAQ: out of device memory, lower the batch. Here a real allocation failure: the run's address space
    capped at 4 GiB (enough for torch and the model, not for ResNet18's activations at 256 x 224 px)."""
    small = ["--dummy", "-a", "resnet18", "--device", "cpu", "--no-validate", "--no-tensorboard",
             "--max-steps-per-epoch", "1", "--seed", "1", "-j", "0"]
    first = run_main(small + ["--epochs", "1", "-b", "4", "--train-crop-size", "32", "--output-dir", str(tmp_path)])
    assert first.returncode == 0, first.stderr[-2000:]
    ckpt = tmp_path / "checkpoint.pth.tar"
    before = ckpt.read_bytes()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([PY, os.path.join(ROOT, "main.py")] + small + [
        "--epochs", "2", "-b", "256", "--train-crop-size", "224", "--resume", "auto", "--output-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=240, cwd=ROOT, preexec_fn=_address_space(4 * 2 ** 30))
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory on cpu at 256 images per device"), err
    assert "lower -b" in err[0] and "resnet18, 224 px" in err[0]
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and s["error"] == err[0][len("error: "):]
    assert ckpt.read_bytes() == before


def test_out_of_memory_is_recognised_on_every_device():
    from trainer import device as devmod
    assert devmod.out_of_memory(MemoryError())
    for text in ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total capacity)",
                 "NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 30.21 GiB total capacity)",
                 "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 154140672 bytes. Error code 12 (Cannot allocate memory)"):
        assert devmod.out_of_memory(RuntimeError(text)), text
    assert not devmod.out_of_memory(RuntimeError("shape mismatch"))
    assert not devmod.out_of_memory(ValueError("out of memory"))  # only the allocators' RuntimeError


def _published_file(torch_home, arch):
    """torchvision's weights file for ``arch`` placed in ``torch_home`` as torchvision's cache holds it (here
    seeded random weights: the test is offline), and the state dict it holds."""
    import models
    import torchvision
    url = models.published_weights_url(arch)
    folder = os.path.join(str(torch_home), "hub", "checkpoints")
    os.makedirs(folder)
    torch.manual_seed(7)
    sd = torchvision.models.__dict__[arch]().state_dict()
    torch.save(sd, os.path.join(folder, os.path.basename(url)))
    return sd


@STACK
def test_bare_pretrained_loads_torchvisions_weights_from_its_cache_and_starts_a_new_classifier(shapes, tmp_path):
    """pytorch/examples' `main.py -a resnet18 --pretrained DIR` (its --pretrained takes no value), offline, with
    the file in TORCH_HOME; the data has 10 classes, the weights 1000."""
    sd = _published_file(tmp_path / "th", "resnet18")
    proc = run_main(["-a", "resnet18", "--pretrained", shapes, "--epochs", "1", "--max-steps-per-epoch", "1", "-b", "4",
                     "--lr", "0", "--wd", "0", "--no-validate", "--no-tensorboard", "--output-dir", str(tmp_path / "o"),
                     "--device", "cpu"] + SMALL, env={"TORCH_HOME": str(tmp_path / "th")}, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: --pretrained")]
    assert len(notes) == 1 and "1000 classes and this model has 10" in notes[0] and "fc.weight, fc.bias" in notes[0]
    mine = torch_load(str(tmp_path / "o" / "checkpoint.pth.tar"), weights_only=True)["state_dict"]
    assert torch.equal(mine["conv1.weight"], sd["conv1.weight"])  # lr 0: the loaded backbone, unchanged
    assert torch.equal(mine["layer4.1.conv2.weight"], sd["layer4.1.conv2.weight"])
    assert tuple(mine["fc.weight"].shape) == (10, 512)


def test_bare_pretrained_for_a_model_torchvision_has_no_weights_for_is_one_line(tmp_path):
    proc = run_main(["--dummy", "-a", "tiny_cnn", "--pretrained", "--output-dir", str(tmp_path)], timeout=120)
    assert_one_line_error(proc, "torchvision publishes no weights for -a tiny_cnn", "--pretrained FILE")


@STACK
def test_loss_alignment_against_a_reference_run_passes_alike_runs_and_fails_a_diverging_one(shapes, tmp_path):
    """001's precision chapter: train part of the epochs and align the loss with the reference (GPU) run's."""
    from conftest import run_tool
    common = [shapes, "-a", "tiny_cnn", "--epochs", "2", "-b", "8", "--seed", "5", "--device", "cpu",
              "--no-tensorboard", "--max-steps-per-epoch", "6"] + SMALL
    for name, lr in (("ref", "0.05"), ("same", "0.05"), ("other", "0.5")):
        proc = run_main(common + ["--lr", lr, "--output-dir", str(tmp_path / name)], timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
    ok = run_tool("acceptance.py", ["align", "--run", str(tmp_path / "same"), "--reference", str(tmp_path / "ref")])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert [ln.split(":")[1].strip() for ln in lines[:2]] == ["epoch 0", "epoch 1"]
    assert all(" PASS train_loss " in ln and "relative difference 0.000" in ln and "Acc@1" in ln for ln in lines[:2])
    assert lines[-1].startswith("align: PASS (2 epoch(s) compared")
    bad = run_tool("acceptance.py", ["align", "--run", str(tmp_path / "other"), "--reference", str(tmp_path / "ref"),
                                     "--epochs", "1", "--loss-rtol", "0.001"])  # 10x the LR: the loss moves apart
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "align: epoch 0: FAIL" in bad.stdout and bad.stdout.strip().splitlines()[-1].startswith("align: FAIL")
    missing = run_tool("acceptance.py", ["align", "--run", str(tmp_path), "--reference", str(tmp_path / "ref")])
    assert_one_line_error(missing, "has no metrics.jsonl")
