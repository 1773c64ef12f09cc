"""A new run in a folder that holds an earlier one (main.py without --output-dir, the drivers' default folder): what
moves to previous_runs/STAMP (what the earlier run recorded, nothing else), the inputs of the new run that stay
readable (one process, spawned ranks, a ModelZoo loop), the bound on previous_runs, and the drivers' folder."""
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import (ONCE, PY, RANKS, ROOT, SMALL, child_env, dataset, finish, free_port, read_lines, read_summary,
                      run_main)
from test_drivers import TINY_IMAGES, driver_env, run_driver
from trainer.record.earlier import EARLIER, KEEP_EARLIER_RUNS

pytestmark = [ONCE, pytest.mark.timeout(400)]

RUN = ["-a", "tiny_cnn", "--epochs", "1", "-b", "8", "--lr", "0.05", "--seed", "0", "--device", "cpu"] + SMALL


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """4 classes x 8 train / 4 val images: one epoch is 4 steps."""
    return dataset(tmp_path_factory, "few", 4, 8, 4, seed=7)


def main_in(folder, data, *args, **kw):
    """main.py run in ``folder`` without --output-dir (ModelZoo's way: its output folder is the current one)."""
    proc = run_main([data] + RUN + list(args), cwd=str(folder), timeout=240, **kw)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def digest(path):
    with open(str(path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def stamps(folder):
    root = os.path.join(str(folder), EARLIER)
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def tree(folder):
    """Every file under ``folder``, relative to it."""
    out = []
    for dirpath, _, files in os.walk(str(folder)):
        out += [os.path.relpath(os.path.join(dirpath, f), str(folder)) for f in files]
    return sorted(out)


def assert_reads_the_earlier_checkpoint(folder, first, first_ckpt, proc):
    """The second run trained to ok from the first run's checkpoint, which it recorded where that file now is;
    the first run's files are whole in previous_runs/STAMP."""
    second = read_summary(folder)
    assert second["status"] == "ok", second["error"]
    [stamp] = stamps(folder)
    kept = os.path.join(str(folder), EARLIER, stamp)
    read = second["config"]["pretrained"]
    assert os.path.realpath(os.path.join(str(folder), read)) == os.path.realpath(
        os.path.join(kept, "checkpoint.pth.tar")), read
    assert digest(os.path.join(kept, "checkpoint.pth.tar")) == first_ckpt  # the file read: the first run's
    assert "is one of the earlier files: it stays in place, and is kept with them as" in proc.stdout
    assert sorted(os.listdir(kept)) == first["files"]
    assert read_summary(kept) == first
    assert digest(os.path.join(str(folder), "checkpoint.pth.tar")) != first_ckpt  # the second run's own
    return second


def test_a_second_run_starts_from_the_first_runs_checkpoint_in_one_process(few, tmp_path):
    main_in(tmp_path, few)
    first, first_ckpt = read_summary(tmp_path), digest(tmp_path / "checkpoint.pth.tar")
    assert first["files"] == ["checkpoint.pth.tar", "metrics.jsonl", "model_best.pth.tar", "step_losses.csv",
                              "summary.json", "tensorboard"]
    proc = main_in(tmp_path, few, "--pretrained", "checkpoint.pth.tar")
    second = assert_reads_the_earlier_checkpoint(tmp_path, first, first_ckpt, proc)
    assert second["files"] == first["files"]  # its own files, the checkpoint it replaced included


@RANKS
def test_two_spawned_ranks_start_from_the_first_runs_checkpoint(few, tmp_path):
    main_in(tmp_path, few)
    first, first_ckpt = read_summary(tmp_path), digest(tmp_path / "checkpoint.pth.tar")
    proc = main_in(tmp_path, few, "--pretrained", str(tmp_path / "checkpoint.pth.tar"), "--multiprocessing-distributed",
                   "--device-list", "0,1", "--port", "0")
    second = assert_reads_the_earlier_checkpoint(tmp_path, first, first_ckpt, proc)
    assert second["world_size"] == 2


@RANKS
def test_a_modelzoo_loop_of_two_ranks_starts_from_the_first_runs_checkpoint(few, tmp_path):
    """The guides' shell loop: one main.py per device in the same folder, started together; rank 0 moves the
    earlier run while rank 1 reads its --pretrained."""
    main_in(tmp_path, few)
    first, first_ckpt = read_summary(tmp_path), digest(tmp_path / "checkpoint.pth.tar")
    port, procs = str(free_port()), []
    for rank in range(2):
        env = child_env(RANK_ID=str(rank), RANK_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=port)
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        procs.append(subprocess.Popen([PY, os.path.join(ROOT, "main.py"), few, "--modelzoo", "off", "--pretrained",
                                       "checkpoint.pth.tar"] + RUN, cwd=str(tmp_path), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [finish(p, timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    second = assert_reads_the_earlier_checkpoint(tmp_path, first, first_ckpt,
                                                 subprocess.CompletedProcess([], 0, outs[0][0], outs[0][1]))
    assert second["world_size"] == 2


def test_only_the_files_the_earlier_run_wrote_move(few, tmp_path):
    """Files of the user's named like a run's (the old move took them by pattern) stay untouched, also in a
    tensorboard/ folder of theirs that the runs write their events into."""
    mine = {"my_epoch3.pth.tar": "mine", "profile_rank_notes.txt": "notes", os.path.join("tensorboard", "README"): "tb"}
    for name, text in mine.items():
        os.makedirs(os.path.dirname(str(tmp_path / name)), exist_ok=True)
        (tmp_path / name).write_text(text)
    inodes = {name: os.stat(str(tmp_path / name)).st_ino for name in mine}
    main_in(tmp_path, few, "--checkpoint-freq", "1", "--profile-steps", "1:2")
    first = read_summary(tmp_path)
    events = [f for f in first["files"] if f.startswith("tensorboard" + os.sep)]
    assert len(events) == 1 and "tensorboard" not in first["files"]  # its event file, not the user's folder
    assert {"checkpoint_epoch1.pth.tar", "profile_rank0.json", "profile_ops_rank0.txt"} <= set(first["files"])
    main_in(tmp_path, few)
    [stamp] = stamps(tmp_path)
    assert tree(tmp_path / EARLIER / stamp) == first["files"]
    for name, text in mine.items():
        assert (tmp_path / name).read_text() == text and os.stat(str(tmp_path / name)).st_ino == inodes[name]
    assert all((tmp_path / f).exists() for f in read_summary(tmp_path)["files"])
    assert not (tmp_path / events[0]).exists() and (tmp_path / EARLIER / stamp / events[0]).is_file()


def test_an_earlier_run_with_another_checkpoint_prefix_moves_whole(few, tmp_path):
    main_in(tmp_path, few, "--checkpoint-nameprefix", "shufflenet", "--checkpoint-freq", "1")
    first = read_summary(tmp_path)
    assert {"shufflenet.pth.tar", "shufflenet_epoch1.pth.tar"} <= set(first["files"])
    proc = main_in(tmp_path, few)
    [stamp] = stamps(tmp_path)
    assert sorted(os.listdir(str(tmp_path / EARLIER / stamp))) == first["files"]
    assert not glob.glob(str(tmp_path / "shufflenet*"))
    assert "held an earlier run" in proc.stdout and read_summary(tmp_path)["status"] == "ok"


def test_an_older_versions_run_is_moved_by_the_names_it_writes(few, tmp_path):
    """A summary.json without "files" (this project before it listed them): its checkpoints (its prefix and
    --checkpoint-freq), metrics.jsonl and TensorBoard event files move, a note says how; other files stay."""
    main_in(tmp_path, few, "--checkpoint-nameprefix", "net", "--checkpoint-freq", "1")
    record = read_summary(tmp_path)
    moved = record.pop("files")
    with open(str(tmp_path / "summary.json"), "w") as f:
        json.dump(record, f)
    (tmp_path / "net_epoch7.pth.tar").write_text("not of that run: it trained 1 epoch")
    (events,) = os.listdir(str(tmp_path / "tensorboard"))
    proc = main_in(tmp_path, few)
    assert "an older version's run, whose summary.json lists no files: moved by the names that version writes" \
        in proc.stdout
    [stamp] = stamps(tmp_path)
    assert tree(tmp_path / EARLIER / stamp) == sorted([f for f in moved if f != "tensorboard"] +
                                                      [os.path.join("tensorboard", events)])
    assert events not in os.listdir(str(tmp_path / "tensorboard"))
    assert (tmp_path / "net_epoch7.pth.tar").read_text() == "not of that run: it trained 1 epoch"


def test_a_run_killed_before_its_summary_is_moved_by_its_lock(shapes, few, tmp_path):
    """kill -9 in the first epoch: no summary.json yet; its run.lock lists what it may write, and the next run
    (which takes the stale lock over) moves the TensorBoard folder it had made."""
    proc = subprocess.Popen([PY, os.path.join(ROOT, "main.py"), shapes, "-a", "tiny_cnn", "--epochs", "1", "-b", "2",
                             "--device", "cpu", "--train-crop-size", "32", "--val-resize-size", "32",
                             "--val-crop-size", "32", "-j", "0", "-p", "1"], cwd=str(tmp_path), env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        read_lines(proc, lambda lines: any(ln.startswith("Epoch: [0][") for ln in lines), timeout=120)
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    assert not (tmp_path / "summary.json").exists()  # 200 steps: the first epoch had not ended
    with open(str(tmp_path / "run.lock")) as f:
        assert "tensorboard" in json.load(f)["files"]
    (events,) = os.listdir(str(tmp_path / "tensorboard"))
    proc = main_in(tmp_path, few)
    assert "took over the lock of" in proc.stdout
    [stamp] = stamps(tmp_path)
    assert sorted(os.listdir(str(tmp_path / EARLIER / stamp))) == ["step_losses.csv", "tensorboard"]
    assert os.listdir(str(tmp_path / EARLIER / stamp / "tensorboard")) == [events]
    assert events not in os.listdir(str(tmp_path / "tensorboard"))  # the new run's folder holds its own events


def test_previous_runs_keeps_the_newest_runs(few, tmp_path):
    """Two real runs give one earlier run; copies of it stand for older ones (stamped earlier), with a folder of the
    user's beside them. The third run moves the second aside and keeps the newest KEEP_EARLIER_RUNS, the oldest
    one too: it reads its --pretrained from there."""
    main_in(tmp_path, few)
    main_in(tmp_path, few)
    [real] = stamps(tmp_path)
    root = tmp_path / EARLIER
    # stamps of one second carry -N: -10 is newer than -2
    older = ["20000101-000000", "20000102-000000-2", "20000102-000000-10", "20000103-000000", "20000104-000000"]
    for name in older:
        shutil.copytree(str(root / real), str(root / name))
    (root / "mine").mkdir()
    assert KEEP_EARLIER_RUNS == 5 and len(stamps(tmp_path)) == 7
    proc = main_in(tmp_path, few, "--pretrained", str(root / older[0] / "checkpoint.pth.tar"))
    [newest] = [s for s in stamps(tmp_path) if s not in older + [real, "mine"]]
    # the newest five, the one it reads from, the user's folder; "-2" is removed
    assert stamps(tmp_path) == sorted([older[0]] + older[2:] + [real, newest, "mine"])
    assert "keeps {} beyond the newest {}: this run reads from it".format(older[0], KEEP_EARLIER_RUNS) in proc.stdout
    assert "keeps the newest {} earlier runs: removed".format(KEEP_EARLIER_RUNS) in proc.stdout
    assert read_summary(tmp_path)["status"] == "ok"


# ---------------------------------------------------------------- the drivers' default output folder


@pytest.fixture
def default_output():
    """The drivers' default output folder of a device id no other test uses (test/output/<id>), removed after."""
    device_id = str(70000 + os.getpid() % 10000)
    folder = os.path.join(ROOT, "test", "output", device_id)
    for path in [folder] * os.path.isdir(folder) + glob.glob(folder + ".prev-*"):
        shutil.rmtree(path)
    yield device_id, folder
    for path in [folder] + glob.glob(folder + ".prev-*"):
        shutil.rmtree(path, ignore_errors=True)


def test_the_driver_starts_from_the_checkpoint_and_baseline_in_its_own_folder(few, default_output):
    """train_full_1p.sh after a full run, as its next step: --ckpt_path and --baseline in the default folder, which
    the driver moves aside first."""
    device_id, folder = default_output
    args = ["--data_path=" + few, "--arch=tiny_cnn", "--device=cpu", "--batch_size=8", "--epochs=1", "--workers=0",
            "--device_id=" + device_id]
    proc = run_driver("train_full_1p.sh", args + TINY_IMAGES, timeout=240, env=driver_env())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    first_ckpt = digest(os.path.join(folder, "checkpoint.pth.tar"))
    baseline = os.path.join(folder, "baseline.json")
    with open(baseline, "w") as f:
        json.dump([{"arch": "tiny_cnn", "rank_size": 1, "acc1": 0.01, "fps": 0.001}], f)
    proc = run_driver("train_full_1p.sh", args + ["--ckpt_path=" + os.path.join(folder, "checkpoint.pth.tar"),
                                                  "--baseline=" + baseline] + TINY_IMAGES, timeout=240,
                      env=driver_env())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "acceptance: PASS (tiny_cnn 1p" in proc.stdout
    [moved] = glob.glob(folder + ".prev-*")
    assert os.path.isfile(baseline) and not os.path.exists(os.path.join(moved, "baseline.json"))  # it stays
    s = read_summary(folder)
    assert s["status"] == "ok" and s["config"]["pretrained"] == os.path.join(moved, "checkpoint.pth.tar")
    assert digest(s["config"]["pretrained"]) == first_ckpt
    assert "is the earlier run's checkpoint.pth.tar: it went with that run to {}".format(
        os.path.join(moved, "checkpoint.pth.tar")) in proc.stdout
    assert {"train_0.log", "summary.json", "tiny_cnn_bs8_1p_acc.log"} <= set(os.listdir(moved))
