"""The Ascend stack runs Python 3.7-3.9 with torch 1.11: keep the sources 3.8-syntax-clean."""
import ast
import os

import pytest

from conftest import ROOT

SOURCES = []
for top in ("main.py", "trainer", "models", "tools", "bench"):
    path = os.path.join(ROOT, top)
    if os.path.isfile(path):
        SOURCES.append(path)
    for dirpath, _, files in os.walk(path):
        SOURCES.extend(os.path.join(dirpath, f) for f in files if f.endswith(".py"))


@pytest.mark.parametrize("path", sorted(SOURCES), ids=lambda p: os.path.relpath(p, ROOT))
def test_parses_as_python_38(path):
    with open(path) as f:
        ast.parse(f.read(), filename=path, feature_version=(3, 8))


def test_device_words_stay_in_the_device_layer():
    """Only the device layer (trainer/device.py, and trainer/device_names.py, its torch-free names) names
    device kinds: no other trainer module decides per kind."""
    offenders = []
    for path in SOURCES:
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith("trainer" + os.sep) or os.path.basename(rel) in ("device.py", "device_names.py"):
            continue
        with open(path) as f:
            for n, line in enumerate(f, 1):
                code = line.split("#", 1)[0]
                if any(w in code for w in ('"npu"', "'npu'", '"cuda"', "'cuda'", '"cpu"', "'cpu'")):
                    offenders.append("{}:{}: {}".format(rel, n, line.strip()))
    assert not offenders, "\n".join(offenders)
