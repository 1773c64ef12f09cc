"""The checks of a run's inputs that need no torch (the data set's folders and classes, the files named, the output
folder): main.py calls ``check(cfg)`` before importing torch and hands what it found to the plan, which checks them
itself where it is given nothing (a tool's run).
"""
import os

import collections

from trainer import data
from trainer.errors import UsageError

Found = collections.namedtuple("Found", "classes")  # what the checks found: the class folders (None: --dummy)


def check(cfg):
    """The inputs of ``cfg`` checked (UsageError on the first problem): ``Found``, the number of the data's class
    folders (None with --dummy)."""
    run, classes = cfg.run, None

    # the data set: its folders, a class folder per class with images in train/, val/ against them; the classes
    # against --num-classes
    if not cfg.data.dummy:
        classes = len(data.check_layout(cfg.data.root, need_train=not run.evaluate))
        if cfg.model.num_classes is not None and cfg.model.num_classes < classes:
            raise UsageError("--num-classes {} is below the {} class folders in the data".format(
                cfg.model.num_classes, classes))

    # the files named: --pretrained FILE, --resume FILE (auto: whatever the output folder holds)
    for path, what in ((cfg.model.pretrained, "weights file"),
                       (None if run.resume == "auto" else run.resume, "checkpoint")):
        if path is not None and not os.path.exists(path):
            raise UsageError("{} '{}' does not exist".format(what, path))
        if path is not None and not os.path.isfile(path):
            raise UsageError("{} '{}' is not a file".format(what, path))

    # the output folder
    if os.path.exists(run.output_dir) and not os.path.isdir(run.output_dir):
        raise UsageError("--output-dir '{}' is a file, not a folder".format(run.output_dir))

    return Found(classes)
