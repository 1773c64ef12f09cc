"""The Ascend stack runs Python 3.7-3.9 with torch 1.11: keep the sources 3.7-clean (syntax and standard
library) and within torch 1.11's API, with newer torch APIs only behind the device layer's version guards."""
import ast
import functools
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ONCE, ROOT

pytestmark = ONCE

TOPS = ("main.py", "trainer", "models", "modelzoo", "tools", "bench")
SOURCES = []
for top in TOPS:
    path = os.path.join(ROOT, top)
    if os.path.isfile(path):
        SOURCES.append(path)
    for dirpath, _, files in os.walk(path):
        SOURCES.extend(os.path.join(dirpath, f) for f in files if f.endswith(".py"))

DEVICE_PACKAGE = os.path.join("trainer", "device") + os.sep  # the package: its facade, base, one module per kind
DEVICE_LAYER = (os.path.join("trainer", "device_names.py"),)


def in_device_layer(rel):
    """Whether ``rel`` (a path from the repository root) is a module of the device layer."""
    return rel.startswith(DEVICE_PACKAGE) or rel in DEVICE_LAYER


@pytest.mark.parametrize("path", sorted(SOURCES), ids=lambda p: os.path.relpath(p, ROOT))
def test_parses_as_python_37(path):
    """ast's own check of the grammar (walrus, positional-only parameters, f-string ``=``); best effort,
    test_vermin_finds_nothing_newer_than_python_37 is the thorough one."""
    with open(path) as f:
        ast.parse(f.read(), filename=path, feature_version=(3, 7))


def test_device_words_stay_in_the_device_layer():
    """Only the device layer (trainer/device/, and trainer/device_names.py, its torch-free names) names
    a device kind: no other trainer module decides per kind."""
    offenders = []
    for path in SOURCES:
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith("trainer" + os.sep) or in_device_layer(rel):
            continue
        with open(path) as f:
            for n, line in enumerate(f, 1):
                code = line.split("#", 1)[0]
                if any(w in code for w in ('"npu"', "'npu'", '"cuda"', "'cuda'", '"cpu"', "'cpu'")):
                    offenders.append("{}:{}: {}".format(rel, n, line.strip()))
    assert not offenders, "\n".join(offenders)


# ---------------------------------------------------------------- torch 1.11's API

TORCH111_API = os.path.join(ROOT, "tests", "compat", "torch111_api.txt")

# torch names newer than 1.11 that the sources use, each only in the device layer behind a version guard:
# name (a use is covered by the name or any name under it) -> where it is guarded.
NEWER = {
    "torch.compile": "torch.compile (torch >= 2.0): Device.compile through shims.torch_compile, behind "
                     "shims.has_torch_compile (hasattr); --compile is a one-line error on older torch",
    "torch.amp": "torch.amp.GradScaler (torch >= 2.3): Device.grad_scaler, behind _has_amp_grad_scaler "
                 "(hasattr); torch.cuda.amp.GradScaler on older torch",
}


@functools.lru_cache(maxsize=None)
def torch111():
    """(the names of torch 1.11, the names among them with members: modules and classes)."""
    with open(TORCH111_API) as f:
        names = frozenset(line.strip() for line in f if line.strip() and not line.startswith("#"))
    return names, frozenset(n.rsplit(".", 1)[0] for n in names if "." in n)


def is_torch(name):
    return name == "torch" or name.startswith("torch.")


