"""``python3 tools/NAME.py``: a tool run as a script imports this first (tools/ is then sys.path[0]). The tools import
the project's packages, which such a run finds only where the project is installed in the Python running it (make
install: the repository's .venv); elsewhere this stops it in one ``error:`` line, exit 2, naming the Python to use
(trainer/interpreter.py, run from its file: ``trainer`` is what cannot be imported)."""
import os
import runpy

_checks = runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer",
                                      "interpreter.py"))
_checks["require"]((_checks["PROJECT"],))
