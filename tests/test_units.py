"""The pure functions, in this process: LR schedule, launch resolution, the recipe rule, accuracy counts,
device-resident sums, and the rank supervisor on stand-in processes."""
import argparse
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ONCE, STACK, gone
from trainer import recipes
from trainer.record import metrics
from trainer.config import build_parser
from trainer.device import Device
from trainer.job import launch
from trainer.job import ranks as supervision
from trainer.job.placement import Asked, place
from trainer.job.ranks import Interrupted, Ranks, stop_report
from trainer.errors import UsageError
from trainer.optim.schedule import Schedule

pytestmark = [ONCE, pytest.mark.timeout(60)]


# ---------------------------------------------------------------- schedule


def test_step_schedule_is_examples_rule():
    s = Schedule(0.1, "step", 90, 0, 100)
    assert s(0, 0) == 0.1 and s(29, 99) == 0.1
    assert s(30, 0) == pytest.approx(0.01) and s(60, 5) == pytest.approx(0.001)


def test_warmup_ramps_per_step_then_cosine_reaches_zero():
    s = Schedule(1.0, "cosine", 10, 2, 50)  # 100 warm-up steps
    assert s(0, 0) == pytest.approx(1 / 100) and s(1, 49) == pytest.approx(1.0)
    assert s(2, 0) == pytest.approx(1.0)  # the peak right after warm-up
    lrs = [s(e, i) for e in range(2, 10) for i in range(50)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # non-increasing
    assert lrs[-1] == pytest.approx(0.0, abs=1e-3) and s(6, 0) == pytest.approx(0.5, abs=0.01)  # midway


def test_fractional_warmup_and_resume_position():
    s = Schedule(0.4, "cosine", 3, 0.5, 10)
    assert s(0, 4) == pytest.approx(0.4)  # 5 warm-up steps: step index 4 is the last
    assert Schedule(0.4, "cosine", 3, 0.5, 10)(1, 3) == s(1, 3)  # a pure function of the position


# ---------------------------------------------------------------- launch resolution


def ns(*argv):
    return build_parser().parse_args(["--dummy"] + list(argv))


@pytest.mark.parametrize("argv,env,expected", [
    ([], {}, {"mode": "single", "world_size": 1, "rank": 0}),
    (["--multiprocessing-distributed", "--device-list", "0-3"], {},
     {"mode": "spawn", "world_size": 4, "rank": 0, "procs_per_node": 4}),
    (["--multiprocessing-distributed", "--device-list", "0,1", "--world-size", "2", "--rank", "1"], {},
     {"mode": "spawn", "world_size": 4, "rank": 2, "nodes": 2, "node_rank": 1}),
    ([], {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     {"mode": "process", "world_size": 4, "rank": 3, "local_rank": 1, "nodes": 2, "node_rank": 1}),
    ([], {"RANK_ID": "2", "RANK_SIZE": "8"},  # the guides' shell loop
     {"mode": "process", "world_size": 8, "rank": 2, "local_rank": 2}),
    (["--world-size", "2", "--rank", "1"], {}, {"mode": "process", "world_size": 2, "rank": 1}),
    ([], {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}, {"addr": "10.0.0.1", "port": 1234}),
    # the 910B guide's train.sh: WORLD_SIZE and LOCAL_RANK exported, --local_rank=$i, no RANK -> one node
    (["--local_rank=1"], {"WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     {"mode": "process", "world_size": 2, "rank": 1, "local_rank": 1, "nodes": 1, "port": 29500}),
    ([], {"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {"mode": "process", "world_size": 2, "rank": 0}),
    # torch.distributed.launch: RANK/WORLD_SIZE in the environment and --local-rank on the command line
    (["--local-rank=1"], {"RANK": "1", "WORLD_SIZE": "2"}, {"mode": "process", "rank": 1, "local_rank": 1}),
    ([], {"WORLD_SIZE": "1"}, {"mode": "single", "world_size": 1}),
    # the Ascend guide's loop with spawn's flags: LOCAL_RANK per process, nothing is spawned
    (["--multiprocessing-distributed", "--world-size", "1", "--rank", "0", "--device-list", "0-3"],
     {"LOCAL_RANK": "2"}, {"mode": "process", "world_size": 4, "rank": 2, "local_rank": 2, "procs_per_node": 4}),
    (["--multiprocessing-distributed", "--world-size", "2", "--rank", "1", "--device-list", "0-3"],
     {"LOCAL_RANK": "3"}, {"mode": "process", "world_size": 8, "rank": 7, "node_rank": 1}),
])
def test_place(argv, env, expected):
    got = place(Asked.of(vars(ns(*argv))), env)
    assert {k: getattr(got, k) for k in expected} == expected


@pytest.mark.parametrize("argv,env,fragment", [
    ([], {"RANK_ID": "8", "RANK_SIZE": "8"}, "outside a world of 8"),
    ([], {"RANK": "x", "WORLD_SIZE": "2"}, "is not a whole number"),
    (["--world-size", "2", "--rank", "1", "--gpu", "0"], {}, "--gpu picks the device"),
    # a process that sees a world size above 1 never runs alone
    ([], {"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but nothing says which process this is"),
    ([], {"WORLD_SIZE": "2", "LOCAL_RANK": "2"}, "LOCAL_RANK 2 is outside WORLD_SIZE=2"),
    (["--local_rank", "0"], {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "--local_rank 0 and LOCAL_RANK=1 disagree"),
    (["--multiprocessing-distributed", "--device-list", "0,1"], {"LOCAL_RANK": "2"}, "2 process slot"),
])
def test_place_rejects(argv, env, fragment):
    with pytest.raises(UsageError, match=fragment):
        place(Asked.of(vars(ns(*argv))), env)


def test_the_plan_checks_the_batch_against_the_processes_spawn_will_start():
    """--multiprocessing-distributed on a CPU: the processes are the --device-list's slots (4 here), known to the
    plan before any rank starts."""
    from trainer.config import parse_config
    from trainer.plan import plan
    cfg = parse_config(["--dummy", "--device", "cpu", "-b", "10", "--multiprocessing-distributed",
                        "--device-list", "0-3"], env={}).cfg
    with pytest.raises(UsageError, match="--batch-size 10 [(]global[)] does not divide over 4 processes"):
        plan(cfg, env={})
    cfg = parse_config(["--dummy", "--device", "cpu", "-b", "12", "--multiprocessing-distributed",
                        "--device-list", "0-3"], env={}).cfg
    assert plan(cfg, env={}).launch.device_list == (0, 1, 2, 3)


def _parsed(*argv):
    from trainer.config import parse_config
    return parse_config(["--dummy", "--device", "cpu"] + list(argv), env={})


def _cfg(*argv):
    return _parsed(*argv).cfg


def _settled(*argv):
    """amp.settle on the CPU: (the precision section decided, notes)."""
    from trainer.precision import amp as ampmod
    parsed = _parsed(*argv)
    return ampmod.settle(parsed.cfg, "cpu")


def test_a_tcp_url_is_env_at_its_host_and_port_and_counts_other_than_1_2_4_8_are_flagged():
    """The guides' --dist-url tcp://HOST:PORT (refused on NPU before) is read as env:// at HOST:PORT on every
    device, with a note; file:// stays refused on NPU."""
    parsed = _parsed("--world-size", "2", "--rank", "0", "--addr", "1.1.1.1", "--dist-url", "tcp://127.0.0.1:50000")
    section = parsed.cfg.launch
    assert (section.dist_url, section.addr, section.port) == ("env://", "127.0.0.1", 50000)
    assert any("the ranks meet at 127.0.0.1:50000" in n and "--addr 1.1.1.1 ignored" in n for n in parsed.notes)
    assert launch.check_launch(section, "npu") == () and launch.check_launch(section, "cpu") == ()
    filed = _cfg("--world-size", "2", "--rank", "0", "--dist-url", "file:///tmp/x")
    with pytest.raises(UsageError, match=r"--dist-url file:///tmp/x: NPU processes .* env://.*--addr"):
        launch.check_launch(filed.launch, "npu")
    with pytest.raises(UsageError, match=r"not tcp://HOST:PORT"):
        _cfg("--world-size", "2", "--rank", "0", "--dist-url", "tcp://nohost")
    three = _cfg("--multiprocessing-distributed", "--device-list", "0-2", "-b", "12")
    notes = launch.check_launch(three.launch, "npu")
    assert len(notes) == 1 and "3 device(s) per node" in notes[0] and "1/2/4/8" in notes[0]
    assert launch.check_launch(three.launch, "cpu") == ()


def test_device_list_is_sorted_like_the_guide_and_gpu_is_cuda():
    parsed = _parsed("--multiprocessing-distributed", "--device_list", "3,1,2,0")
    assert parsed.cfg.launch.device_list == (0, 1, 2, 3)
    assert any("taken in ascending order 0,1,2,3" in n for n in parsed.notes)
    assert _parsed("--device-list", "0-3").notes == ()
    from trainer.config import parse_config
    assert parse_config(["--dummy", "--device", "gpu"], env={}).cfg.launch.device == "cuda"


def test_shufflenet_names_build_the_variant_unless_torchvision_is_asked():
    import models
    cfg, notes = _parsed("-a", "shufflenet_v2_x0_5")
    assert cfg.model.arch == "shufflenet_v2_x0_5" and cfg.model.name == "shufflenet_v2_x0_5_npu" and len(notes) == 1
    cfg, notes = _parsed("-a", "shufflenet_v2_x0_5", "--model-impl", "torchvision")
    assert cfg.model.name == "shufflenet_v2_x0_5" and notes == ()
    assert _cfg("-a", "resnet50").model.name == "resnet50"
    with pytest.raises(UsageError, match="use -a shufflenet_v2_x1_0 for torchvision's"):
        _cfg("-a", "shufflenet_v2_x1_0_npu", "--model-impl", "torchvision")
    # the variant's weights are torchvision's, so checkpoints of either resume into the other
    assert models.same_weights("shufflenet_v2_x1_0", "shufflenet_v2_x1_0_npu")
    assert not models.same_weights("shufflenet_v2_x1_0", "shufflenet_v2_x0_5_npu")
    a = models.get_model("shufflenet_v2_x0_5", num_classes=10).state_dict()
    b = models.get_model("shufflenet_v2_x0_5_npu", num_classes=10).state_dict()
    assert [(k, tuple(v.shape)) for k, v in a.items()] == [(k, tuple(v.shape)) for k, v in b.items()
                                                          if k in a] and set(a) <= set(b)


def test_precision_flags_without_effect_are_noted():
    _, notes = _settled("--opt-level", "O1", "--loss-scale", "128")
    assert notes == ("--opt-level and --loss-scale have no effect without --amp",)
    precision, notes = _settled("--amp", "--opt_level", "O2")
    assert precision.amp_impl == "native"
    assert any(n.startswith("--opt-level O2 applies to apex only") for n in notes)
    assert _settled("--amp")[1] == ()
    with pytest.raises(UsageError, match="--combine-ddp is an option of Ascend apex.amp"):
        _settled("--amp", "--combine-ddp")


# ---------------------------------------------------------------- recipe rule


def test_recipe_at_its_own_size_is_unchanged():
    values, notes = recipes.scale("resnet50_8p", 8)
    assert values == {"batch_size": 4096, "lr": 1.6, "epochs": 90, "warmup_epochs": 8, "workers": 256}
    assert notes == []


def test_recipe_on_fewer_devices_keeps_the_per_device_batch():
    values, notes = recipes.scale("resnet50_8p", 2)
    assert values["batch_size"] == 1024 and values["lr"] == pytest.approx(0.4) and values["workers"] == 64
    assert values["warmup_epochs"] == 8 and len(notes) == 2


def test_recipe_given_values_win_and_scale_the_rest():
    values, _ = recipes.scale("shufflenet_v2_x1_0_1p", 1, {"batch_size": 8, "epochs": 1})
    assert values["batch_size"] == 8 and values["lr"] == pytest.approx(0.75 * 8 / 1536)
    assert values["warmup_epochs"] == 1  # a run as long as the warm-up keeps it
    values, _ = recipes.scale("resnet50_1p", 1, {"epochs": 3})
    assert values["warmup_epochs"] == pytest.approx(8 * 3 / 90, rel=1e-5)  # shorter: the same fraction
    values, _ = recipes.scale("resnet50_8p", 2, {"lr": 0.3, "workers": 3, "warmup_epochs": 0})
    assert (values["lr"], values["workers"], values["warmup_epochs"]) == (0.3, 3, 0)


def test_recipe_that_does_not_scale_says_so(monkeypatch):
    monkeypatch.setattr(recipes, "_table", lambda: {"odd_8p": {"rank_size": 8, "batch_size": 100, "lr": 0.1,
                                                               "epochs": 1}})
    with pytest.raises(UsageError, match="does not scale to 3"):
        recipes.scale("odd_8p", 3)  # 100 x 3 / 8 is not whole


def test_main_recipe_uses_the_rule():
    from trainer.config import parse_config
    cfg, notes = parse_config(["--dummy", "--recipe", "resnet50_8p", "--device", "cpu",
                               "--multiprocessing-distributed", "--device-list", "0,1"], env={})
    assert (cfg.run.batch_size, cfg.optim.lr, cfg.data.workers) == (1024, pytest.approx(0.4), 64)
    assert any("per-device batch is kept" in n for n in notes)


# ---------------------------------------------------------------- parsing: once, then the defaults in layers


def test_the_command_line_is_parsed_once_with_a_recipe_and_with_a_modelzoo_entry(monkeypatch):
    from trainer.config import parse_config
    calls = []
    for name in ("parse_args", "parse_known_args"):
        real = getattr(argparse.ArgumentParser, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(argparse.ArgumentParser, name, counted)
    cfg = parse_config(["--dummy", "--recipe", "resnet50_8p", "--device", "cpu", "-b", "64"], env={}).cfg
    assert sorted(calls) == ["parse_args", "parse_known_args"]
    assert (cfg.run.recipe, cfg.run.batch_size, cfg.optim.lr, cfg.optim.label_smoothing) == \
        ("resnet50_8p", 64, pytest.approx(1.6 * 64 / 4096), 0.1)  # the recipe's, scaled to the batch typed
    del calls[:]
    cfg = parse_config(["--dummy", "--device", "cpu", "--label-smoothing", "0.2"], env={"RANK_SIZE": "1"}).cfg
    assert sorted(calls) == ["parse_args", "parse_known_args"]
    assert (cfg.run.modelzoo, cfg.optim.lr_schedule, cfg.optim.label_smoothing, cfg.precision.loss_scale) == \
        ("resnet50", "cosine", 0.2, 1024.0)  # the entry's defaults, the flag typed wins


def test_one_parse_sees_every_flag_typed_and_leaves_the_parser_as_built():
    from trainer import flags
    parser = build_parser()
    typed = flags.parse_typed(parser, ["--dummy", "--no-validate", "--no-channels-last", "-b", "256",
                                       "--device", "auto", "--loss-scale", "-1"])
    # switches whose default is True, values equal to their defaults, "dynamic": all seen as given
    assert typed == {"dummy": True, "validate": False, "channels_last": False, "batch_size": 256, "device": "auto",
                     "loss_scale": "dynamic"}
    assert flags.parse_typed(parser, []) == {}
    assert parser.parse_args([]).batch_size == 256 and flags.own_defaults(parser)["validate"] is True


def test_string_defaults_go_through_the_flags_type_as_argparse_does_with_them():
    from trainer import flags
    parser = build_parser()
    parser.set_defaults(epochs="3", arch="resnet18", loss_scale="-1")
    expected = parser.parse_args([])  # argparse's own conversion of string defaults
    got = flags.convert_defaults(parser, {"epochs": "3", "arch": "resnet18", "loss_scale": "-1"}, {})
    assert got == {"epochs": expected.epochs, "arch": expected.arch, "loss_scale": expected.loss_scale} == \
        {"epochs": 3, "arch": "resnet18", "loss_scale": "dynamic"}
    assert flags.convert_defaults(parser, {"epochs": "3"}, {"epochs": 5}) == {"epochs": "3"}  # typed: kept
    with pytest.raises(UsageError, match=r"^argument --epochs: must be a whole number at least 1, got '0'$"):
        flags.convert_defaults(parser, {"epochs": "0"}, {})


def test_opt_level_and_loss_scale_are_none_unless_given():
    from trainer.precision import amp as ampmod
    from trainer.config import PrecisionConfig
    p = _cfg().precision
    assert (p.opt_level, p.loss_scale, p.preset) == (None, None, ())
    p = _cfg("--opt-level", "O1", "--loss-scale", "128").precision
    assert (p.opt_level, p.loss_scale, p.preset) == ("O1", 128.0, ())
    assert _cfg("--loss_scale", "dynamic").precision.loss_scale == "dynamic"
    # a recipe's values fill them in, marked as the recipe's; a value typed wins and is the command line's
    p = _cfg("--recipe", "resnet50_1p").precision
    assert (p.opt_level, p.loss_scale, p.preset) == ("O2", 1024.0, ("opt_level", "loss_scale"))
    p = _cfg("--recipe", "resnet50_1p", "--loss-scale", "1024").precision
    assert (p.opt_level, p.loss_scale, p.preset) == ("O2", 1024.0, ("opt_level",))
    # settle notes the flags typed only, whoever else gave a value
    assert _settled("--recipe", "resnet50_1p")[1] == ()
    assert _settled("--recipe", "resnet50_1p", "--loss-scale", "1024")[1] == (
        "--loss-scale has no effect without --amp",)
    assert _settled("--amp", "--recipe", "resnet50_1p")[1] == ()
    # apex runs at O2 where --opt-level is not given; "dynamic" and no scale are both a dynamic scale
    apex = PrecisionConfig(amp=True, amp_impl="apex")
    assert (ampmod.resolve(apex, None).opt_level, ampmod.resolve(apex, None).loss_scale) == ("O2", None)
    held = ampmod.resolve(apex.replace(opt_level="O1", loss_scale=64.0), None)
    assert (held.opt_level, held.loss_scale) == ("O1", 64.0)
    assert ampmod.resolve(apex.replace(loss_scale="dynamic"), None).loss_scale is None
    # bfloat16 needs no scale: a --loss-scale typed is explained, a recipe's or ModelZoo entry's goes unmentioned
    from trainer.device import Device
    bf16 = PrecisionConfig(amp=True, amp_impl="native", amp_dtype="bfloat16", loss_scale=64.0)
    assert "--loss-scale 64 is not used" in ampmod.resolve(bf16, Device.create("cpu")).note
    assert "is not used" not in (ampmod.resolve(bf16.replace(preset=("loss_scale",)), Device.create("cpu")).note or "")


# ---------------------------------------------------------------- metrics


def test_correct_counts_top1_top5_and_mask():
    out = torch.tensor([[0.1, 0.9, 0.0, 0.0, 0.0, 0.0],   # top1 = 1
                        [0.5, 0.1, 0.2, 0.3, 0.4, 0.0],   # top1 = 0, class 5 last
                        [0.0, 0.0, 0.0, 0.0, 0.2, 0.9]])  # top1 = 5
    target = torch.tensor([1, 5, 4])
    c1, c5 = metrics.correct_counts(out, target)
    assert (int(c1), int(c5)) == (1, 2)
    c1, c5 = metrics.correct_counts(out, target, mask=torch.tensor([False, True, True]))
    assert (int(c1), int(c5)) == (0, 1)
    three = torch.tensor([[0.1, 0.9, 0.0], [0.5, 0.1, 0.2], [0.2, 0.3, 0.1]])
    c1, c5 = metrics.correct_counts(three, torch.tensor([1, 2, 0]))  # fewer than 5 classes: top-3
    assert (int(c1), int(c5)) == (1, 3)


def test_sums_interval_and_running():
    s = metrics.Sums(Device("cpu", None))
    s.add(torch.tensor(4.0), torch.tensor(1), torch.tensor(2), 2)
    interval, running = s.read()
    assert interval == running == {"loss": 2.0, "acc1": 50.0, "acc5": 100.0, "count": 2}
    s.add(torch.tensor(2.0), torch.tensor(2), torch.tensor(2), torch.tensor(2.0))
    interval, running = s.read(lambda t: t * 2)  # a "reduction" over two identical ranks
    assert running["count"] == 8 and running["loss"] == pytest.approx(1.5) and running["acc1"] == 75.0
    assert interval["count"] == 6  # since the last read


def test_parse_device_list_messages():
    from trainer.config import parse_device_list
    assert parse_device_list("0-3,6") == (0, 1, 2, 3, 6)
    for text, fragment in (("0,0", "names device 0 twice"), ("3-1", "runs backwards"), ("a", "not a device id")):
        with pytest.raises(argparse.ArgumentTypeError, match=fragment):
            parse_device_list(text)


# ---------------------------------------------------------------- supervision (stand-in ranks: sh)


def ranks_of(*scripts, groups=False):
    return Ranks([subprocess.Popen(["sh", "-c", s], start_new_session=groups) for s in scripts], groups=groups)


def test_supervise_all_done():
    assert ranks_of("exit 0", "sleep 0.3").supervise(poll=0.05) is None


def test_a_crashed_rank_stops_the_others_at_once():
    ranks = ranks_of("sleep 600", "exit 1")
    assert ranks.supervise(poll=0.05) == 1
    assert ranks.codes() == [-signal.SIGTERM, 1]  # stopped, not waited for (the test's time limit is below 600 s)


def test_a_killed_rank_is_blamed_rather_than_its_peers():
    ranks = ranks_of("exit 1", "kill -9 $$")
    for p in ranks.procs:
        p.wait()
    assert ranks.failed() == 1 and ranks.supervise(poll=0.05) == 1


def _after(path, then):
    """A stand-in rank that waits until ``path`` exists (another rank's event), then runs ``then``."""
    return "while [ ! -e {} ]; do sleep 0.01; done; {}".format(path, then)


def test_a_rank_that_named_its_failure_leaves_the_others_time_to_say_it(monkeypatch, tmp_path):
    """A rendezvous timeout ends every spawned rank with exit 1 and one line from the rank that says it; under load
    a quiet rank may exit first: it must not get the speaking one stopped."""
    monkeypatch.setattr(supervision, "STOP_GRACE", 60.0)  # rank 0 ends as soon as rank 1 has: the grace is not used
    said = tmp_path / "said"
    ranks = ranks_of(_after(said, "exit 1"), "touch {}; exit 1".format(said))
    assert ranks.supervise(poll=0.05, named=lambda r: True) == 0 and ranks.codes() == [1, 1]
    ranks = ranks_of("sleep 600", "exit 1")  # a failure that left a traceback stops the others at once
    assert ranks.supervise(poll=0.05, named=lambda r: False) == 1 and ranks.codes() == [-signal.SIGTERM, 1]


def test_a_rank_that_stops_in_order_leaves_the_others_time(monkeypatch, tmp_path):
    monkeypatch.setattr(supervision, "STOP_GRACE", 3.0)
    stopped = tmp_path / "stopped"
    ranks = ranks_of("touch {}; exit 2".format(stopped), _after(stopped, "exit 2"), "sleep 600")
    assert ranks.supervise(poll=0.05) == 0
    assert ranks.codes() == [2, 2, -signal.SIGTERM]  # the second stopped on its own, the third was stopped


def test_stop_kills_what_ignores_sigterm_and_the_whole_group(monkeypatch, tmp_path):
    monkeypatch.setattr(supervision, "STOP_GRACE", 0.5)
    pid_file = tmp_path / "child"
    ranks = ranks_of("trap '' TERM; sleep 30 & echo $! > {}; wait".format(pid_file), groups=True)
    deadline = time.time() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    ranks.stop()
    assert ranks.codes() == [-signal.SIGKILL]
    assert gone(child, within=5)  # the rank's own child went with its group


def test_signals_raise_interrupted_inside_with_only():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as exc:
        with Ranks():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert exc.value.exit_code == 143 and signal.getsignal(signal.SIGTERM) is before


def test_a_signal_while_the_ranks_start_waits_until_they_have_started():
    started = []
    with pytest.raises(Interrupted) as exc:
        with Ranks() as ranks:
            with ranks.starting():
                os.kill(os.getpid(), signal.SIGTERM)
                started.append("rank")
    assert started == ["rank"] and exc.value.exit_code == 143


def test_a_stop_that_had_to_kill_a_rank_is_an_error_that_claims_no_checkpoint(tmp_path):
    """Rank 0 stops (143) at SIGTERM, rank 1 ignores it and is killed after the grace: exit 1, each rank named."""
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, {}); print('ready', flush=True); time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code.format(handler)], stdout=subprocess.PIPE, text=True)
             for handler in ("lambda *a: sys.exit(143)", "signal.SIG_IGN")]
    since = time.time()
    ranks = Ranks(procs)
    try:
        assert all(p.stdout.readline() == "ready\n" for p in procs)
        ranks.stop(signal.SIGTERM, grace=1.0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
    exit_code, line = stop_report(ranks, signal.SIGTERM, str(tmp_path / "summary.json"), since)
    assert exit_code == 1 and line == "error: SIGTERM did not stop every rank at a step: rank 0 stopped (SIGTERM, " \
        "exit code 143), rank 1 killed after 1 s: it had not stopped; no checkpoint written at this stop (rank 0's " \
        "summary in '{}' records none)".format(tmp_path), line


def test_a_stop_after_every_rank_finished_is_exit_0_and_says_so(tmp_path):
    """The supervisor passes a signal on after its ranks have ended their runs (each exit 0): nothing was stopped."""
    procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    for p in procs:
        p.wait()
    exit_code, line = stop_report(Ranks(procs), signal.SIGINT, str(tmp_path / "summary.json"), time.time())
    assert exit_code == 0 and line == "note: SIGINT came after every rank had finished: the run ended ok (summary " \
        "in '{}')".format(tmp_path), line


def test_default_workers_follow_the_cores_and_the_processes():
    # an accelerator node: each process's share of the cores less its own, 2 to 16
    assert Device.of("npu").default_workers(8, cpus=192) == 16
    assert Device.of("cuda").default_workers(8, cpus=64) == 7
    assert Device.of("cuda").default_workers(1, cpus=16) == 15
    assert Device.of("cuda").default_workers(8, cpus=8) == 2
    # a CPU: pytorch/examples' 4 at most, never more than the share, at least 1
    assert Device.of("cpu").default_workers(1, cpus=2) == 2
    assert Device.of("cpu").default_workers(1, cpus=64) == 4
    assert Device.of("cpu").default_workers(4, cpus=2) == 1



_HEAP_PROBE = r"""
import ctypes, json, sys
import torch
from trainer.device import Device
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
what = Device.of(sys.argv[1]).keep_host_memory(json.loads(sys.argv[2]))
again = Device.of("cpu").keep_host_memory({})
t = torch.ones(16 * 2 ** 20)  # 64 MiB, twice glibc's largest mmap threshold
during = libc.mallinfo2()
del t
after = libc.mallinfo2()
print(json.dumps({"what": what, "again": again, "mmapped_during": during.hblkhd, "heap_after": after.arena}))
"""


def _heap_probe(kind, environ):
    import ctypes
    import json
    libc = ctypes.CDLL(None)
    if not (hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")):
        pytest.skip("needs glibc >= 2.33 (mallinfo2)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _HEAP_PROBE, kind, json.dumps(environ)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@STACK
@pytest.mark.timeout(150)
def test_cpu_run_keeps_large_blocks_in_the_heap_between_steps():
    r = _heap_probe("cpu", {})
    assert r["what"].startswith("kept") and r["again"] == r["what"]  # the first call decides
    assert r["mmapped_during"] < 2 ** 26  # the 64 MiB tensor came from the heap, not from mmap
    assert r["heap_after"] >= 2 ** 26  # and freeing it did not hand the pages back to the OS


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind,environ,expect", [
    ("cuda", {}, "system allocator"),
    ("cpu", {"MALLOC_TRIM_THRESHOLD_": "131072"}, "user's glibc settings (MALLOC_TRIM_THRESHOLD_)"),
    ("cpu", {"LD_PRELOAD": "libjemalloc.so.2"}, "user's allocator"),
])
@STACK
def test_host_memory_left_alone_off_cpu_or_when_the_user_chose(kind, environ, expect):
    r = _heap_probe(kind, environ)
    assert r["what"].startswith(expect)
    assert r["mmapped_during"] >= 2 ** 26  # glibc's default: a block this large is mmapped


@ONCE
def test_a_packages_version_is_read_from_its_dist_info_where_importlib_metadata_is_missing(tmp_path):
    """Python 3.7 (the guides' stack) has no importlib.metadata: the version comes from the METADATA of the
    package's dist-info on the path, without importing the package (importing torchvision takes seconds)."""
    from trainer.device import shims
    info = tmp_path / "torchvision-0.12.0+cu102.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.12.0+cu102\n\nVersion: 9\n")
    assert shims._dist_info_version("torchvision", [str(tmp_path)]) == "0.12.0+cu102"
    assert shims._dist_info_version("torch_npu", [str(tmp_path)]) is None
    assert shims._dist_info_version("torchvision", [str(tmp_path / "missing")]) is None
