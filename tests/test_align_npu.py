"""Precision alignment across machines, on the torch_npu double (tests/fake_npu): the same seed trained on --device
cpu (golden) and on npu (target) with --deterministic --precision-dump; msprobe's comparison (python3 -m
tools.align compare) finds nothing over its thresholds, and names the one module whose device kernel is wrong
(FAKE_NPU_DEFECT=addmm: resnet18's fc) first, exit 1. In one process and in jobs of two ranks."""
import pytest

from conftest import DOUBLE, RANKS, STACK, run_main
from test_align import MSPROBE, RUN, align
from test_npu_double import double, fake_env  # noqa: F401 (fixture)

pytestmark = [STACK, DOUBLE, pytest.mark.timeout(420), pytest.mark.usefixtures("double"),
              pytest.mark.skipif(not MSPROBE, reason="msprobe (pip install mindstudio-probe==26.2.0) is not "
                                                     "installed in this environment")]
ALIGN = [a for a in RUN if a not in ("--device", "cpu")] + ["--max-steps-per-epoch", "2", "--dump-steps", "0"]
TWO_RANKS = ["--multiprocessing-distributed", "--device-list", "0,1", "--port", "0", "--dist-timeout", "120"]


def dumped(data, out, device, more=(), env=None):
    """main.py on ``device`` dumping step 0 into ``out``/dump; that folder."""
    proc = run_main([str(data), "--output-dir", str(out / "run"), "--device", device, "--precision-dump",
                     str(out / "dump")] + ALIGN + list(more), env=env)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    return out / "dump"


def check(golden, target, tmp_path, defect):
    proc = align("compare", golden, target, "-o", tmp_path / "cmp")
    if defect:
        assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
        first = [line for line in proc.stdout.splitlines() if line.startswith("=> first over")]
        assert first and first[0].startswith("=> first over msprobe's thresholds in execution order: fc "
                                             "(Module.fc.Linear.forward.0, step 0, rank 0"), proc.stdout[-3000:]
    else:
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
        assert "=> within msprobe's thresholds" in proc.stdout
    return proc.stdout


@pytest.fixture(scope="module")
def golden(shapes, tmp_path_factory):
    return dumped(shapes, tmp_path_factory.mktemp("golden"), "cpu")


@pytest.mark.parametrize("defect", [False, True], ids=["same", "defect"])
def test_align_compare_of_cpu_and_npu_runs_names_the_defective_module(shapes, golden, tmp_path, defect):
    env = fake_env(FAKE_NPU_DEFECT="addmm") if defect else fake_env()
    target = dumped(shapes, tmp_path / "npu", "npu", env=env)
    out = check(golden, target, tmp_path, defect)
    assert "rank(s) 0:" in out


@RANKS
@pytest.mark.parametrize("defect", [False, True], ids=["same", "defect"])
def test_align_compare_of_two_cpu_ranks_and_two_npu_ranks(shapes, tmp_path_factory, tmp_path, defect):
    two = tmp_path_factory.getbasetemp() / "golden_two_ranks"
    if not two.exists():  # the CPU job, once for both variants
        two.mkdir()
        dumped(shapes, two, "cpu", TWO_RANKS, env={"OMP_NUM_THREADS": "1"})
    env = fake_env(OMP_NUM_THREADS="1", **({"FAKE_NPU_DEFECT": "addmm"} if defect else {}))
    target = dumped(shapes, tmp_path / "npu", "npu", TWO_RANKS, env=env)
    for rank in (0, 1):
        assert (target / "step0" / "rank{}".format(rank) / "dump.json").is_file()
    out = check(two / "dump", target, tmp_path, defect)
    assert "rank(s) 0,1:" in out
