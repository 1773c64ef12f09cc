#!/usr/bin/env python3
"""ImageNet-style training and evaluation on Ascend NPU, CUDA or CPU.

A port of pytorch/examples' imagenet/main.py: parse -> validate -> run. The machinery is
in the ``trainer`` package; ``python3 main.py --help`` lists every flag.
"""
import sys

from trainer import interpreter
from trainer.job import stop

if __name__ == "__main__":
    stop.hold_stops()  # a stop signal while the run starts is kept for its handlers; Slurm's warning after it, ignored
    if not {"-h", "--help"} & set(sys.argv[1:]):  # --help needs none of them
        interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them, exit 2
from trainer import errors


def _main(argv):
    from trainer.config import parse_config
    parsed = parse_config(argv, prog=sys.argv[0])
    if parsed.cfg is None:  # --list-models
        import models
        print("\n".join(models.list_models()))
        return 0
    from trainer import inputs
    found = inputs.check(parsed.cfg)  # the data set, the files named, the output folder: answered before torch
    from trainer.run import run
    return run(parsed.cfg, parsed.notes, found=found)


def main(argv=None):
    try:
        return errors.run(_main, argv)
    except stop.Stopped as exc:  # a signal kept while the run started, acted on before it began (or a second one)
        sys.stderr.write("interrupted by {}: the run had not begun; nothing to save\n".format(stop.name(exc.signum)))
        sys.stderr.flush()
        return stop.exit_code(exc.signum)


if __name__ == "__main__":
    sys.exit(main())
