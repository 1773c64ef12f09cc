"""The digits data set (tools/make_dataset.py --digits) and the smallest run of bench/digits_recipes.py."""
import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import ONCE, PY, ROOT, THREADS, assert_call_error
from tools import make_dataset

pytestmark = [ONCE, pytest.mark.bench]  # the script's plumbing; what it times has its own stack tests

try:
    import sklearn  # noqa: F401
    HAVE_SKLEARN = True
except ImportError:
    HAVE_SKLEARN = False
needs_sklearn = pytest.mark.skipif(not HAVE_SKLEARN, reason="scikit-learn (which ships the digits) is not installed")


def listing(root):
    """{split/class: sorted file names} of an image folder."""
    out = {}
    for split in ("train", "val"):
        for name in sorted(os.listdir(os.path.join(root, split))):
            out[split + "/" + name] = sorted(os.listdir(os.path.join(root, split, name)))
    return out


def scans(counts, seed=0):
    """Digit-like arrays: ``counts[k]`` scans of 8x8 pixels with values 0-16 for class k."""
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.full(n, k) for k, n in enumerate(counts)])
    rng.shuffle(labels)
    return rng.integers(0, 17, size=(len(labels), 8, 8)).astype(np.float64), labels


@pytest.mark.timeout(60)
def test_write_digits_split_is_stratified_and_fixed_by_the_seed(tmp_path):
    images, labels = scans([10, 11, 12, 15, 20])
    counts = make_dataset.write_digits(str(tmp_path / "a"), images, labels, size=16, val_fraction=0.2, seed=3)
    assert counts == {"train": 55, "val": 13}
    a = listing(str(tmp_path / "a"))
    for k, n in enumerate([10, 11, 12, 15, 20]):
        name = make_dataset.wnid(k)
        assert len(a["val/" + name]) == int(round(0.2 * n)) and len(a["train/" + name]) + len(a["val/" + name]) == n
        for f in a["train/" + name] + a["val/" + name]:  # each file in its own class's folder, named by its index
            assert labels[int(f.split("_")[1].split(".")[0])] == k
    img = Image.open(os.path.join(str(tmp_path / "a"), "train", name, a["train/" + name][0]))
    assert img.size == (16, 16) and img.mode == "L" and img.format == "PNG"
    make_dataset.write_digits(str(tmp_path / "b"), images, labels, size=16, val_fraction=0.2, seed=3)
    assert listing(str(tmp_path / "b")) == a
    make_dataset.write_digits(str(tmp_path / "c"), images, labels, size=16, val_fraction=0.2, seed=4)
    assert listing(str(tmp_path / "c")) != a


@pytest.mark.timeout(60)
def test_digits_bad_input(tmp_path, capsys):
    out = tmp_path / "d"
    assert_call_error(make_dataset.main, [out, "--digits", "--photos"], capsys, "--digits", "--photos")
    assert_call_error(make_dataset.main, [out, "--digits", "--val-fraction", "1.5"], capsys, "--val-fraction")
    assert not out.exists()


@needs_sklearn
@pytest.mark.timeout(120)
def test_digits_export(tmp_path, capsys):
    from sklearn.datasets import load_digits
    target = load_digits().target
    assert make_dataset.main([str(tmp_path / "d"), "--digits", "--size", "16"]) == 0
    capsys.readouterr()
    d = listing(str(tmp_path / "d"))
    assert sorted(d) == ["{}/{}".format(s, make_dataset.wnid(k)) for s in ("train", "val") for k in range(10)]
    assert sum(len(v) for k, v in d.items() if k.startswith("train/")) == 1438
    assert sum(len(v) for k, v in d.items() if k.startswith("val/")) == 359
    for key, files in d.items():
        k = int(key.split("/n")[1]) - 1000
        assert all(target[int(f.split("_")[1].split(".")[0])] == k for f in files)  # sklearn's label
        if key.startswith("val/"):
            assert len(files) == int(round(0.2 * (target == k).sum()))
    assert make_dataset.main([str(tmp_path / "e"), "--digits", "--size", "16"]) == 0
    assert listing(str(tmp_path / "e")) == d


