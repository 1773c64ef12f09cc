#!/usr/bin/env python3
"""The entry name Ascend ModelZoo's Shufflenetv2 scripts start (``python3 8p_main_med.py ...``): main.py, run as
that entry (its parser's defaults and the log lines its scripts read: trainer/zoo.py, docs/MODELZOO.md
"Ascend ModelZoo's scripts and flags"). ``python3 8p_main_med.py --help`` lists the flags."""
import os

if __name__ == "__main__":
    MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "main.py")
    with open(MAIN) as f:  # main.py's code under this program name (sys.argv[0] names the entry)
        exec(compile(f.read(), MAIN, "exec"), {"__name__": "__main__", "__file__": MAIN})
