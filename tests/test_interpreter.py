"""A Python without the project's packages (torch, ...), as a newcomer's system python3: main.py, the tools (``python3
-m tools.NAME``, ``python3 tools/NAME.py``) and the drivers (test/*.sh) stop in one ``error:`` line, exit 2, naming
the Python to use (the repository's .venv, else ``make install``), with nothing of the user's moved; the command
typed again with the Python named trains; the drivers run .venv's Python where python3 lacks the packages, and a
python3 that has them is kept. The torch-less Python is a venv made here without packages (this machine's system
Python may have torch)."""
import os
import subprocess

import pytest
import torch

from conftest import ONCE, PY, ROOT, SMALL, assert_one_line_error, read_summary

pytestmark = [ONCE, pytest.mark.clients, pytest.mark.timeout(300)]

VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")


def _venv_ready():
    """The repository's .venv has the trainer's packages (make install finished)."""
    if not os.access(VENV_PY, os.X_OK):
        return False
    return subprocess.run([VENV_PY, "-m", "trainer.interpreter"], cwd=ROOT, capture_output=True,
                          timeout=60).returncode == 0


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The bin/ folder of a Python without torch, torchvision, numpy, Pillow or this project."""
    where = str(tmp_path_factory.mktemp("bare") / "venv")
    subprocess.run([PY, "-m", "venv", "--without-pip", where], check=True, capture_output=True, timeout=120)
    bin_dir = os.path.join(where, "bin")
    lacks = subprocess.run([os.path.join(bin_dir, "python3"), "-c", "import torch"], capture_output=True, timeout=60)
    assert lacks.returncode != 0, "the bare venv imports torch"
    return bin_dir


def _run(argv, cwd=ROOT, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON", "VIRTUAL_ENV")}
    e.update(env)
    return subprocess.run(argv, cwd=cwd, env=e, capture_output=True, text=True, timeout=240)


def _named(line):
    """The fix the line gives: the Python it names, or make install."""
    if os.access(VENV_PY, os.X_OK):
        assert "run it with {} (or `source {}/.venv/bin/activate` first)".format(VENV_PY, ROOT) in line, line
        return VENV_PY
    assert "run `make install` in {}".format(ROOT) in line, line
    return None


def _listing(folder):
    return sorted((name, os.path.getsize(os.path.join(folder, name)), os.path.getmtime(os.path.join(folder, name)))
                  for name in os.listdir(folder))


def test_main_py_names_the_python_to_use_and_moves_nothing(bare, shapes, tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("the user's\n")
    before = _listing(out)
    args = [shapes, "--output-dir", out, "-a", "tiny_cnn", "--epochs", "1", "--max-steps-per-epoch", "2", "-b", "16",
            "--device", "cpu"] + SMALL
    for entry in ("main.py", "8p_main_med.py"):  # run from another folder, as python3 /path/to/main.py
        proc = _run([os.path.join(bare, "python3"), os.path.join(ROOT, entry)] + args, cwd=str(tmp_path))
        line = assert_one_line_error(proc, os.path.join(bare, "python3") + " has no torch, torchvision, numpy, Pillow")
        assert proc.stdout == ""
        named = _named(line)
    assert _listing(out) == before
    helped = _run([os.path.join(bare, "python3"), os.path.join(ROOT, "main.py"), "--help"])  # needs none of them
    assert helped.returncode == 0 and helped.stdout.startswith("usage: main.py"), helped.stderr
    if named is None or not _venv_ready():
        pytest.skip("the repository's .venv is not installed (make install): its run is not tried")
    proc = _run([named, os.path.join(ROOT, "main.py")] + args, cwd=str(tmp_path))  # the command, with the Python named
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_summary(out)["status"] == "ok" and read_summary(out)["trained_steps"] == 2
    assert open(os.path.join(out, "notes.txt")).read() == "the user's\n"


def test_the_tools_name_the_python_to_use_as_modules_and_as_scripts(bare, tmp_path):
    python = os.path.join(bare, "python3")
    made = str(tmp_path / "made")
    for argv, lacks in ((["-m", "tools.export_onnx", "-o", str(tmp_path / "m.onnx")], "torch, torchvision"),
                        (["-m", "tools.op_report", "--help"], "torch, torchvision"),
                        (["-m", "tools.plot_runs", str(tmp_path)], "torch, torchvision"),
                        (["-m", "tools.make_dataset", made], "numpy, Pillow"),
                        (["-m", "tools.callpath", "--", "--help"], "torch, torchvision"),
                        ([os.path.join(ROOT, "tools", "export_onnx.py"), "--help"], "this project is not installed"),
                        ([os.path.join(ROOT, "tools", "acceptance.py"), "--help"], "this project is not installed")):
        proc = _run([python] + argv)
        line = assert_one_line_error(proc, lacks)
        assert proc.stdout == "" and python in line
        _named(line)
    assert not os.path.exists(made) and not os.path.exists(str(tmp_path / "m.onnx"))
    # a tool that needs none of them keeps working on such a Python (the Ascend machines' python3, say)
    proc = _run([python, "-m", "tools.acceptance", "--help"])
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python3 -m tools.acceptance"), proc.stderr


def test_the_drivers_run_the_venv_where_python3_lacks_torch_and_keep_one_that_has_it(bare, shapes, tmp_path):
    script = os.path.join(ROOT, "test", "train_full_1p.sh")
    out = str(tmp_path / "run")
    args = ["--data_path=" + shapes, "--arch=tiny_cnn", "--device=cpu", "--batch_size=16", "--epochs=1",
            "--workers=0", "--output_dir=" + out, "--", "--max-steps-per-epoch", "2"] + SMALL[:6]
    path = os.environ.get("PATH", "")
    # PYTHON names the Python: one without the packages is one line naming the one to use, the folder untouched
    proc = _run(["bash", script] + args, PYTHON=os.path.join(bare, "python3"), etp_running_flag="true")
    _named(assert_one_line_error(proc, "has no torch"))
    assert not os.path.exists(out)
    # python3 is the bare one (first on PATH): the driver runs .venv's, in one note, and trains
    proc = _run(["bash", script] + args, PATH=bare + os.pathsep + path, etp_running_flag="true")
    if not _venv_ready():
        _named(assert_one_line_error(proc, "has no torch"))
        assert not os.path.exists(out)
        return
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    notes = [line for line in proc.stderr.splitlines() if "lacks the project's packages" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "the driver runs " + VENV_PY in notes[0]
    s = read_summary(out)
    assert s["status"] == "ok" and s["trained_steps"] == 2
    # a python3 that has them (this test's own, first on PATH) is the one run: no note
    proc = _run(["bash", script] + args[:6] + ["--output_dir=" + str(tmp_path / "kept")] + args[7:],
                PATH=os.path.dirname(PY) + os.pathsep + path, etp_running_flag="true")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "lacks the project's packages" not in proc.stderr
    assert read_summary(tmp_path / "kept")["versions"]["torch"] == torch.__version__
