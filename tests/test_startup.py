"""A run's start, as a user meets it: every check of its inputs comes before anything in the output folder moves
(main.py and the drivers), a move says so as it happens, errors that need no torch come before torch is imported,
what a run writes in the repository root is ignored by git, and messages count as English does."""
import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import ONCE, PY, ROOT, SMALL, dataset, read_summary, run_main
from test_bad_input import MAIN_PY, _imports
from test_drivers import TINY_IMAGES, driver_env, run_driver
from trainer import recipes, zoo
from trainer.record import earlier, folders, lock, profiling

pytestmark = [ONCE, pytest.mark.clients, pytest.mark.timeout(300)]

RUN = ["-a", "tiny_cnn", "--epochs", "1", "-b", "8", "--lr", "0.05", "--seed", "0", "--device", "cpu"] + SMALL


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """4 classes x 8 train / 4 val images: one epoch is 4 steps."""
    return dataset(tmp_path_factory, "few", 4, 8, 4, seed=7)


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Data sets that fail the layout checks, by name: a class folder of train/ without images, a val/ without one
    of train/'s classes."""
    out = {}
    root = dataset(tmp_path_factory, "empty_class", 4, 8, 4, seed=8)
    for f in os.listdir(os.path.join(root, "train", "n00001002")):
        os.remove(os.path.join(root, "train", "n00001002", f))
    out["empty class"] = (root, "holds no images")
    root = dataset(tmp_path_factory, "val_lacks", 4, 8, 4, seed=9)
    shutil.rmtree(os.path.join(root, "val", "n00001003"))
    out["val lacks"] = (root, "val/ lacks class folder(s) that train/ has: n00001003")
    return out


def digests(folder):
    """{path relative to ``folder``: sha256} of every file under it."""
    out = {}
    for dirpath, _, files in os.walk(str(folder)):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, str(folder))] = hashlib.sha256(f.read()).hexdigest()
    return out


def first_run(folder, data):
    """main.py in ``folder`` without --output-dir (pytorch/examples' and ModelZoo's way): trained, its files there."""
    proc = run_main([data] + RUN, cwd=str(folder), timeout=240)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert read_summary(folder)["status"] == "ok"
    return digests(folder)


