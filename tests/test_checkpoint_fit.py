"""Whether a file fits the model is decided by the plan, before any rank starts, for every way a checkpoint enters a
run: --resume, --evaluate, --pretrained FILE. A file of another classifier size (or --arch) is one line, exit 2,
and nothing of the earlier run is overwritten; torchvision's published weights keep their rule (another class count:
the backbone loads, the classifier starts anew)."""
import hashlib
import os

import pytest
import torch

from conftest import SMALL, STACK, assert_one_line_error, dataset, read_summary, run_main
from trainer.device import torch_load

pytestmark = [STACK, pytest.mark.timeout(300)]

BASE = ["-a", "resnet18", "--device", "cpu", "-b", "8", "--max-steps-per-epoch", "2"] + SMALL


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A data set of 3 classes (the checkpoints below are trained on 10)."""
    return dataset(tmp_path_factory, "three", 3, 8, 4, seed=3)


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    """A finished one-epoch run on the 10 classes of ``shapes``: its folder."""
    out = str(tmp_path_factory.mktemp("ten") / "run")
    r = run_main([shapes] + BASE + ["--epochs", "1", "--output-dir", out, "--seed", "1"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_summary(out)["num_classes"] == 10
    return out


def _digests(folder):
    out = {}
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.mark.parametrize("how", ["resume", "resume-spawn", "evaluate", "pretrained"])
def test_a_checkpoint_of_another_class_count_is_one_line(how, trained, three, tmp_path):
    ckpt = os.path.join(trained, "checkpoint.pth.tar")
    before = _digests(trained)
    out = str(tmp_path / "next")
    args = {"resume": ["--resume", ckpt, "--epochs", "2", "--output-dir", trained],
            "resume-spawn": ["--resume", ckpt, "--epochs", "2", "--output-dir", trained,
                             "--multiprocessing-distributed", "--device-list", "0,1"],
            "evaluate": ["--evaluate", "--resume", ckpt, "--output-dir", out],
            "pretrained": ["--pretrained", ckpt, "--epochs", "1", "--output-dir", out]}[how]
    r = run_main([three] + BASE + args)
    line = assert_one_line_error(r, ckpt, "fit --arch resnet18 with 3 classes (the data's class folders)",
                                 "fc.weight", "(10, 512)", "(3, 512)")
    if how != "pretrained":  # a training checkpoint says what it was trained for
        assert "trained with 10 classes" in line, line
    assert _digests(trained) == before  # the earlier run is as it was
    assert not os.path.exists(out)  # nothing written


def test_num_classes_makes_the_checkpoint_fit_and_the_run_continues(trained, three, tmp_path):
    """The fix the line names: --num-classes 10 on data of 3 class folders resumes the 10-class checkpoint."""
    out = str(tmp_path / "next")
    r = run_main([three] + BASE + ["--resume", os.path.join(trained, "checkpoint.pth.tar"), "--epochs", "2",
                                   "--num-classes", "10", "--output-dir", out])
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_summary(out)
    assert s["status"] == "ok" and s["num_classes"] == 10 and s["epochs_completed"] == 2, s


def test_published_weights_of_another_class_count_load_their_backbone(three, tmp_path):
    """--pretrained alone: torchvision's 1000-class weights (placed in torch's cache, as a user without network
    does) on 3 classes: the plan notes that the classifier starts anew, and the run trains with the backbone."""
    import models
    import torchvision
    url = models.published_weights_url("resnet18")
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.manual_seed(0)
    published = torchvision.models.resnet18(num_classes=1000).state_dict()
    torch.save(published, str(cache / os.path.basename(url.split("?")[0])))
    out = str(tmp_path / "run")
    r = run_main([three] + BASE + ["--pretrained", "--epochs", "1", "--lr", "0", "--output-dir", out],
                 env={"TORCH_HOME": str(tmp_path / "torch_home")})
    assert r.returncode == 0, r.stderr[-2000:]
    s = read_summary(out)
    assert s["status"] == "ok", s
    assert any("torchvision's weights are for 1000 classes and this model has 3" in n for n in s["notes"]), s["notes"]
    # lr 0: the backbone is the published one after training, the classifier is 3-wide
    saved = torch_load(os.path.join(out, "checkpoint.pth.tar"), map_location="cpu", weights_only=False)["state_dict"]
    assert torch.equal(saved["conv1.weight"], published["conv1.weight"])
    assert tuple(saved["fc.weight"].shape) == (3, 512)
