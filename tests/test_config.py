"""The configuration seam: each setting declared once (trainer/flags.py), so the defaults a config is built with in
code are those main.py parses, the parser is made from the declarations, and each section checks its own flags."""
import dataclasses
import os

import pytest

from conftest import ONCE
from trainer import flags, options
from trainer.config import Config, parse_config
from trainer.errors import UsageError

pytestmark = [ONCE, pytest.mark.timeout(60)]

SECTIONS = [f.name for f in dataclasses.fields(Config)]


def test_a_config_built_from_its_defaults_is_what_main_py_dir_parses(tmp_path):
    """``Config()`` in code and ``main.py DIR`` agree section by section, but for what the command line decides
    from DIR and from --output-dir not being given, and what the launch picks on this machine."""
    cfg = parse_config([str(tmp_path)], env={}).cfg
    decided = {"data": dict(root=str(tmp_path)),
               "run": dict(tensorboard_dir=os.path.join(".", "tensorboard"), move_earlier_run=True),
               "launch": dict(port=cfg.launch.port, local_rank=cfg.launch.local_rank)}
    built = Config()
    for section in SECTIONS:
        assert getattr(cfg, section) == getattr(built, section).replace(**decided.get(section, {})), section
    assert cfg.model.arch == "resnet50" and cfg.run.fps_warmup_steps == 5  # the flags' defaults, as main.py ran


def test_each_flag_fills_its_field_with_the_fields_default():
    """argparse's default of every flag declared on a field is that field's default (--val-resize-size aside:
    not given, it follows --val-crop-size, and the field holds the result for the default crop)."""
    defaults = flags.own_defaults(flags.build_parser())
    for section in SECTIONS:
        cls = type(getattr(Config(), section))
        for dest, field, _ in options.declared(cls):
            if (section, field.name) != ("data", "val_resize_size"):
                assert defaults[dest] == field.default, (section, field.name)
    assert defaults["val_resize_size"] is None and Config().data.val_resize_size == 256


def test_the_parser_is_made_from_the_declarations():
    """A flag of the parser is declared once: on its field (with its dest, or the field's name), or among the flags
    that fill no field (``flags.CommandLine``); switches pair with their opposite on the same dest."""
    parser = flags.build_parser()
    declared = {dest for section in SECTIONS for dest, _, _ in options.declared(type(getattr(Config(), section)))}
    declared |= {dest for dest, _, _ in options.declared(flags.CommandLine)}
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == declared
    by_option = {s: a for a in parser._actions for s in a.option_strings}
    assert by_option["--gpu"].dest == "gpu" and by_option["--no-amp"].dest == by_option["--amp"].dest == "amp"
    assert by_option["--no-channels-last"].dest == "channels_last" and by_option["--channels-last"].default is None
    titles = [g.title for g in parser._action_groups][2:]
    assert titles == [title for _, title, _ in flags.GROUPS]
    assert [a.option_strings for a in parser._action_groups[2]._group_actions][:2] == [[], ["--data"]]


def test_each_section_checks_its_own_flags(tmp_path):
    """A section's function answers for its flags alone: one line naming the flag."""
    for argv, fragment in (([str(tmp_path), "--crop-scale-min", "1.5"], "--crop-scale-min"),
                           ([str(tmp_path), "--compile-mode", "max-autotune"], "needs --compile"),
                           ([str(tmp_path), "--label-smoothing", "1"], "--label-smoothing"),
                           ([str(tmp_path), "--amp-dtype", "float16"], "needs --amp"),
                           ([str(tmp_path), "--profile-stop"], "--profile-steps")):
        with pytest.raises(UsageError, match=fragment):
            parse_config(argv, env={})