def one_error_line(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


# ---------------------------------------------------------------- every check before anything moves


def test_a_second_run_that_fails_a_check_moves_nothing_of_the_first(few, broken, tmp_path):
    """An earlier run in the folder, then second runs that each fail one check of their inputs (the data's layout,
    the class count, a file named, a flag against the network, a count against the epoch): each stops with its one
    line, and the first run's checkpoints, summary and tensorboard/ stay where they are, byte for byte."""
    before = first_run(tmp_path, few)
    assert {"checkpoint.pth.tar", "model_best.pth.tar", "summary.json", "metrics.jsonl"} <= set(before)
    assert any(p.startswith("tensorboard" + os.sep) for p in before)
    cases = [([broken["empty class"][0]], broken["empty class"][1]),
             ([broken["val lacks"][0]], broken["val lacks"][1]),
             ([few, "--num-classes", "2"], "--num-classes 2 is below the 4 class folders"),
             ([few, "--pretrained", str(tmp_path / "weights.pth")], "does not exist"),
             ([few, "--zero-init-residual"], "--zero-init-residual applies to torchvision's ResNets"),
             ([few, "--skip_steps", "4"], "--skip_steps 4 leaves no step of an epoch of 4 steps")]
    for args, fragment in cases:
        proc = run_main(args + RUN, cwd=str(tmp_path), timeout=240)
        one_error_line(proc, fragment)
        assert "held an earlier run" not in proc.stdout, args
        assert not os.path.exists(tmp_path / earlier.EARLIER), args
        assert digests(tmp_path) == before, args


def test_a_move_prints_its_note_when_it_happens(few, tmp_path_factory, tmp_path):
    """A second run that moves the first prints the note as it moves, before the run's first line, once; the
    summary keeps it. One that then fails (an image that cannot be decoded: known only when it is read) has
    printed it all the same, and the first run's files are whole where it says."""
    first_run(tmp_path, few)
    proc = run_main([few] + RUN, cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    moved = [i for i, ln in enumerate(lines) if ln.startswith("note: --output-dir '.' held an earlier run: ")]
    header = [i for i, ln in enumerate(lines) if ln.startswith("=> tiny_cnn on cpu")]
    assert len(moved) == 1 and header and moved[0] == 0 < header[0], lines[:12]
    assert lines[0][len("note: "):] in read_summary(tmp_path)["notes"]

    bad = dataset(tmp_path_factory, "undecodable", 4, 8, 4, seed=7)
    with open(os.path.join(bad, "train", "n00001000", sorted(os.listdir(os.path.join(bad, "train", "n00001000")))[0]),
              "wb") as f:
        f.write(b"not an image")
    second = digests(tmp_path)
    proc = run_main([bad] + RUN, cwd=str(tmp_path), timeout=240)
    one_error_line(proc, "cannot decode image")
    [note] = [ln for ln in proc.stdout.splitlines() if "held an earlier run" in ln]
    stamp = re.search(r"moved to \./previous_runs/(\S+) ", note).group(1)
    kept = digests(tmp_path / earlier.EARLIER / stamp)
    assert kept == {p: d for p, d in second.items() if not p.startswith(earlier.EARLIER + os.sep)}
    assert len(os.listdir(str(tmp_path / earlier.EARLIER))) == 2  # the first run's, then the second's


def test_a_driver_run_that_fails_a_check_leaves_the_earlier_folder_in_place(few, broken, tmp_path):
    """The drivers move an earlier output folder aside (<dir>.prev-STAMP) before the ranks start: main.py's checks
    of the inputs come first there too."""
    out = str(tmp_path / "out")
    args = ["--arch=tiny_cnn", "--device=cpu", "--batch_size=8", "--epochs=1", "--workers=0", "--output_dir=" + out]
    proc = run_driver("train_full_1p.sh", ["--data_path=" + few] + args + TINY_IMAGES, timeout=240,
                      env=driver_env())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    before = digests(out)
    assert "summary.json" in before and "checkpoint.pth.tar" in before
    proc = run_driver("train_full_1p.sh", ["--data_path=" + broken["empty class"][0]] + args + TINY_IMAGES,
                      timeout=240, env=driver_env())
    one_error_line(proc, "holds no images")
    assert "were moved to" not in proc.stdout
    assert not [p for p in os.listdir(str(tmp_path)) if ".prev-" in p] and digests(out) == before


# ---------------------------------------------------------------- errors that need no torch, before torch


def test_input_errors_are_answered_before_torch_is_imported(few, broken, tmp_path):
    """The data set's layout and classes, the files named, the output folder, the launch's numbers: each error is
    its one line from a process that never imported torch."""
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    out = ["--output-dir", str(tmp_path / "o"), "-a", "tiny_cnn", "--device", "cpu"]
    cases = [([str(tmp_path / "nowhere")] + out, "data directory '{}' does not exist".format(tmp_path / "nowhere")),
             ([str(a_file)] + out, "is not a directory"),
             ([broken["empty class"][0]] + out, broken["empty class"][1]),
             ([broken["val lacks"][0]] + out, broken["val lacks"][1]),
             ([few, "--num-classes", "3"] + out, "--num-classes 3 is below the 4 class folders"),
             ([few, "--pretrained", str(tmp_path / "w.pth")] + out, "weights file '{}' does not exist".format(
                 tmp_path / "w.pth")),
             ([few, "--resume", str(tmp_path)] + out, "checkpoint '{}' is not a file".format(tmp_path)),
             ([few, "--output-dir", str(a_file), "-a", "tiny_cnn"], "is a file, not a folder"),
             ([few, "--port", "70000"] + out, "--port must be 0-65535")]
    for args, fragment in cases:
        got, err = _imports(MAIN_PY, args)
        assert got == {"code": 2, "torch": False, "torchvision": False}, (args, got, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], (args, err[-2000:])
    assert a_file.read_text() == "keep me" and not os.path.exists(str(tmp_path / "o"))


_PARSE_EVERY = """
import json, sys
from trainer import recipes, zoo
from trainer.config import parse_config
data, parsed, blurpool_dropped = sys.argv[1], 0, 0
for device in ("cpu", "npu", "cuda"):
    for arch in ("resnet50", "shufflenet_v2_x1_0", "tiny_cnn"):
        for recipe in [None] + recipes.names():
            argv = [data, "-a", arch, "--device", device] + (["--recipe", recipe] if recipe else [])
            got = parse_config(argv, env={})
            parsed += 1
            blurpool_dropped += any("--blurpool is for ResNets" in note for note in got.notes)
            assert not got.cfg.model.blurpool or arch == "resnet50", argv
    for entry in zoo.ENTRIES:
        for env in ({}, {"RANK_SIZE": "8"}):
            parse_config([data, "--device", device, "--modelzoo", entry], env=env)
            parsed += 1
print(json.dumps({"parsed": parsed, "blurpool_dropped": blurpool_dropped, "torch": "torch" in sys.modules,
                  "torchvision": "torchvision" in sys.modules}))
"""


def test_parsing_every_recipe_and_modelzoo_entry_for_a_named_device_imports_no_torch(few):
    """A command line, any recipe (--blurpool's networks told by name) and either ModelZoo entry parse into their
    config without importing torch or torchvision, for -a of each kind; a ResNet recipe under another -a drops its
    --blurpool with a note, never an error asking to drop a flag the user did not give."""
    proc = subprocess.run([PY, "-c", _PARSE_EVERY, few], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    recipes_count = len(recipes.names())
    assert got["parsed"] == 3 * (3 * (1 + recipes_count) + 2 * len(zoo.ENTRIES)), got
    assert got["blurpool_dropped"] >= 2 * 3, got  # each ResNet recipe under shufflenet and tiny_cnn, at least
    assert not got["torch"] and not got["torchvision"], got


# ---------------------------------------------------------------- the repository root, and counts


def test_a_runs_files_in_the_repository_root_are_ignored_by_git(few, tmp_path):
    """Two runs in a checkout's root with the default --output-dir . (the second moves the first into
    previous_runs/): git sees none of their files. The rules are anchored to the root: the same names elsewhere in
    the tree are not hidden."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "checkout"
    repo.mkdir()
    subprocess.run([git, "init", "-q", str(repo)], check=True, timeout=60)
    shutil.copy(os.path.join(ROOT, ".gitignore"), str(repo / ".gitignore"))
    first_run(repo, few)
    proc = run_main([few] + RUN + ["--checkpoint-freq", "1"], cwd=str(repo), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.isdir(str(repo / earlier.EARLIER)) and os.path.isdir(str(repo / "tensorboard"))

    def untracked():
        status = subprocess.run([git, "status", "--porcelain", "--untracked-files=all"], cwd=str(repo),
                                capture_output=True, text=True, timeout=60, check=True).stdout
        return sorted(ln[3:] for ln in status.splitlines())

    assert untracked() == [".gitignore"]
    # what other runs write there: the lock of a running one, a node's token, a file being written, the profiler's
    others = [lock.LOCK, folders.TOKEN.format(7), ".checkpoint.pth.tar.tmp-12", "eval_summary.json",
              "resnet18_epoch3.pth.tar"] + profiling.files_of(0)[::2]
    for name in others:
        (repo / name).write_text("x")
    os.makedirs(str(repo / profiling.files_of(0)[1]))
    (repo / profiling.files_of(0)[1] / "trace.json").write_text("x")
    assert untracked() == [".gitignore"]
    elsewhere = ["docs/summary.json", "bench/checkpoint.pth.tar", "data/tensorboard/events", "sub/metrics.jsonl"]
    for name in elsewhere:
        os.makedirs(os.path.dirname(str(repo / name)), exist_ok=True)
        (repo / name).write_text("x")
    assert untracked() == sorted([".gitignore"] + elsewhere)


def test_messages_count_one_as_one(tmp_path_factory, tmp_path):
    """One class, one validation image, one step: the log says "1 class", "1 val image", and --skip_steps's error
    "an epoch of 1 step"; nothing says "1 classes" or "1 images"."""
    one = dataset(tmp_path_factory, "one", 1, 8, 1, seed=3)
    proc = run_main([one, "--output-dir", str(tmp_path / "o")] + RUN, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [header] = [ln for ln in proc.stdout.splitlines() if ln.startswith("=> tiny_cnn on cpu")]
    assert "(1 class, 8 train / 1 val image, " in header and "0.0 warm-up epochs" in header, header
    text = proc.stdout + proc.stderr
    assert not re.search(r"\b1 (images|classes|epochs|steps|workers|processes|val images)\b", text), text[-3000:]
    proc = run_main([one, "--output-dir", str(tmp_path / "o2"), "--skip_steps", "1"] + RUN, timeout=240)
    one_error_line(proc, "--skip_steps 1 leaves no step of an epoch of 1 step to time")
