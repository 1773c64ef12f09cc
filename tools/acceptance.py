#!/usr/bin/env python3
"""Acceptance figures of a training run against a baseline table or a reference run: the command line of
modelzoo/acceptance.py (its docstring and --help list the subcommands).

    python3 -m tools.acceptance report|check|align|baseline ...

Exit codes: 0 success, 1 the run did not finish, 2 bad input (one ``error:`` line), 3 FAIL.
"""
if not __package__:  # python3 tools/acceptance.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
import sys

from modelzoo.acceptance import cli

if __name__ == "__main__":
    sys.exit(cli())
