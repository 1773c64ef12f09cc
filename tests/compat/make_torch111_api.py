"""Write tests/compat/torch111_api.txt: the dotted names that exist in torch 1.11.0, read from its wheels.

The Ascend stack runs this trainer on torch 1.11; tests/test_compat.py checks every ``torch.x.y`` the
sources use against this list. The list is read from the wheel's Python sources and ``.pyi`` stubs
with ``ast`` (nothing of the wheel is imported or run: any Python reads any platform's wheel):

- every module (``torch/a/b.py``, ``torch/a/__init__.py``, ``torch/a/b.pyi``) as ``torch.a.b``;
- each module-level name: functions, classes, assignments, imports (``import x as y``, ``from x import
  y``), and ``from x import *`` resolved through ``x.__all__`` where it is a literal list, else through
  x's public names; names under ``if TYPE_CHECKING:`` are left out (they do not exist at run time),
  ``del x`` is honoured; in a stub, only the imports that re-export (``import x as x``) count;
- the members of each class (its functions, nested classes and class-level assignments, and those of
  its bases where they resolve to a class of torch): ``torch.Tensor.cuda`` (``torch._C._TensorBase``'s
  methods), ``torch.cuda.amp.GradScaler.scale`` (defined in ``torch.cuda.amp.grad_scaler``);
- what torch fills in at import time from C, read from the stubs of the C modules (``torch/_C/*.pyi``):
  ``from torch._C import *`` (dtypes such as ``torch.float16``, ``torch.Generator``), the loop of
  ``torch/__init__.py`` that copies ``torch._C._VariableFunctions`` into ``torch`` (``torch.cat``),
  that of ``torch/return_types.py`` (``torch._C._return_types``, which has no stub: nothing), and the
  modules that replace themselves with an object of a class of theirs (``sys.modules[__name__] =
  CudnnModule(...)``: ``torch.backends.cudnn.benchmark``).

Only names under ``torch.`` are written, and of those no private ones (a part that starts with one
underscore) and no dunder class members, except the private names in ``KEEP_PRIVATE``, which the
trainer uses with torch 1.11; module-level dunders (``torch.__version__``) stay. A class's members are
listed under one of its names, the shortest (``torch.nn.Conv2d.forward``, not
``torch.nn.modules.conv.Conv2d.forward``); its other names are listed without members.

PyPI's torch 1.11.0 wheels were not all built from the same commit: the aarch64 ones (the Ascend
guide's ``torch-1.11.0-cp37-cp37m-manylinux2014_aarch64.whl``) lack ``torch.scatter_reduce`` and
``torch.distributed.DebugLevel``, which the x86_64 ones have. Given several wheels, the list holds
the names that all of them have. The output is sorted and depends only on the wheels. The committed
list was made with:

    pip download torch==1.11.0 --no-deps --only-binary :all: --python-version 3.9 \\
        --platform manylinux1_x86_64 -d /tmp/w
    pip download torch==1.11.0 --no-deps --only-binary :all: --python-version 3.7 \\
        --platform manylinux2014_aarch64 -d /tmp/w
    python tests/compat/make_torch111_api.py /tmp/w/torch-1.11.0-cp39-cp39-manylinux1_x86_64.whl \\
        /tmp/w/torch-1.11.0-cp37-cp37m-manylinux2014_aarch64.whl

(the sha256 of each wheel is in the list's first lines).
"""
import argparse
import ast
import hashlib
import os
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "torch111_api.txt")

# Private names the trainer uses (written with everything under them): torch 1.11 has no public name
# for these.
KEEP_PRIVATE = (
    "torch.nn.modules.dropout._DropoutNd",  # models/shufflenet_npu.py: dropout layers are found by class
    "torch.utils.data._utils",  # trainer/data.py: default_collate (torch.utils.data.default_collate is 1.11+)
)

