"""The docs are checked against the code: every `python3 main.py ...` and `bash test/....sh ...` command in README.md
and docs/*.md is parsed, and planned as its processes would plan it (a data path that does not exist here replaced by
a generated set, NPU commands on the fake torch_npu); every file, module and flag the docs name exists; the flag
tables name main.py's flags as its --help does, and every flag of --help is documented. A renamed flag or a moved
file fails here (test_the_checks_fail_on_a_renamed_flag_and_a_moved_file)."""
import ast
import glob
import json
import os
import re
import shlex
import subprocess

import pytest

from conftest import ONCE, PY, ROOT
from trainer.device import runtime

pytestmark = [ONCE, pytest.mark.timeout(300)]

FAKE = os.path.join(ROOT, "tests", "fake_npu")
DRIVERS = {"train_full_1p.sh": ("full", "1p"), "train_full_8p.sh": ("full", "8p"), "train_full_16p.sh": ("full", "16p"),
           "train_performance_1p.sh": ("performance", "1p"), "train_performance_8p.sh": ("performance", "8p"),
           "train_performance_16p.sh": ("performance", "16p"), "train_cluster.sh": ("full", "cluster")}
SOURCE_DIRS = ("trainer/", "tools/", "modelzoo/", "models/", "tests/", "docs/", "examples/", "bench/", "baselines/")
TOP_FILES = ("main.py", "env_npu.sh", "Makefile", "README.md", "pyproject.toml", "requirements.txt",
             "requirements-compat.txt", "requirements-common.txt", "1.11_requirements.txt",
             "requirements-torch1.11-tests.txt", "requirements-py37-tests.txt", "8p_main_med.py")
# flags of commands that are not this project's, named in the docs beside its own (pip, pytest, Slurm, shell tools)
OTHER_FLAGS = {"--no-deps", "--index-url", "--extra-index-url", "--upgrade", "--user", "--force-reinstall",  # pip
               "--nproc-per-node",  # torchrun's own spelling of --nproc_per_node
               "--enable_tiered_parallel_tcpstore",  # torch_npu_run's
               "--ntasks-per-node", "--ntasks", "--nodes", "--gres", "--cpus-per-task", "--job-name",  # Slurm
               "--mpi", "--export", "--output", "--time", "--partition", "--exclusive", "--signal", "--requeue",
               "--open-mode", "--wrap",  # sbatch's
               "--grace-period",  # kubectl's
               "--propagation", "--mount", "--pid", "--fork", "--net",  # unshare
               "--framework", "--input_format", "--input_shape", "--soc_version",  # CANN's atc
               "--host_log_folder",  # CANN's get_ascend_op_info.py
               "--logdir",  # tensorboard
               "--key",  # the drivers' --key=value, as a pattern
               "--multiprocessing-distribute",  # the guide's spelling: a prefix argparse accepts
               "--headless", "--help", "--version"}


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def code_blocks(text):
    """The lines of the fenced code blocks of a markdown text, block by block."""
    return [m.group(1).splitlines() for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)]


_SECOND = re.compile(r"\S\s{4,}(?=(?:python3|bash) )")  # a second command beside the first


def _columns(block):
    """A block that shows two commands side by side (node 0, node 1) as two blocks."""
    cuts = [m.end() for m in (_SECOND.search(ln) for ln in block) if m]
    if not cuts:
        return [block]
    cut = min(cuts)
    return [[ln[:cut] for ln in block], [ln[cut:] for ln in block]]


_ENDS = ("&", "&&", ";", "|", "||", ">", ">>", "2>", "2>&1")  # what ends the command's own words


