"""Porting and reporting tools, each a command line: ``python3 -m tools.<name> --help`` from the repository
root, or ``python3 tools/<name>.py`` once the project is installed (``make install``). The top layer: tools
import models, trainer and modelzoo, and nothing imports tools (tests aside)."""