# Loops in torch's sources that copy a C module's names into a Python module (``globals()[name] = ...``):
# module -> (C module whose public names it gets, names it leaves out).
DYNAMIC_COPIES = {
    "torch": ("torch._C._VariableFunctions", ("unique_dim",)),  # torch/__init__.py, PRIVATE_OPS
    "torch.return_types": ("torch._C._return_types", ()),  # torch/return_types.py
}


class Class:
    """A class body: its member names (nested classes as Class) and its bases as dotted expressions."""

    def __init__(self, module, bases):
        self.module, self.bases, self.members = module, bases, {}

    def bind(self, name, binding):
        if binding is None:
            self.members.pop(name, None)
        else:
            self.members[name] = binding


class Module:
    """A module's bindings: name -> ("def",) / ("value",) / ("class", Class) / ("alias", dotted target)."""

    def __init__(self, name, is_package):
        self.name, self.is_package = name, is_package
        self.names = {}
        self.stars = []  # modules of ``from x import *``, in order
        self.deleted = set()
        self.all_literal, self.all_dynamic = None, False
        self.replaced_by = None  # class name of ``sys.modules[__name__] = Cls(...)``


def dotted(node):
    """``a.b.c`` of a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def literal_names(node):
    """The strings of a literal list/tuple (or a sum of them), else None."""
    if isinstance(node, (ast.List, ast.Tuple)):
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return [e.value for e in node.elts]
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal_names(node.left), literal_names(node.right)
        return None if left is None or right is None else left + right
    return None


def class_bases(node):
    """A class statement's base expressions; ``with_metaclass(Meta, A, B)`` (torch.autograd.Function) gives
    A and B."""
    out = []
    for base in node.bases:
        if isinstance(base, ast.Call) and dotted(base.func) in ("with_metaclass", "six.with_metaclass"):
            out.extend(base.args[1:])
        else:
            out.append(base)
    return out


def is_type_checking(test):
    return dotted(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def is_typevar(value):
    return isinstance(value, ast.Call) and dotted(value.func) in ("TypeVar", "typing.TypeVar", "NewType",
                                                                  "typing.NewType")


def absolute(module, level, target):
    """The absolute module of ``from <level dots><target> import`` inside ``module``."""
    if level == 0:
        return target
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    parts = parts[:len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(parts + ([target] if target else []))


def walk_body(body, module, bind, stub):
    """Call ``bind(name, binding)`` for every binding of a module or class body, in order."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bind(node.name, ("def",))
        elif isinstance(node, ast.ClassDef):
            cls = Class(module, [d for d in (dotted(b) for b in class_bases(node)) if d])
            walk_body(node.body, module, cls.bind, stub)
            bind(node.name, ("class", cls))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if stub and value is not None and is_typevar(value):
                continue
            for target in targets:
                if isinstance(target, ast.Subscript) and dotted(target.value) == "sys.modules" \
                        and dotted(target.slice) == "__name__" and isinstance(value, ast.Call):
                    module.replaced_by = dotted(value.func)
                for t in ([target] if not isinstance(target, (ast.Tuple, ast.List)) else target.elts):
                    if isinstance(t, ast.Name):
                        if t.id == "__all__":
                            module.all_literal = literal_names(value) if value is not None else None
                            module.all_dynamic = module.all_literal is None
                        src = dotted(value) if value is not None and len(targets) == 1 else None
                        bind(t.id, ("alias", src) if src else ("value",))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            more = literal_names(node.value)
            if more is None or module.all_literal is None:
                module.all_dynamic = True
            else:
                module.all_literal = module.all_literal + more
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and dotted(node.value.func) in ("__all__.append", "__all__.extend"):
            args = node.value.args
            more = None
            if dotted(node.value.func) == "__all__.append" and len(args) == 1 \
                    and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                more = [args[0].value]
            elif dotted(node.value.func) == "__all__.extend" and len(args) == 1:
                more = literal_names(args[0])
            if more is None or module.all_literal is None:
                module.all_dynamic = True
            else:
                module.all_literal = module.all_literal + more
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if stub and alias.asname != alias.name:
                    continue
                if alias.asname:
                    bind(alias.asname, ("alias", alias.name))
                else:
                    top = alias.name.split(".")[0]
                    bind(top, ("alias", top))
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node.level, node.module)
            for alias in node.names:
                if alias.name == "*":  # only allowed at module level
                    module.stars.append(source)
                    continue
                if stub and alias.asname != alias.name:
                    continue
                bind(alias.asname or alias.name, ("alias", source + "." + alias.name))
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                walk_body(node.body, module, bind, stub)
            walk_body(node.orelse, module, bind, stub)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                walk_body(part, module, bind, stub)
            for handler in node.handlers:
                walk_body(handler.body, module, bind, stub)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            walk_body(node.body, module, bind, stub)
            if not isinstance(node, ast.With):
                walk_body(node.orelse, module, bind, stub)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bind(t.id, None)