def torch_uses(source, filename="<source>"):
    """[(line, dotted name)] of every torch name ``source`` uses statically: each ``import torch.x`` and
    ``from torch.x import y``, and each attribute chain rooted at a name such an import binds (``torch``,
    ``nn`` of ``import torch.nn as nn``, ``F``, ``y``). Attributes of what calls return and names in
    strings (``getattr(torch, "compile")``) are not followed. Imports anywhere in the file count for all
    of it."""
    tree = ast.parse(source, filename=filename)
    aliases, uses = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_torch(alias.name):
                    uses.append((node.lineno, alias.name))
                    bound = alias.asname or alias.name.split(".")[0]
                    aliases[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_torch(node.module or ""):
            for alias in node.names:
                uses.append((node.lineno, node.module + "." + alias.name))
                aliases[alias.asname or alias.name] = node.module + "." + alias.name
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        parts, root = [], node
        while isinstance(root, ast.Attribute):
            parts.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in aliases:
            uses.append((node.lineno, ".".join([aliases[root.id]] + parts[::-1])))
    return sorted(set(uses))


def unknown_in_torch111(name):
    """The first part of ``name`` that torch 1.11 lacks (``torch.amp`` of ``torch.amp.GradScaler``), or None:
    each part is looked up in what holds it while that is a module or class; after a function or value
    (``torch.ops``, ``torch.backends.cuda.matmul``) the rest is out of reach."""
    names, holders = torch111()
    parts = name.split(".")
    for i in range(1, len(parts)):
        holder, nxt = ".".join(parts[:i]), ".".join(parts[:i + 1])
        if nxt not in names:
            return nxt if holder in holders else None
    return None


def newer_entry(name):
    return next((k for k in NEWER if name == k or name.startswith(k + ".")), None)


def all_uses():
    for path in sorted(SOURCES):
        with open(path) as f:
            for line, name in torch_uses(f.read(), path):
                yield os.path.relpath(path, ROOT), line, name


# sources that run only on the torch_npu double (tests/fake_npu), which imports on torch >= 2.1 only: never on the
# 1.11 stack, so torch 1.11's API does not bind them (Python 3.7 does)
DOUBLE_ONLY = {os.path.join("bench", "host_syncs.py"): "counts device-to-host copies on the torch_npu double"}


def test_torch_names_exist_in_torch_111():
    """Every torch name the sources use exists in torch 1.11, or is listed in NEWER."""
    offenders = []
    for rel, line, name in all_uses():
        unknown = unknown_in_torch111(name)
        if not unknown or newer_entry(name) or rel in DOUBLE_ONLY:
            continue
        fix = "put it behind a version guard in trainer/device/ and list it in NEWER (tests/test_compat.py)"
        if any(p.startswith("_") and not p.endswith("__") for p in unknown.split(".")):
            fix = ("the list has private names only where tests/compat/make_torch111_api.py's KEEP_PRIVATE names "
                   "them: add it there and remake the list if torch 1.11 has it, else " + fix)
        offenders.append("{}:{}: {}: torch 1.11 has no {} (tests/compat/torch111_api.txt); {}".format(
            rel, line, name, unknown, fix))
    assert not offenders, "\n".join(offenders)


def test_newer_names_stay_in_the_device_layer():
    """The torch names newer than 1.11 are used only in the device layer, where each has its version guard."""
    offenders = ["{}:{}: {} is newer than torch 1.11 (NEWER: {}); put it behind a version guard in trainer/device/"
                 .format(rel, line, name, NEWER[newer_entry(name)])
                 for rel, line, name in all_uses() if newer_entry(name) and not in_device_layer(rel)]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("name", sorted(NEWER))
def test_newer_entries_are_newer_and_used(name):
    """Each NEWER entry is missing from torch 1.11 and still used (else it is stale)."""
    assert unknown_in_torch111(name), "{} exists in torch 1.11: remove it from NEWER".format(name)
    assert any(newer_entry(n) == name for _, _, n in all_uses()), "{} is not used any more: remove it from NEWER" \
        .format(name)


def test_torch111_list_knows_torch_111():
    """The list holds what torch 1.11 has, through each of the ways torch builds its namespace, and lacks
    names that came later."""
    names, _ = torch111()
    for name in ("torch.nn.functional.interpolate",  # a module's function
                 "torch.nn.Conv2d",  # torch/nn/__init__.py: from .modules import * (its __all__)
                 "torch.nn.Module.train",  # a class member
                 "torch.cuda.amp.GradScaler.unscale_",  # a re-exported class's member
                 "torch.Tensor.record_stream",  # torch.Tensor's C base, from torch/_C/__init__.pyi
                 "torch.float16", "torch.Generator",  # from torch._C import *
                 "torch.cat", "torch.frombuffer",  # the torch._C._VariableFunctions loop
                 "torch.backends.cudnn.benchmark",  # a module replaced by an object of its class
                 "torch.distributed.ReduceOp.MAX",  # a C module's stub, through from .distributed_c10d import *
                 "torch.__version__",
                 "torch.utils.data._utils.collate.default_collate"):  # KEEP_PRIVATE
        assert name in names, name
    for name in ("torch.compile", "torch.amp", "torch.func", "torch.nn.functional.scaled_dot_product_attention",
                 "torch.Tensor.untyped_storage",
                 "torch.scatter_reduce"):  # in the x86_64 1.11.0 wheels, not in the aarch64 ones
        assert name not in names, name
        assert unknown_in_torch111(name + ".x") == name


def test_torch_uses_follows_imports_and_aliases():
    source = "\n".join([
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "from torch.cuda import amp",
        "import torch.utils.data",
        "x = torch.compile(nn.Linear(1, 1).weight)",
        "y = F.interpolate(amp.GradScaler.scale, torch.ops.aten.foo)",
        "import torchvision",
        "torchvision.models.foo",
    ])
    names = [n for _, n in torch_uses(source)]
    assert names == ["torch", "torch.nn", "torch.nn.functional", "torch.cuda.amp", "torch.utils.data",
                     "torch.compile", "torch.nn.Linear", "torch.cuda.amp.GradScaler.scale",
                     "torch.nn.functional.interpolate", "torch.ops.aten.foo"]
    assert [n for n in names if unknown_in_torch111(n)] == ["torch.compile"]


# ---------------------------------------------------------------- Python 3.7: vermin

# vermin (https://pypi.org/project/vermin/) finds the minimum Python each line needs, from its syntax and
# its standard library. Annotations count (Python 3.7 evaluates them). ``--exclude long``: vermin takes
# ``t.long()`` for Python 2's builtin ``long``, which Python 3 lacks, and then gives the file no verdict (its
# exit status let a walrus added to trainer/data/device_backend.py pass).
VERMIN_ARGS = ["--no-config-file", "--no-make-paths-absolute", "--format", "parsable", "--violations",
               "-t=3.7-", "--eval-annotations", "--exclude", "long"]


def vermin_command():
    """vermin run by this Python where it is installed here (it has no ``python -m vermin`` entry: its package
    lacks __main__), else the ``vermin`` on PATH; None if neither."""
    if importlib.util.find_spec("vermin") is not None:
        return [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())"]
    found = shutil.which("vermin")
    return [found] if found else None


def needs_more_than_37(py3):
    """Whether vermin's Python 3 verdict (``3.8``, ``!3``: not on Python 3 at all) rules out Python 3.7."""
    if py3.startswith("!"):
        return True
    try:
        return tuple(int(p) for p in py3.split(".")) > (3, 7)
    except ValueError:
        return False


def vermin(paths, cwd):
    """(the lines that need more than Python 3.7 as "path:line: what needs Python V", vermin's verdict for all
    of ``paths``, the finished process). Skips the test where vermin is not installed."""
    command = vermin_command()
    if command is None:
        pytest.skip("vermin is not installed (pip install vermin)")
    proc = subprocess.run(command + VERMIN_ARGS + list(paths), cwd=cwd, capture_output=True, text=True, timeout=100)
    findings, verdict = [], None
    for line in proc.stdout.splitlines():
        parts = line.split(":", 5)  # path:line:column:py2:py3:feature; the last line only has the versions
        if len(parts) != 6:
            continue
        if not parts[0]:
            verdict = parts[4]
        elif parts[1] and needs_more_than_37(parts[4]):
            findings.append("{}:{}: {} needs Python {}".format(parts[0], parts[1], parts[5], parts[4]))
    return findings, verdict, proc


@pytest.mark.timeout(120)
def test_vermin_finds_nothing_newer_than_python_37():
    findings, verdict, proc = vermin(TOPS, ROOT)
    assert not findings, "\n".join(
        "{}; the Ascend stack runs Python 3.7: rewrite it, or keep it where a guard (try/except ImportError, "
        "a version check) gives 3.7 a fallback and mark that line # novermin with the reason".format(f)
        for f in findings)
    assert proc.returncode == 0 and verdict and not needs_more_than_37(verdict), (proc.stdout, proc.stderr)


@pytest.mark.timeout(120)
def test_vermin_sees_python_38_beside_tensor_long(tmp_path):
    """vermin as run above reports 3.8 code in a file that also calls ``t.long()`` (what ``--exclude long``
    is for), its standard library and annotations included, and honours # novermin."""
    (tmp_path / "new.py").write_text("\n".join([
        "import math",
        "def f(t, xs: list[int]):",
        "    if (n := t.long()) is not None:",
        "        return math.prod(xs)",
        "    from importlib import metadata  # novermin (guarded)",
    ]) + "\n")
    findings, verdict, proc = vermin(["new.py"], str(tmp_path))
    assert sorted(findings) == ["new.py:2: builtin generic type annotation (list[..]) needs Python 3.9",
                                "new.py:3: named expressions needs Python 3.8",
                                "new.py:4: 'math.prod' member needs Python 3.8"], proc.stdout
    assert verdict == "3.9" and proc.returncode == 1
