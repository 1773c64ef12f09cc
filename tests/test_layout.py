"""The project's layering, read from the sources with ast (nothing is imported): models <- trainer <- modelzoo <-
tools <- bench, each importing only the layers before it (a benchmark script may share another's runner, main.py is
imported by nothing); no import cycle among the modules; no sys.path edits outside tests/ (the project is installed,
or its tools run as modules from the repository root)."""
import ast
import os

import pytest
from conftest import ONCE

pytestmark = [ONCE, pytest.mark.timeout(60)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("models", "trainer", "modelzoo", "tools")  # each may import the ones before it, never those after
SKIP_DIRS = {"tests", "__pycache__", "build", "dist", "demo_data", "demo_output"}


def _sources():
    """{module name: path} of every project module outside tests/ (main.py, the packages, bench/)."""
    out = {}
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs
                         if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, f)
    return out


SOURCES = _sources()
TREES = {name: ast.parse(open(path, "rb").read(), path) for name, path in SOURCES.items()}


def _is_package(name):
    return os.path.basename(SOURCES[name]) == "__init__.py"


def _project(name):
    """The project module ``name`` stands for (itself, or the nearest enclosing one that exists), or None."""
    while name:
        if name in SOURCES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module, import_time_only):
    """(line, project module) for each import in ``module``; with ``import_time_only``, only the imports that run
    when the module is imported (not those inside functions)."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if not import_time_only:
                    visit(child, True)
                continue
            targets = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module if _is_package(module) else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        package = package.rpartition(".")[0]
                    base = package + ("." + base if base else "")
                targets = [base + "." + a.name if base + "." + a.name in SOURCES else base for a in child.names]
            for t in targets:
                parts = t.split(".")
                for i in range(1, len(parts) + 1):  # importing a.b.c imports a and a.b first
                    target = _project(".".join(parts[:i]))
                    if i < len(parts) and target and module.startswith(target + "."):
                        continue  # a package of this module's own: imported before it, whatever it does
                    if target and target != module:
                        found.append((child.lineno, target))
            visit(child, in_function)

    visit(TREES[module], False)
    return found


def _layer(name):
    top = name.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else None


def test_the_layers_exist():
    for layer in LAYERS:
        assert layer in SOURCES and _is_package(layer), layer
    assert "main" in SOURCES and "modelzoo.drivers" in SOURCES and "tools.acceptance" in SOURCES


def _upward(name, target):
    """Why ``name`` must not import ``target``, or None."""
    if target == "main":
        return "an entry point, imported by nothing"
    if target.split(".")[0] == "bench" and name.split(".")[0] != "bench":
        return "a benchmark script, imported only by another one"
    mine, theirs = _layer(name), _layer(target)
    if mine is not None and theirs is not None and theirs > mine:
        return "{} is above {}".format(LAYERS[theirs], LAYERS[mine])
    return None


def test_each_layer_imports_only_the_layers_below_it():
    wrong = ["{}:{} imports {} ({})".format(SOURCES[name], line, target, _upward(name, target))
             for name in SOURCES for line, target in _imports(name, import_time_only=False) if _upward(name, target)]
    assert not wrong, "\n".join(wrong)


def test_the_trainer_imports_neither_modelzoo_nor_tools_and_models_import_no_trainer():
    for name in SOURCES:
        targets = {t.split(".")[0] for _, t in _imports(name, import_time_only=False)}
        if name.split(".")[0] == "trainer":
            assert not targets & {"modelzoo", "tools", "bench", "main"}, name
        if name.split(".")[0] == "models":
            assert not targets & {"trainer", "modelzoo", "tools", "bench", "main"}, name


def _cycles(graph):
    state, stack, cycles = {}, [], []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            walk(name)
    return cycles


def test_no_import_cycle():
    """Among all imports, a function's own imports too: a cycle hidden in a function is a cycle still (two modules
    that need each other are one module, or share a third)."""
    cycles = _cycles({name: sorted({t for _, t in _imports(name, import_time_only=False)}) for name in SOURCES})
    assert not cycles, "\n".join(cycles)


# trainer/'s subsystems, lowest first: each imports only those before it and the spine's leaves; the spine (the
# modules at trainer/'s top that are not leaves) imports them all, and no subsystem imports the spine
SUBSYSTEMS = ("device", "optim", "record", "precision", "job", "data")
LEAVES = ("errors", "device_names", "cli", "options", "recipes", "zoo", "graph", "guard",
          "interpreter")  # imported by subsystems too
SPINE = ("config", "flags", "plan", "run", "trainer", "engine", "align", "inputs")


def _part(name):
    """trainer's part a module belongs to: a subsystem, "leaf" or "spine"; None outside trainer."""
    parts = name.split(".")
    if parts[0] != "trainer" or len(parts) < 2:
        return None
    if parts[1] in SUBSYSTEMS:
        return parts[1]
    return "leaf" if parts[1] in LEAVES else "spine" if parts[1] in SPINE else "unknown"


LEAF_MAY_IMPORT = ("device", "optim")  # the spine's leaves are imported by subsystems: they stay below the rest


def _across(name, target):
    """Why trainer module ``name`` must not import ``target``, or None."""
    mine, theirs = _part(name), _part(target)
    if mine is None or theirs is None:
        return None
    if "unknown" in (mine, theirs):
        return "{} is in no part of trainer/: name it in tests/test_layout.py".format(
            name if mine == "unknown" else target)
    if mine == theirs or theirs == "leaf" or mine == "spine":
        return None
    if theirs == "spine":
        return "the spine imports the subsystems, not the other way"
    if mine == "leaf":
        return None if theirs in LEAF_MAY_IMPORT else "a leaf of the spine imports only {}".format(
            " and ".join(LEAF_MAY_IMPORT))
    if SUBSYSTEMS.index(theirs) > SUBSYSTEMS.index(mine):
        return "{} is above {}".format(theirs, mine)
    return None