def commands(text):
    """(kind, argv) of each command in the text's code blocks: kind "main" (python3 main.py, torchrun ... main.py)
    or a driver script's name; continuation lines joined, comments and `...` dropped."""
    out = []
    for block in code_blocks(text):
        for part in _columns(block):
            joined, pending = [], ""
            for ln in part:
                ln = ln.rstrip()
                if ln.endswith("\\"):
                    pending += ln[:-1] + " "
                    continue
                joined.append(pending + ln)
                pending = ""
            for ln in joined:
                try:
                    words = shlex.split(ln, comments=True)
                except ValueError:
                    continue
                elided = [w for w in words if w in ("...", "…")]
                words = [w for w in words if w not in ("...", "…")]
                for i, w in enumerate(words):
                    if w in _ENDS or w.endswith(";"):
                        words = words[:i] + ([w[:-1]] if w.endswith(";") and len(w) > 1 else [])
                        break
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
                    words = words[1:]
                if "main.py" in words and words[0] in ("python3", "python", "torchrun", "torch_npu_run"):
                    argv = words[words.index("main.py") + 1:]
                    if argv or not elided:  # `python3 main.py ...`: a command shown for its environment
                        out.append(("main", argv))
                elif len(words) > 1 and words[0] == "bash" and os.path.basename(words[1]) in DRIVERS and \
                        words[1].startswith("test/"):
                    out.append((os.path.basename(words[1]), words[2:]))
    return out


# ---------------------------------------------------------------- the commands, parsed and planned

PLANNER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from trainer.config import parse_config
from trainer.errors import UsageError
from trainer.plan import plan
from modelzoo import plan as zoo
results = []
for kind, argv, data, mode, scale in json.load(sys.stdin):
    try:
        if kind != "main":
            p = zoo.resolve(zoo.parse(argv, mode, scale, kind), mode, scale, kind, dict(os.environ))
            argv = zoo.command(p)[3:]
        parsed = parse_config(argv, env={}, prog="main.py")
        inputs = [parsed.cfg.model.pretrained, parsed.cfg.run.resume if parsed.cfg.run.resume != "auto" else None]
        if all(f is None or os.path.exists(f) for f in inputs):
            plan(parsed.cfg, env={}, notes=parsed.notes)
        results.append(None)
    except (UsageError, SystemExit) as exc:
        results.append(str(exc) or "exit {}".format(exc))
print("RESULTS " + json.dumps(results))
"""

PLACEHOLDER_DATA = ("/data/imagenet", "DIR", "DATA", "data/shapes", "./tiny-imagenet-200", "/data/xxx/",
                    "/path/to/imagenet")


def _with_data(kind, argv, data):
    """The command with its data path replaced by ``data`` where the path is one of the docs' placeholders."""
    if kind == "main":
        return [data if a in PLACEHOLDER_DATA else a for a in argv]
    return ["--data_path=" + data if a.startswith("--data_path=") and a.split("=", 1)[1] in PLACEHOLDER_DATA
            else a for a in argv]


