"""The tests' warm start (tests/warm_start.py, conftest.Warm): a script forked from it ends as a new interpreter
running it would, in its exit code, output, traceback, signal, argv, sys.path, working folder and environment; a run
past its time limit is killed and named; what Python and torch read as they load has a warm start of its own."""
import os
import subprocess
import sys

import pytest

from conftest import ONCE, PY, ROOT, THREADS, Warm

pytestmark = [ONCE, pytest.mark.timeout(300)]

SCRIPT = r'''
import json, os, signal, sys
print(json.dumps({"argv": sys.argv[1:], "path0": sys.path[0], "cwd": os.getcwd(), "env": os.environ.get("WARM_TRY"),
                  "project": sorted(m for m in ("trainer", "modelzoo", "models") if m in sys.modules),
                  "name": __name__, "file": os.path.basename(__file__)}))
sys.stdout.write("no newline at the end")
sys.stderr.write("to stderr\n")
way = sys.argv[1]
if way == "raise":
    raise RuntimeError("an uncaught error")
if way == "exit":
    sys.exit(3)
if way == "text":
    sys.exit("error: a message as the exit")
if way == "signal":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)
if way == "atexit":
    import atexit
    atexit.register(lambda: print("\nat exit"))
'''


def both(tmp_path, way, module):
    """(warm, cold): the script's CompletedProcess (``python script.py``, or ``python -m script`` from its folder where
    ``module``) forked from the warm start and from a new interpreter."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    script = work / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", THREADS), PYTHONUNBUFFERED="1",
               WARM_TRY="yes")
    argv = (["-m", "script"] if module else [str(script)]) + [way, "b c"]
    warm = Warm.run(argv, env, 120, str(work))
    assert warm is not None, "the warm start did not run it"
    cold = subprocess.run([PY] + argv, env=env, cwd=str(work), capture_output=True, text=True, timeout=120)
    return warm, cold


@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
@pytest.mark.parametrize("way, code", [("ok", 0), ("exit", 3), ("text", 1), ("raise", 1), ("signal", -15),
                                       ("atexit", 0)])
def test_a_forked_run_ends_as_a_new_interpreter(tmp_path, way, code, module):
    warm, cold = both(tmp_path, way, module)
    assert warm.returncode == cold.returncode == code, (warm, cold)
    assert warm.stdout == cold.stdout, (warm.stdout, cold.stdout)
    first = warm.stdout.splitlines()[0]
    assert '"argv": ["{}", "b c"]'.format(way) in first and '"env": "yes"' in first and '"project": []' in first
    work = str(tmp_path / "work")
    assert '"path0": "{}"'.format(work) in first and '"cwd": "{}"'.format(work) in first
    assert '"name": "__main__"' in first and '"file": "script.py"' in first
    if way == "raise":  # the same last lines: the traceback's frame of the script and the error
        assert warm.stderr.splitlines()[-3:] == cold.stderr.splitlines()[-3:], (warm.stderr, cold.stderr)
        assert warm.stderr.startswith("to stderr\nTraceback (most recent call last):\n"), warm.stderr
    else:
        assert warm.stderr == cold.stderr, (warm.stderr, cold.stderr)


def test_a_run_past_its_time_limit_is_killed_and_named(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", THREADS), PYTHONUNBUFFERED="1")
    with pytest.raises(subprocess.TimeoutExpired) as info:
        Warm.run([str(script)], env, 2, str(tmp_path))
    assert info.value.output == "started\n" and "killed after the timeout: pid" in info.value.stderr, info.value
    (tmp_path / "next.py").write_text("print('next')\n")
    after = Warm.run([str(tmp_path / "next.py")], env, 60, str(tmp_path))  # the warm start goes on
    assert after is not None and after.returncode == 0 and after.stdout == "next\n", after


def test_what_python_and_torch_read_as_they_load_gets_a_warm_start_of_its_own(tmp_path):
    """OpenMP reads OMP_NUM_THREADS as torch loads: a run with another count is forked from a warm start started
    with it, and torch's threads are what a new interpreter gets; what is read later shares the warm start."""
    script = tmp_path / "s.py"
    script.write_text("import os, torch\nprint(torch.get_num_threads(), os.environ.get('LATER'))\n")
    base = dict(os.environ, PYTHONUNBUFFERED="1")
    for threads in ("1", "3"):
        env = dict(base, OMP_NUM_THREADS=threads)
        warm = Warm.run([str(script)], env, 120, str(tmp_path))
        cold = subprocess.run([PY, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert warm.stdout == cold.stdout and cold.stdout.endswith(" None\n"), (warm, cold)  # torch caps at cores
        assert Warm.key(env) in Warm.pool
    pid = Warm.pool[Warm.key(env)].pid
    later = Warm.run([str(script)], dict(env, LATER="x", PYTHONUNBUFFERED=""), 120, str(tmp_path))
    assert later.stdout == cold.stdout.replace("None", "x") and Warm.pool[Warm.key(env)].pid == pid, later
    assert Warm.key(dict(env, PYTHONPATH=ROOT)) != Warm.key(env) == Warm.key(dict(env, LATER="y"))


def test_the_warm_start_has_torch_and_nothing_of_the_project(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sorted(m for m in ('torch', 'torchvision', 'trainer', 'tests') "
                      "if m in sys.modules), sys.executable == {!r})\n".format(sys.executable))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", THREADS), PYTHONUNBUFFERED="1")
    done = Warm.run([str(script)], env, 60, str(tmp_path))
    assert done.stdout == "['torch', 'torchvision'] True\n", done


@pytest.mark.skipif(sys.version_info < (3, 8), reason="no importlib.metadata: torch 1.11 loads no device extension")
def test_an_installed_device_extension_leaves_the_choice_to_main_py(tmp_path):
    """torch >= 2.5 imports every installed device extension with itself, and main.py turns that off for a CPU run
    before torch loads (trainer/device_names.py): where one is installed and the user set nothing, runs start cold."""
    info = tmp_path / "site" / "torch_npu-2.7.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(tmp_path / "site"))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the user set nothing
    assert Warm.run([str(script)], env, 120, str(tmp_path)) is None and Warm.key(env) in Warm.cold
    done = Warm.run([str(script)], dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), 120, str(tmp_path))  # the user's
    assert done is not None and done.stdout == "1\n", done  # own setting: torch loads what it says, in both
