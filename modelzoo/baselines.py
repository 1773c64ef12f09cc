"""Baseline tables and the published results of recipes, for tools/acceptance.py (modelzoo/acceptance.py): reading
a table ('published', 'published-2023', a JSON / CSV file), finding a run's entry in it, the tolerances, and
``--baseline recipe[:NAME]``: the result trainer/recipes.json records for a recipe (its ``expect``)."""
import csv
import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join(ROOT, "baselines", "published.json")
# the tables --baseline names: today's published figures, and those of 2023
TABLES = {"published": PUBLISHED, "published-2023": os.path.join(ROOT, "baselines", "published_2023.json")}
RECIPE = "recipe"  # --baseline recipe[:NAME]: the published result of the run's --recipe (trainer/recipes.json)

DEFAULT_ACC_TOLERANCE = 1.0  # points of top-1 accuracy below the baseline
DEFAULT_FPS_RATIO = 0.9  # fraction of the baseline FPS

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_FAIL = 0, 1, 2, 3


class AcceptanceError(Exception):
    """Bad input (a file, a table, an argument): one line, exit 2."""

    exit_code = EXIT_USAGE


class RunFailed(AcceptanceError):
    """summary.json says the run did not finish."""

    exit_code = EXIT_RUN_FAILED


# ---------------------------------------------------------------- baselines


def normalize_arch(arch):
    """The NPU-affine variants share the published numbers of the model they re-implement."""
    arch = str(arch).strip()
    return arch[:-len("_npu")] if arch.endswith("_npu") else arch


def _optional_float(value, where, field):
    if value is None or (isinstance(value, str) and value.strip() in ("", "-", "null", "None")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AcceptanceError("{}: {} '{}' is not a number".format(where, field, value))
    if not number > 0 or math.isinf(number):
        raise AcceptanceError("{}: {} must be a positive number, got {}".format(where, field, value))
    return number


def _entry(raw, where):
    if not isinstance(raw, dict) or "arch" not in raw or "rank_size" not in raw:
        raise AcceptanceError("{}: each baseline needs 'arch' and 'rank_size'".format(where))
    try:
        rank_size = int(str(raw["rank_size"]).strip())
    except ValueError:
        raise AcceptanceError("{}: rank_size '{}' is not a whole number".format(where, raw["rank_size"]))
    return {"arch": normalize_arch(raw["arch"]), "rank_size": rank_size,
            "acc1": _optional_float(raw.get("acc1"), where, "acc1"),
            "fps": _optional_float(raw.get("fps"), where, "fps"),
            "source": (raw.get("source") or "").strip(), "precision": str(raw.get("precision") or "").lower()}


def resolve_baseline_path(spec):
    return TABLES.get(spec, spec)


def load_baselines(spec):
    """(entries, tolerances, path) from 'published' or a JSON / CSV file."""
    path = resolve_baseline_path(spec)
    if not os.path.isfile(path):
        raise AcceptanceError("baseline file '{}' does not exist (give a JSON or CSV file, 'published' or "
                              "'published-2023')".format(path))
    tolerances = {}
    try:
        if path.lower().endswith(".csv"):
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            if rows and not {"arch", "rank_size"} <= set(k.strip() for k in rows[0] if k):
                raise AcceptanceError("{}: the CSV header must name arch,rank_size,acc1,fps".format(path))
            raw = [{(k or "").strip(): v for k, v in row.items()} for row in rows]
        else:
            with open(path) as f:
                data = json.load(f)
            if isinstance(data, list):
                raw = data
            elif isinstance(data, dict) and isinstance(data.get("baselines"), list):
                raw = data["baselines"]
                tolerances = data.get("tolerances") or {}
            else:
                raise AcceptanceError("{}: expected a list of baselines or {{\"baselines\": [...]}}".format(path))
    except (OSError, ValueError, csv.Error) as exc:
        raise AcceptanceError("cannot read baseline file '{}': {}".format(path, str(exc).splitlines()[0]))
    entries = [_entry(r, "{} entry {}".format(path, i + 1)) for i, r in enumerate(raw)]
    tol = {}
    if "acc1_points_below" in tolerances:
        tol["acc_tolerance"] = check_acc_tolerance(tolerances["acc1_points_below"], path)
    if "fps_fraction" in tolerances:
        tol["fps_ratio"] = check_fps_ratio(tolerances["fps_fraction"], path)
    return entries, tol, path


def check_acc_tolerance(value, where="--acc-tolerance"):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AcceptanceError("{}: accuracy tolerance '{}' is not a number".format(where, value))
    if not 0 <= number < 100:
        raise AcceptanceError("{}: accuracy tolerance must be 0-100 points, got {}".format(where, value))
    return number


def check_fps_ratio(value, where="--fps-ratio"):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AcceptanceError("{}: FPS ratio '{}' is not a number".format(where, value))
    if not 0 < number <= 10:
        raise AcceptanceError("{}: FPS ratio must be above 0 (0.9 = 90% of the baseline), got {}".format(
            where, value))
    return number


def find_baseline(entries, arch, rank_size, path="baseline table", precision=None):
    """The entry for arch x rank size; where a table has several (ShuffleNetV2: O2 and FP32 entries), the one of
    the run's ``precision``, else the first."""
    arch = normalize_arch(arch)
    found = [e for e in entries if e["arch"] == arch and e["rank_size"] == int(rank_size)]
    if found:
        same = [e for e in found if precision and e["precision"] == str(precision).lower()]
        return (same or found)[0]
    have = ", ".join("{} {}p".format(e["arch"], e["rank_size"]) for e in entries) or "nothing"
    raise AcceptanceError("no baseline for {} at {}p in '{}' (it has: {})".format(arch, rank_size, path, have))


def is_recipe_spec(spec):
    return spec == RECIPE or str(spec).startswith(RECIPE + ":")


def recipe_baseline(spec, summary, arch, rank_size):
    """(entry, tolerances, where) for ``--baseline recipe`` (the recipe the run's summary names) or
    ``recipe:NAME``: the published result trainer/recipes.json records for it (``expect``), judged with the
    tolerances of ModelZoo's published table. ``summary`` None: before a run (the recipe's own network only)."""
    from trainer import recipes
    from trainer.errors import UsageError
    name = spec.split(":", 1)[1] if ":" in spec else (summary or {}).get("recipe")
    if not name:
        raise AcceptanceError("--baseline recipe: the run was not trained with --recipe (its summary names none); "
                              "give --baseline recipe:NAME or a table")
    arch = normalize_arch((summary or {}).get("arch") or arch)
    try:
        epochs = recipes.get(name).get("epochs") if summary is None else summary.get("epochs")
        which, expect = recipes.expectation(name, arch, epochs)
    except UsageError as exc:
        raise AcceptanceError(str(exc))
    source = "recipe {}: {} ({}, {})".format(which, expect.get("source", ""), expect.get("hardware", "?"),
                                            expect.get("date", "?"))
    entry = _entry({"arch": arch, "rank_size": rank_size, "acc1": expect.get("acc1"), "source": source},
                   "recipe " + which)
    return entry, load_baselines("published")[1], "trainer/recipes.json " + which