@pytest.mark.timeout(400)
def test_bench_smoke(tmp_path):
    """--smoke: every part of the bench runs and its JSON has its fields (on the real digits when scikit-learn
    is installed, else on digit-like scans written the same way)."""
    work = tmp_path / "work"
    args = [PY, "-m", "bench.digits_recipes", "--smoke", "--work-dir", str(work), "--json", str(tmp_path / "r.json")]
    if not HAVE_SKLEARN:
        data = str(tmp_path / "scans")
        make_dataset.write_digits(data, *scans([40] * 10), size=64)  # 80 val images: two batches of 64
        args += ["--data", data]
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(str(tmp_path / "r.json")) as f:
        r = json.load(f)
    assert r["smoke"] and r["epochs_fast"] == 1 and r["epochs_examples"] == 2
    assert r["machine"]["cores"] >= 1 and r["machine"]["torch"]
    (seed,) = r["accuracy"]["seeds"]
    assert len(seed["runs"]["examples"]["curve"]) == 2 and len(seed["runs"]["fast"]["curve"]) == 1
    assert seed["target_acc1"] == seed["runs"]["examples"]["curve"][-1]["acc1"]
    assert seed["runs"]["fast"]["config"]["epochs"] == 1 and seed["runs"]["examples"]["config"]["epochs"] == 2
    assert seed["examples_seconds"] > 0 and seed["ratio_whole_run"] > 0
    assert (seed["fast_epochs_to_target"] is None) == (seed["ratio_to_target"] is None)
    assert isinstance(r["accuracy"]["claim_holds"], bool)
    rows = r["techniques"]
    for name in ("plain", "model-ema, every step", "model-ema, every 32 steps (derived)", "val-tta flip",
                 "fast (all)"):
        assert rows[name]["step_ms"] > 0 and rows[name]["ratio"] > 0, name
    assert rows["plain"]["ratio"] == 1.0
    assert rows["val-tta flip"]["val_ratio"] > 0
    (ramp,) = [name for name in rows if name.startswith("resolution ramp")]
    assert rows[ramp]["sizes"] == [64]  # one epoch of the recipe at 64 px: no ramp, the size given throughout
    assert rows[ramp]["ratio"] == 1.0 and not any(name.startswith("plain at") for name in rows)
    assert "| plain |" in proc.stdout and "median over seeds" in proc.stdout


@pytest.mark.timeout(300)
def test_bench_lr_smoke(tmp_path):
    """--only lr --smoke: --recipe fast at a batch FFCV did not publish, once with each rule's LR and 0.1; the JSON
    names each LR's source and the recipe's own rule is one of them."""
    work = tmp_path / "work"
    args = [PY, "-m", "bench.digits_recipes", "--only", "lr", "--smoke", "--work-dir", str(work), "--json",
            str(tmp_path / "r.json")]
    if not HAVE_SKLEARN:
        data = str(tmp_path / "scans")
        make_dataset.write_digits(data, *scans([8] * 10), size=32)
        args += ["--data", data]
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(str(tmp_path / "r.json")) as f:
        r = json.load(f)
    assert r["lr_batches"] == [16] and r["lr_epochs"] == 1 and "accuracy" not in r and "techniques" not in r
    b = r["lr"]["16"]
    by = b["by_name"]
    assert by["linear"]["lr"] == pytest.approx(0.5 * 16 / 1024, rel=1e-3)
    assert by["square root"]["lr"] == pytest.approx(0.5 * (16 / 1024.0) ** 0.5, rel=1e-3)
    assert by["examples' default"]["lr"] == 0.1
    from trainer import recipes
    assert by["recipe rule"]["lr"] == pytest.approx(recipes.scale("resnet18_ffcv_16", 1, {"batch_size": 16})[0]["lr"],
                                                    rel=1e-3)
    assert len(b["lrs"]) == len({row["lr"] for row in b["lrs"]}) >= 3
    for row in b["lrs"]:
        assert 0 <= row["final_acc1"] <= row["best_acc1"] <= 100 and row["train_seconds"] > 0
    assert b["tuned_lr"] in [row["lr"] for row in b["lrs"]]
    assert "| 16 | 0.1 | examples' default" in proc.stdout