class Torch:
    """The modules of the wheel and the name resolution between them."""

    def __init__(self, wheel):
        self.modules = {}
        with zipfile.ZipFile(wheel) as z:
            files = sorted(n for n in z.namelist() if n.startswith("torch/") and n.endswith((".py", ".pyi")))
            stems = {n.rsplit(".", 1)[0] for n in files if n.endswith(".py")}
            for path in files:
                stub = path.endswith(".pyi")
                stem = path.rsplit(".", 1)[0]
                parts = stem.split("/")
                is_package = parts[-1] == "__init__"
                name = ".".join(parts[:-1] if is_package else parts)
                if any(not p.isidentifier() for p in name.split(".")):
                    continue
                mod = self.modules.get(name)
                if mod is None:
                    mod = self.modules[name] = Module(name, is_package)
                if stub and stem in stems:
                    continue  # the module's own source says what exists at run time
                tree = ast.parse(z.read(path).decode("utf-8"), filename=path)
                self.read(mod, tree, stub)
        self._names, self._targets, self._busy = {}, {}, set()

    def read(self, mod, tree, stub):
        def bind(name, binding):
            if binding is None:
                mod.names.pop(name, None)
                mod.deleted.add(name)
            else:
                mod.names[name] = binding
                mod.deleted.discard(name)
        walk_body(tree.body, mod, bind, stub)

    # -- names

    def names(self, modname):
        """name -> binding of a module, with its star imports, copies from C and replacing class. Asked
        again while it is being worked out (modules that import each other), only its own bindings."""
        if modname in self._names:
            return self._names[modname]
        mod = self.modules.get(modname)
        if mod is None:
            return {}
        if modname in self._busy:
            return mod.names
        self._busy.add(modname)
        out = {}
        for star in mod.stars:
            for name in self.exported(star):
                out[name] = ("alias", star + "." + name)
        for name in mod.deleted:
            out.pop(name, None)
        out.update(mod.names)
        if modname in DYNAMIC_COPIES:
            source, skip = DYNAMIC_COPIES[modname]
            for name in self.exported(source):
                if name not in skip and not name.startswith("__"):  # both loops skip dunders
                    out.setdefault(name, ("alias", source + "." + name))
        if mod.replaced_by:
            cls = mod.names.get(mod.replaced_by)
            if cls and cls[0] == "class":
                for name, binding in self.members(cls[1]).items():
                    if not (name.startswith("__") and name.endswith("__")):
                        out.setdefault(name, binding)
        self._busy.discard(modname)
        self._names[modname] = out
        return out

    def exported(self, modname):
        """The names ``from modname import *`` binds: its literal ``__all__``, else its public names."""
        mod = self.modules.get(modname)
        if mod is None:
            return []
        if mod.all_literal is not None and not mod.all_dynamic:
            return list(mod.all_literal)
        names = [n for n in self.names(modname) if not n.startswith("_")]
        if mod.all_literal:
            names += [n for n in mod.all_literal if n not in names]
        return names

    def members(self, cls):
        """A class's members with its bases' (bases first, the class's own win)."""
        out = {}
        if id(cls) in self._busy:
            return dict(cls.members)
        self._busy.add(id(cls))
        for base in cls.bases:
            found = self.lookup_in(cls.module.name, base)
            if found and found[0] == "class":
                out.update(self.members(found[1]))
        self._busy.discard(id(cls))
        out.update(cls.members)
        return out

    def lookup_in(self, modname, expr):
        """What ``expr`` (dotted) means inside module ``modname``."""
        head, _, rest = expr.partition(".")
        binding = self.names(modname).get(head)
        if binding is None:
            return self.lookup(modname + "." + expr) if modname + "." + head in self.modules else None
        return self.follow(binding, rest.split(".") if rest else [])

    def resolve(self, binding):
        """An alias binding followed to its module / class / def / value; None where it leaves torch's
        sources or comes back to itself."""
        if binding is None or binding[0] != "alias":
            return binding
        target = binding[1]
        if target in self.modules:
            return ("module", target)
        if target not in self._targets:
            self._targets[target] = None  # an alias that leads back here resolves to nothing
            self._targets[target] = self.lookup(target)
        return self._targets[target]

    def follow(self, binding, parts):
        """``binding`` then its attributes ``parts``, through modules and classes."""
        binding = self.resolve(binding)
        for part in parts:
            if binding is None:
                return None
            if binding[0] == "module":
                sub = binding[1] + "." + part
                nxt = self.names(binding[1]).get(part)
                if nxt is None and sub in self.modules:
                    nxt = ("module", sub)
            elif binding[0] == "class":
                nxt = self.members(binding[1]).get(part)
            else:
                return None
            binding = self.resolve(nxt)
        return binding

    def lookup(self, dotted_name):
        """What the absolute ``dotted_name`` is: ("module", name), ("class", Class), ("def",), ("value",)."""
        if dotted_name in self.modules:
            return ("module", dotted_name)
        parts = dotted_name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in self.modules:
                return self.follow(("module", prefix), parts[cut:])
        return None

    # -- the list

    def api(self):
        out, homes = set(), {}
        for modname in sorted(self.modules):
            if not modname.startswith("torch"):
                continue
            out.add(modname)
            for name, binding in sorted(self.names(modname).items(), key=lambda kv: kv[0]):
                full = modname + "." + name
                if full in self.modules:
                    continue
                out.add(full)
                target = self.resolve(binding)
                if target is not None and target[0] == "class" and keep(full):
                    homes.setdefault(id(target[1]), (target[1], []))[1].append(full)
        for cls, paths in homes.values():
            self.add_members(out, min(paths, key=lambda p: (p.count("."), p)), cls, 0)
        return sorted(n for n in out if keep(n))

    def add_members(self, out, prefix, cls, depth):
        for name, binding in self.members(cls).items():
            if name.startswith("__") and name.endswith("__"):
                continue
            out.add(prefix + "." + name)
            if depth < 2 and binding is not None and binding[0] == "class":
                self.add_members(out, prefix + "." + name, binding[1], depth + 1)


def keep(name):
    """Public names under torch, module-level dunders, and what KEEP_PRIVATE names."""
    if any(name == k or name.startswith(k + ".") for k in KEEP_PRIVATE):
        return True
    parts = name.split(".")
    if parts[0] != "torch":
        return False
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("__") and part.endswith("__"):
            continue
        if part.startswith("_"):
            return False
    return True


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", metavar="wheel",
                        help="torch-1.11.0-*.whl files (the list holds the names that all of them have)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="where to write the list (default: %(default)s)")
    args = parser.parse_args(argv)
    names = None
    for wheel in args.wheels:
        these = set(Torch(wheel).api())
        names = these if names is None else names & these
    with open(args.out, "w") as f:
        f.write("# The names of torch 1.11.0 (tests/compat/make_torch111_api.py) that all of these wheels have:\n")
        for wheel in sorted(args.wheels, key=os.path.basename):
            f.write("#   {} (sha256 {})\n".format(os.path.basename(wheel), sha256(wheel)))
        for name in sorted(names):
            f.write(name + "\n")
    print("{}: {} names".format(args.out, len(names)))


if __name__ == "__main__":
    sys.exit(main())
