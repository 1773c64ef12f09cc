"""trainer/plan.py: a run decided once, as a function of (cfg, env): the config stays as asked, the plan carries the
decisions, the notes and the files it read; it starts nothing and writes nothing."""
import os
import pickle

import pytest

from conftest import ONCE
from trainer.record import checkpoint
from trainer.config import parse_config
from trainer.device import Device
from trainer.errors import UsageError
from trainer.plan import Plan, plan

pytestmark = [ONCE, pytest.mark.timeout(120)]


def _cfg(*argv):
    return parse_config(["--dummy", "--device", "cpu"] + list(argv), env={}).cfg


def test_the_config_stays_as_asked_and_the_plan_carries_the_decisions(tmp_path):
    out = str(tmp_path / "not-yet")
    cfg = _cfg("--amp", "--dist-backend", "hccl", "--output-dir", out)
    p = plan(cfg, env={})
    assert p.cfg is cfg  # untouched: nothing rebuilt it
    assert (cfg.launch.device, cfg.model.channels_last, cfg.precision.amp_impl, cfg.launch.dist_backend) == \
        ("cpu", None, "auto", "hccl")
    assert p.kind == p.launch.device == "cpu" and p.launch.dist_backend == "gloo"  # hccl is the NPU's library
    assert p.model.channels_last is True and p.precision.amp_impl == "native"  # the CPU's choices
    assert any("--dist-backend hccl is the NPU collective library" in n for n in p.notes)
    assert (p.run, p.data, p.optim) == (cfg.run, cfg.data, cfg.optim)  # the sections decided as asked
    record = p.as_dict()
    assert (record["device"], record["channels_last"], record["amp_impl"]) == ("cpu", True, "native")
    assert cfg.as_dict()["channels_last"] is None
    assert not os.path.exists(out)  # the plan writes nothing
    assert plan(cfg, env={}) == p  # a function of (cfg, env)


def test_device_auto_is_decided_by_the_plan_and_the_config_keeps_auto():
    cfg = parse_config(["--dummy", "--device", "auto"], env={}).cfg
    p = plan(cfg, env={})
    assert cfg.launch.device == "auto" and cfg.as_dict()["device"] == "auto"
    assert p.kind == p.launch.device == Device.resolve_kind("auto") and p.as_dict()["device"] == p.kind


def test_parsings_notes_come_first():
    cfg = _cfg("--dist-backend", "hccl")
    p = plan(cfg, env={}, notes=("parsed",))
    assert p.notes[0] == "parsed" and len(p.notes) == 2


def test_a_spawned_rank_gets_the_plan_of_its_place():
    cfg = _cfg("--multiprocessing-distributed", "--device-list", "0-3", "-b", "8")
    p = plan(cfg, env={})
    assert p.launch.mode == "spawn"
    child = p.placed(device_list=(0, 1, 2, 3), world_size=4, procs_per_node=4, rank=0).placed(local_rank=2, rank=2)
    assert (child.launch.local_rank, child.launch.rank, child.launch.device_index) == (2, 2, 2)
    assert child.cfg is cfg and child.as_dict()["world_size"] == 4 and child.as_dict()["local_rank"] == 2
    with pytest.raises(UsageError, match="does not divide over 4 processes"):
        plan(_cfg("--multiprocessing-distributed", "--device-list", "0-3", "-b", "6"), env={})


def test_the_checkpoint_to_resume_is_read_by_the_plan_and_travels_to_a_spawned_rank_empty(tmp_path):
    out = str(tmp_path)
    import models
    state = {"epoch": 2, "arch": "tiny_cnn", "state_dict": models.get_model("tiny_cnn").state_dict(), "best_acc1": 1.0}
    checkpoint.save(state, os.path.join(out, "checkpoint.pth.tar"))
    p = plan(_cfg("-a", "tiny_cnn", "--resume", "auto", "--output-dir", out, "--epochs", "3"), env={})
    assert p.resume.path == os.path.join(out, "checkpoint.pth.tar") and p.resume._contents["epoch"] == 2
    sent = pickle.loads(pickle.dumps(p))  # what spawn hands a rank
    assert isinstance(sent, Plan) and sent.resume._contents is None and sent.run == p.run
    with pytest.raises(UsageError, match="has completed 2 epoch"):
        plan(_cfg("-a", "tiny_cnn", "--resume", "auto", "--output-dir", out, "--epochs", "2"), env={})


def test_every_input_check_of_the_machine_is_the_plans(tmp_path):
    with pytest.raises(UsageError, match="is a file, not a folder"):
        (tmp_path / "f").write_text("")
        plan(_cfg("--output-dir", str(tmp_path / "f")), env={})
    with pytest.raises(UsageError, match="SyncBatchNorm has no CPU kernel"):
        plan(_cfg("--sync-bn"), env={})
    with pytest.raises(UsageError, match="does not exist"):
        plan(parse_config([str(tmp_path / "nowhere")], env={}).cfg, env={})


def test_a_classifier_smaller_than_the_class_folders_is_refused_before_any_rank_starts(shapes):
    with pytest.raises(UsageError, match="--num-classes 5 is below the 10 class folders in the data"):
        plan(parse_config([shapes, "--device", "cpu", "--num-classes", "5"], env={}).cfg, env={})
    assert plan(parse_config([shapes, "--device", "cpu", "--num-classes", "12"], env={}).cfg,
                env={}).model.num_classes == 12