def test_trainers_subsystems_are_packages_that_import_only_downward():
    """tree trainer: the spine at the top, one package per subsystem; every module of trainer/ is in a part."""
    top = sorted(n.split(".")[1] for n in SOURCES if n.startswith("trainer.") and n.count(".") == 1)
    assert set(top) == set(SUBSYSTEMS + LEAVES + SPINE), top
    for package in SUBSYSTEMS:
        assert _is_package("trainer." + package), package
        doc = ast.get_docstring(TREES["trainer." + package]) or ""
        assert "May import" in doc or package in ("device", "optim", "data"), package
    wrong = ["{}:{} imports {} ({})".format(os.path.relpath(SOURCES[name], ROOT), line, target, _across(name, target))
             for name in SOURCES for line, target in _imports(name, import_time_only=False) if _across(name, target)]
    assert not wrong, "\n".join(wrong)


def _sys_path_edits(tree):
    def is_sys_path(node):
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            yield node.lineno  # sys.path.insert / append / extend / remove ...
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                    yield node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            yield node.lineno


def test_no_sys_path_edits_outside_tests():
    edits = ["{}:{}".format(SOURCES[name], line) for name in sorted(SOURCES) for line in _sys_path_edits(TREES[name])]
    assert not edits, "sys.path is edited here (install the project or run the tool as a module instead): " + \
        ", ".join(edits)


MAX_MODULE_LINES = 500  # a module past this is split (tests/ and bench/ aside)


def test_no_module_outside_tests_and_bench_is_over_500_lines():
    long = []
    for name in sorted(SOURCES):
        if name.split(".")[0] == "bench":
            continue
        with open(SOURCES[name], "rb") as f:
            lines = f.read().count(b"\n")
        if lines > MAX_MODULE_LINES:
            long.append("{} ({} lines)".format(os.path.relpath(SOURCES[name], ROOT), lines))
    assert not long, "over {} lines, split them: {}".format(MAX_MODULE_LINES, ", ".join(long))


MAX_FUNCTION_LINES = 80  # a function past this is split into steps with names (tests/ and bench/ aside)


def _long_functions(name):
    """["path:line name (N lines)"] of module ``name``'s functions and methods over MAX_FUNCTION_LINES."""
    return ["{}:{} {} ({} lines)".format(os.path.relpath(SOURCES[name], ROOT), node.lineno, node.name,
                                         node.end_lineno - node.lineno + 1)
            for node in ast.walk(TREES[name]) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_outside_tests_and_bench_is_over_80_lines():
    """The trainer, the models, the ModelZoo layer, the tools and main.py: a reader follows a function on a page."""
    long = [line for name in sorted(SOURCES) if name.split(".")[0] != "bench" for line in _long_functions(name)]
    assert not long, "over {} lines, split them: {}".format(MAX_FUNCTION_LINES, ", ".join(long))


MAX_PARAMETERS = 8  # a function that needs more takes the part, section or record that holds them


def _parameters(node):
    """The parameters a caller passes to function ``node`` (self and cls aside; *args and **kwargs one each)."""
    a = node.args
    names = [x.arg for x in getattr(a, "posonlyargs", []) + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_function_of_the_trainer_modelzoo_or_tools_takes_more_than_8_parameters():
    """Functions, methods and hand-written constructors (a dataclass's fields are a record, not a call)."""
    many = ["{}:{} {} ({})".format(os.path.relpath(SOURCES[name], ROOT), node.lineno, node.name, _parameters(node))
            for name in sorted(SOURCES) if name.split(".")[0] in ("trainer", "modelzoo", "tools")
            for node in ast.walk(TREES[name])
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MAX_PARAMETERS]
    assert not many, "more than {} parameters: {}".format(MAX_PARAMETERS, ", ".join(many))


def test_the_checks_see_what_they_check():
    """The scanners find a cycle, an upward import and a sys.path edit where there is one."""
    tree = ast.parse("import sys\nsys.path.insert(0, '.')\nsys.path[:0] = ['x']\nsys.path += ['y']\n")
    assert sorted(_sys_path_edits(tree)) == [2, 3, 4]
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a -> b -> c -> a"]
    assert _upward("trainer.run", "modelzoo.plan") and _upward("models.tiny", "trainer.errors")
    assert _upward("tools.plot_runs", "main") and not _upward("tools.acceptance", "modelzoo.acceptance")
    assert _across("trainer.record.summary", "trainer.job.ranks") == "job is above record"
    assert _across("trainer.job.ranks", "trainer.plan") and not _across("trainer.plan", "trainer.job.ranks")
    assert _across("trainer.newthing", "trainer.errors") and not _across("trainer.job.ranks", "trainer.cli")
    assert "trainer.errors" in {t for _, t in _imports("modelzoo.plan", import_time_only=True)}
    assert _project("trainer.errors.UsageError") == "trainer.errors" and _project("torch.nn") is None
    SOURCES["_probe"] = os.path.join(ROOT, "probe.py")
    TREES["_probe"] = ast.parse("def f():\n" + "    x = 1\n" * 80 + "\ndef g():\n    pass\n")
    try:
        assert _long_functions("_probe") == ["probe.py:1 f (81 lines)"]
    finally:
        del SOURCES["_probe"], TREES["_probe"]
    wide = ast.parse("def f(a, b, c, d, e, g, h, i, *rest, **kw): pass\nclass C:\n    def m(self, a, *, b=1): pass\n")
    assert [_parameters(n) for n in ast.walk(wide) if isinstance(n, ast.FunctionDef)] == [10, 2]