def plan_commands(cmds, data, tmp_path):
    """Parse and plan each (kind, argv) in a child process on the fake 8-NPU torch_npu (outputs under tmp_path);
    returns each one's error or None."""
    todo = []
    for kind, argv in cmds:
        argv = _with_data(kind, argv, data)
        mode, scale = DRIVERS.get(kind, (None, None))
        todo.append([kind, argv, data, mode, scale])
    env = {k: v for k, v in os.environ.items() if k not in runtime.CANN_VARIABLES + ("CPU_AFFINITY_CONF",)}
    env.update(PYTHONPATH=os.pathsep.join([FAKE, ROOT]), FAKE_NPU_DEVICE_COUNT="8", TORCH_HOME=str(tmp_path),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([PY, "-c", PLANNER, ROOT], input=json.dumps(todo), capture_output=True, text=True,
                          timeout=240, cwd=str(tmp_path), env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[-1][len("RESULTS "):])


def test_every_command_in_the_docs_parses_and_plans(shapes, tmp_path):
    cmds, where = [], []
    for path in doc_files():
        with open(path) as f:
            for kind, argv in commands(f.read()):
                cmds.append((kind, argv))
                where.append(os.path.relpath(path, ROOT))
    assert len(cmds) >= 20, cmds  # the docs show at least these many; fewer means the reader missed them
    results = plan_commands(cmds, shapes, tmp_path)
    bad = ["{}: {} {}: {}".format(w, "main.py" if k == "main" else "test/" + k, " ".join(a), r)
           for (k, a), w, r in zip(cmds, where, results) if r is not None]
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- files, modules and flags named

def _backticked(text):
    return re.findall(r"`([^`\n]+)`", text)


def named_paths(text):
    """Repository paths the text names (in backticks or in a command): source folders and top-level files."""
    out = set()
    for token in _backticked(text) + [w for block in code_blocks(text) for ln in block for w in ln.split()]:
        token = token.strip().strip(",;:.()'\"")
        token = re.sub(r":\d+(-\d+)?$", "", token)
        if any(c in token for c in "<>{}$*?") or " " in token or "STAMP" in token:
            continue
        if token.startswith(SOURCE_DIRS) or token in TOP_FILES or re.match(r"^test/[a-z_0-9]+\.sh$", token):
            out.add(token.rstrip("/"))
    return out


def _module_basenames():
    """{basename: [dotted paths]} of the project's modules (align: trainer.align, tools.align)."""
    paths = {}
    for pkg in ("trainer", "tools", "modelzoo", "models"):
        for path in sorted(glob.glob(os.path.join(ROOT, pkg, "**", "*.py"), recursive=True)):
            dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            dotted = dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted
            paths.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
    return paths


FILE_TAILS = ("py", "md", "sh", "json", "jsonl", "csv", "txt", "log", "lock", "tar", "toml", "yaml", "png", "pth")


def named_modules(text):
    """Modules the text runs (`python3 -m X`) or names by dotted path (trainer.x.y, tools.x, modelzoo.x)."""
    out = set(re.findall(r"python3? -m ((?:tools|modelzoo|trainer)(?:\.[a-z_0-9]+)+)", text))
    for token in _backticked(text):
        if re.fullmatch(r"(?:trainer|tools|modelzoo|models)(?:\.[A-Za-z_0-9]+)+", token):
            out.add(token)
    return out


def named_by_short_name(text):
    """{`module.name`: [the dotted paths it can be]} of what the text names by a module's short name
    (`align.check_flags(ns, explicit)`: trainer.align.check_flags or tools.align.check_flags), as DESIGN.md does."""
    short, out = _module_basenames(), {}
    for token in _backticked(text):
        m = re.fullmatch(r"([a-z_0-9]+)\.([A-Za-z_][A-Za-z_0-9]*)(?:\(.*\))?", token)
        if m and m.group(1) in short and m.group(2) not in FILE_TAILS:
            out["{}.{}".format(*m.groups())] = ["{}.{}".format(mod, m.group(2)) for mod in short[m.group(1)]]
    return out


def _resolves(dotted):
    """Whether a dotted name is a module of the project, or an attribute of one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:i])
        path = base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")
        if os.path.exists(path):
            rest = parts[i:]
            if not rest:
                return True
            tree = ast.parse(open(path, "rb").read())
            names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            names |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                      if isinstance(t, ast.Name)}
            names |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
            return rest[0] in names
    return False


def _parser_flags():
    """Every option string the project's parsers define (main.py's, made from trainer/flags.py's declarations; the
    tools', read from the sources; the drivers' --key=value keys), and torchrun's."""
    flags = set()
    for path in glob.glob(os.path.join(ROOT, "trainer", "*.py")) + glob.glob(os.path.join(ROOT, "tools", "*.py")) + \
            glob.glob(os.path.join(ROOT, "modelzoo", "*.py")) + glob.glob(os.path.join(ROOT, "bench", "*.py")):
        tree = ast.parse(open(path, "rb").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    flags |= main_flags()
    from modelzoo.plan import VALUE_KEYS
    flags |= {"--" + k for k in VALUE_KEYS} | {"--dummy", "--hf32", "--fp32"}
    from torch.distributed.run import get_args_parser
    for action in get_args_parser()._actions:
        flags |= set(action.option_strings)
    return flags


def main_flags():
    """main.py's options as --help lists them (suppressed ones aside)."""
    import argparse
    from trainer.flags import build_parser
    return {s for a in build_parser()._actions if a.help != argparse.SUPPRESS for s in a.option_strings
            if s.startswith("--")}


def named_flags(text):
    """--flags the text names, without their values (--key=value as --key)."""
    return {m.split("=")[0] for m in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*(?:=\S*)?", text)}


def problems(text, known_flags, short_names=False):
    """What a docs text names that the code does not have: files, modules (and functions, classes), flags."""
    out = ["file {} does not exist".format(p) for p in sorted(named_paths(text))
           if not os.path.exists(os.path.join(ROOT, p))]
    out += ["module {} does not exist".format(m) for m in sorted(named_modules(text)) if not _resolves(m)]
    if short_names:
        out += ["{} is in none of {}".format(name, ", ".join(m.rsplit(".", 1)[0] for m in paths))
                for name, paths in sorted(named_by_short_name(text).items()) if not any(map(_resolves, paths))]
    out += ["flag {} is no flag of main.py, the drivers, the tools or torchrun".format(f)
            for f in sorted(named_flags(text)) if f not in known_flags and f not in OTHER_FLAGS]
    return out


def test_every_file_module_and_flag_the_docs_name_exists():
    known = _parser_flags()
    bad = []
    for path in doc_files():
        with open(path) as f:
            bad += ["{}: {}".format(os.path.relpath(path, ROOT), p)
                    for p in problems(f.read(), known, short_names=path.endswith("DESIGN.md"))]
    assert not bad, "\n".join(bad)


def flag_tables(text):
    """The flags in the first column of the text's markdown tables (a cell that starts with `--flag`)."""
    return {m for row in re.findall(r"^\|\s*([^|\n]*)\|", text, re.M)
            for m in re.findall(r"`(--[a-z][a-z0-9_-]*)", row)}


def test_the_flag_tables_agree_with_main_pys_help():
    text = "\n".join(open(p).read() for p in doc_files())
    helped = main_flags()
    tabled = flag_tables(text)
    assert tabled, "no flag table found"
    drivers = {"--" + k for k in __import__("modelzoo.plan", fromlist=["VALUE_KEYS"]).VALUE_KEYS}
    unknown = sorted(f for f in tabled if f not in helped and f not in drivers and f not in _parser_flags())
    assert not unknown, "in a flag table but not in main.py --help: {}".format(unknown)
    undocumented = sorted(f for f in helped if f not in named_flags(text))
    assert not undocumented, "in main.py --help but in no page of the docs: {}".format(undocumented)


def test_every_docs_page_is_reachable_from_the_readme():
    readme = open(os.path.join(ROOT, "README.md")).read()
    linked = set(re.findall(r"\(?(docs/[A-Z_a-z0-9]+\.md)", readme))
    pages = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    assert pages <= linked, sorted(pages - linked)


def test_the_checks_fail_on_a_renamed_flag_and_a_moved_file(shapes, tmp_path):
    """The checker itself: a page that names a flag main.py no longer has, a file that moved and (DESIGN.md) a
    function by its module's short name that is gone is reported."""
    page = ("Run `python3 main.py DIR --amp-old` (see `trainer/launch.py`, `trainer.job.ranks.spawn`).\n\n"
            "```bash\npython3 main.py /data/imagenet -a resnet18 --amp-old --device cpu\n"
            "bash test/train_full_1p.sh --data_path=/data/imagenet --arch=resnet18 --not_a_key=1\n```\n")
    found = problems(page, _parser_flags())
    assert "file trainer/launch.py does not exist" in found, found  # moved to trainer/job/launch.py
    assert any(p.startswith("flag --amp-old ") for p in found) and any("--not_a_key" in p for p in found), found
    assert not any("trainer.job.ranks.spawn" in p for p in found), found  # it exists
    design = "`align.RunFields` holds them; `align.check_flags(ns, explicit)` checks them; see `metrics.jsonl`."
    assert problems(design, set(), short_names=True) == ["align.RunFields is in none of trainer.align, tools.align"]
    results = plan_commands(commands(page), shapes, tmp_path)
    assert "unrecognized arguments: --amp-old" in results[0] and "--not_a_key" in results[1], results
