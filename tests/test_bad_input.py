"""Every user mistake: one line on stderr naming the problem, exit code 2, nothing lost."""
import json
import os
import subprocess

import pytest
import torch

import main as entry
from conftest import ONCE, PY, ROOT, SMALL, STACK, THREADS, assert_call_error, assert_one_line_error, run_main

pytestmark = ONCE


def check(argv, capsys, *fragments):
    return assert_call_error(entry.main, argv, capsys, *fragments)


@pytest.fixture
def odd_data(tmp_path):
    """Factory: a data root with the given class folders in train/ and val/."""
    def make(train, val, with_images=True):
        from tools.make_dataset import draw
        import numpy as np
        rng = np.random.default_rng(0)
        root = tmp_path / "d"
        for split, classes in (("train", train), ("val", val)):
            for c in classes:
                folder = root / split / c
                folder.mkdir(parents=True)
                if with_images:
                    draw("disc", 16, rng).save(str(folder / "a.JPEG"))
        return str(root)
    return make


def test_no_traceback_at_process_level(tmp_path):
    proc = run_main([str(tmp_path / "missing"), "--output-dir", str(tmp_path / "o")])
    assert_one_line_error(proc, "does not exist")


def test_missing_data_dir(tmp_path, capsys):
    check([str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o")], capsys, "does not exist")


def test_empty_data_dir(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    check([str(tmp_path / "empty"), "--output-dir", str(tmp_path / "o")], capsys, "is empty")


def test_no_data_at_all(capsys):
    check([], capsys, "no data set given", "--dummy")


@pytest.mark.parametrize("missing", ["train", "val"])
def test_missing_split(tmp_path, capsys, missing):
    other = "val" if missing == "train" else "train"
    (tmp_path / "d" / other / "c1").mkdir(parents=True)
    check([str(tmp_path / "d"), "--output-dir", str(tmp_path / "o")], capsys, "has no {}/ folder".format(missing))


def test_val_class_missing(odd_data, tmp_path, capsys):
    root = odd_data(["a", "b", "c"], ["a", "b"])
    check([root, "--output-dir", str(tmp_path / "o"), "-a", "tiny_cnn"] + SMALL, capsys, "val/ lacks", "c")


def test_val_class_extra(odd_data, tmp_path, capsys):
    root = odd_data(["a", "b"], ["a", "b", "zebra"])
    check([root, "--output-dir", str(tmp_path / "o"), "-a", "tiny_cnn"] + SMALL, capsys, "not in train/", "zebra")


def test_empty_class_folder(odd_data, tmp_path, capsys):
    root = odd_data(["a", "b"], ["a", "b"])
    os.remove(os.path.join(root, "train", "b", "a.JPEG"))
    check([root, "--output-dir", str(tmp_path / "o"), "-a", "tiny_cnn", "-b", "1"] + SMALL, capsys,
          "holds no images")


def test_unknown_arch_suggests(capsys):
    line = check(["--dummy", "-a", "resnt50"], capsys, "unknown architecture 'resnt50'")
    assert "resnet50" in line


@pytest.mark.parametrize("argv,frag", [
    (["-b", "0"], "--batch-size: must be a whole number at least 1"),
    (["--epochs", "0"], "--epochs: must be a whole number at least 1"),
    (["--lr", "-0.1"], "must be a number at least 0.0, got '-0.1'"),
    (["--train-crop-size", "0"], "--train-crop-size: must be a whole number at least 1"),
    (["--val-crop-size", "0"], "--val-crop-size: must be a whole number at least 1"),
    (["--opt-level", "O3"], "--opt-level must be O1 or O2"),
    (["--loss-scale", "big"], "--loss-scale must be a positive number, or 'dynamic' (or -1)"),
    (["--loss-scale", "-4"], "--loss-scale must be a positive number, or 'dynamic' (or -1)"),
    (["--device", "tpu"], "invalid choice"),
    (["--val-crop-size", "300", "--val-resize-size", "256"], "larger than --val-resize-size"),
    (["--recipe", "nope"], "unknown recipe"),
    (["--crop-scale-min", "0"], "--crop-scale-min"),
    (["--profile-stop"], "needs --profile-steps"),
    (["--bogus-flag"], "unrecognized arguments"),
])
def test_bad_flags(argv, frag, capsys):
    check(["--dummy"] + argv, capsys, frag)


def test_apex_not_installed(capsys, tmp_path):
    check(["--dummy", "--amp", "--amp-impl", "apex", "--output-dir", str(tmp_path)], capsys,
          "apex with amp is not installed", "unrelated")


def test_missing_device(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    check(["--dummy", "--device", "cuda", "--output-dir", str(tmp_path)], capsys, "--device cuda", "sees no CUDA")


def test_npu_without_torch_npu(capsys, tmp_path):
    check(["--dummy", "--device", "npu", "--output-dir", str(tmp_path)], capsys, "torch_npu is not installed")


def test_missing_resume(capsys, tmp_path):
    check(["--dummy", "--resume", str(tmp_path / "nope.pth.tar"), "--output-dir", str(tmp_path)], capsys,
          "does not exist")


@STACK
def test_garbage_resume_is_reported_and_kept(capsys, tmp_path):
    junk = tmp_path / "junk.pth.tar"
    junk.write_bytes(b"this is not a checkpoint")
    check(["--dummy", "--resume", str(junk), "--output-dir", str(tmp_path)], capsys,
          "not a readable PyTorch checkpoint")
    assert junk.read_bytes() == b"this is not a checkpoint"


@STACK
def test_resume_of_other_arch(capsys, tmp_path):
    import torchvision
    path = tmp_path / "r18.pth.tar"
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": torchvision.models.resnet18().state_dict()}, str(path))
    check(["--dummy", "-a", "resnet50", "--resume", str(path), "--output-dir", str(tmp_path)], capsys,
          "checkpoint of --arch resnet18, not resnet50")


@STACK
def test_weights_file_as_resume(capsys, tmp_path):
    import torchvision
    path = tmp_path / "w.pth"
    torch.save(torchvision.models.resnet18().state_dict(), str(path))
    check(["--dummy", "-a", "resnet18", "--resume", str(path), "--output-dir", str(tmp_path)], capsys,
          "weights file, not a training checkpoint", "--pretrained")


@STACK
def test_pretrained_that_does_not_fit(capsys, tmp_path, shapes):
    import torchvision
    path = tmp_path / "w.pth"
    torch.save(torchvision.models.resnet18(num_classes=1000).state_dict(), str(path))
    check([shapes, "-a", "resnet18", "--pretrained", str(path), "--output-dir", str(tmp_path / "o")] + SMALL,
          capsys, "do not fit --arch resnet18 with 10 classes", "fc.weight")


def test_batch_not_dividing_over_processes(capsys):
    check(["--dummy", "-b", "10", "--world-size", "3", "--rank", "0"], capsys, "does not divide over 3 processes")


@pytest.mark.parametrize("value,frag", [("0-x", "not a device id"), ("3-1", "runs backwards"), ("0,0", "twice")])
def test_bad_device_list(value, frag, capsys):
    check(["--dummy", "--device-list", value], capsys, frag)


def test_output_dir_is_a_file(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep me")
    check(["--dummy", "--output-dir", str(f)], capsys, "is a file")
    assert f.read_text() == "keep me"


# Runs an entry point (a script path, or -m module) in a fresh interpreter, then prints as its last line
# which of torch and torchvision it imported.
_IMPORT_PROBE = """
import json, runpy, sys
target, sys.argv = sys.argv[1], sys.argv[1:]
code = 0
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
sys.stdout.write("\\n" + json.dumps({"code": code, "torch": "torch" in sys.modules,
                                    "torchvision": "torchvision" in sys.modules}) + "\\n")
"""


MAIN_PY = os.path.join(ROOT, "main.py")


def _imports(target, args):
    proc = subprocess.run([PY, "-c", _IMPORT_PROBE, target] + args, cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS=THREADS))
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_help_and_plain_bad_values_answer_without_importing_torch(tmp_path):
    """--help and a bad value are answered before torch is imported (seconds on every start)."""
    got, _ = _imports(MAIN_PY, ["--help"])
    assert got == {"code": 0, "torch": False, "torchvision": False}
    got, err = _imports(MAIN_PY, [str(tmp_path), "--epochs", "0"])
    assert got == {"code": 2, "torch": False, "torchvision": False} and "--epochs" in err
    got, err = _imports(MAIN_PY, [str(tmp_path), "--device", "tpu"])
    assert got["code"] == 2 and not got["torch"] and "tpu" in err
    got, err = _imports("modelzoo.drivers", ["full", "8p", "--data_path=" + str(tmp_path), "--device=tpu"])
    assert got == {"code": 2, "torch": False, "torchvision": False} and "--device must be" in err
    got, err = _imports("modelzoo.drivers", ["full", "8p", "--data_path=" + str(tmp_path), "--rank_size=0"])
    assert got == {"code": 2, "torch": False, "torchvision": False} and "--rank_size" in err


@STACK
def test_a_run_of_this_projects_model_does_not_import_torchvision(shapes, tmp_path):
    """tiny_cnn (and the _npu variants) with the CPU data backend need nothing of torchvision, whose import
    costs seconds in every process."""
    got, err = _imports(MAIN_PY, [shapes, "-a", "tiny_cnn", "--epochs", "1", "-b", "40", "--output-dir",
                                  str(tmp_path / "o")] + SMALL)
    assert got == {"code": 0, "torch": True, "torchvision": False}, err
    with open(str(tmp_path / "o" / "summary.json")) as f:
        s = json.load(f)
    assert s["status"] == "ok" and s["versions"]["torchvision"]  # the version is still reported
