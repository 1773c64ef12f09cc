#!/usr/bin/env python3
"""Curves of one or several runs side by side, from their metrics.jsonl, for acceptance reports.

    python3 -m tools.plot_runs OUT_DIR [OUT_DIR ...] -o FILE.png [--title TEXT] [--force]

Four panels over epochs: loss (train solid, validation dashed), Acc@1 (validation solid, train dashed),
learning rate, training images/s. Each run is labelled by its folder name, arch, device, world size
and mixed precision (from its summary.json, else from its metrics records). Headless (matplotlib's Agg
backend). The PNG is written to a temporary name and renamed; an existing file is kept unless --force.
Exit codes: 0 written; 2 a usage error (one line on stderr): a folder without metrics.jsonl, no records,
matplotlib missing, an existing output without --force.
"""
if not __package__:  # python3 tools/plot_runs.py: this Python has the project installed, or one line names one
    import _installed  # noqa: F401
from trainer import interpreter
if __name__ == "__main__":
    interpreter.require()  # torch and the trainer's packages, or one line naming the Python that has them
import json
import math
import os
import sys

from trainer import errors, options
from trainer.errors import UsageError
from trainer.record.observe import METRICS, read_records


def load_run(folder):
    path = os.path.join(folder, METRICS)
    if not os.path.isdir(folder):
        raise UsageError("'{}' is not a folder: pass the --output-dir of a run".format(folder))
    if not os.path.isfile(path):
        raise UsageError("'{}' has no {}: pass the --output-dir of a training run (runs write it as each epoch "
                         "ends)".format(folder, METRICS))
    records = sorted(read_records(path), key=lambda r: r.get("epoch", 0))
    if not records:
        raise UsageError("'{}' holds no epoch records yet: plot it once an epoch has finished".format(path))
    return {"folder": folder, "records": records, "label": label(folder, records)}


def label(folder, records):
    info = {}
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            s = json.load(f)
        amp = s.get("amp") or {}
        info = {"arch": s.get("arch"), "device": s.get("device"), "world_size": s.get("world_size"),
                "amp": "{} {}".format(amp.get("impl"), amp.get("dtype")) if amp.get("enabled") else "fp32"}
    except (OSError, ValueError, AttributeError):
        pass
    last = records[-1]
    for key in ("arch", "device", "world_size", "amp"):
        if info.get(key) is None:
            info[key] = last.get(key)
    return "{}: {} on {} x{}, {}".format(os.path.basename(os.path.normpath(folder)), info["arch"], info["device"],
                                         info["world_size"], info["amp"])


def series(records, key):
    pts = [(r["epoch"] + 1, r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(runs, out, title=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("matplotlib is not installed: pip install matplotlib")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [(axes[0][0], "loss", [("train_loss", "-"), ("val_loss", "--")]),
              (axes[0][1], "Acc@1 (%)", [("val_acc1", "-"), ("train_acc1", "--")]),
              (axes[1][0], "learning rate (end of epoch)", [("lr", "-")]),
              (axes[1][1], "training images/s", [("images_per_second", "-")])]
    from matplotlib.ticker import MaxNLocator
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, run in enumerate(runs):
        color = colors[n % len(colors)]
        for ax, _, keys in panels:
            for key, style in keys:
                xs, ys = series(run["records"], key)
                if xs:
                    ax.plot(xs, ys, style, color=color, marker="o" if len(xs) < 30 else None, markersize=3,
                            label=run["label"] if style == "-" else None)
    for ax, name, keys in panels:
        ax.set_title(name + ("  (solid {}, dashed {})".format(keys[0][0].split("_")[0], keys[1][0].split("_")[0])
                             if len(keys) > 1 else ""), fontsize=9)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[1][0].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    handles, labels = axes[0][1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * len(runs), 1, 0.97 if title else 1))
    save_figure(fig, out)


def save_figure(fig, out):
    """Write ``fig`` to the PNG ``out`` atomically (a temporary file beside it, then a rename) and close it."""
    import matplotlib.pyplot as plt
    tmp = os.path.join(os.path.dirname(os.path.abspath(out)), ".{}.tmp-{}.png".format(os.path.basename(out),
                                                                                       os.getpid()))
    try:
        fig.savefig(tmp, dpi=80)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def plot_gap(steps, ya, yb, gaps, rtol, out, names):
    """Two runs' per-step losses (``names``: A's and B's) and their relative gap against ``rtol``, as a PNG
    (tools.align losses --plot)."""
    a, b = names
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(steps, ya, "-", label="A: " + a)
    top.plot(steps, yb, "--", label="B: " + b)
    top.set_ylabel("training loss")
    top.legend(fontsize=7)
    top.grid(alpha=0.3)
    bottom.plot(steps, [g if math.isfinite(g) else float("nan") for g in gaps], "-", color="C3")
    bottom.axhline(rtol, color="grey", linestyle=":", label="--rtol")
    bottom.set_ylabel("|A - B| / |A|")
    bottom.set_xlabel("global step")
    bottom.legend(fontsize=7)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out)


def main(argv=None):
    p = options.UsageParser(prog="plot_runs.py", description="Curves of runs side by side from their metrics.jsonl.")
    p.add_argument("runs", nargs="+", metavar="OUT_DIR", help="--output-dir of each run")
    p.add_argument("-o", "--output", required=True, metavar="FILE.png")
    p.add_argument("--title", default=None)
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    a = p.parse_args(argv)
    if not a.output.lower().endswith(".png"):
        raise UsageError("-o '{}': the output is a PNG file; name it *.png".format(a.output))
    if os.path.exists(a.output) and not a.force:
        raise UsageError("'{}' exists: pass --force to overwrite it, or choose another -o".format(a.output))
    if not os.path.isdir(os.path.dirname(os.path.abspath(a.output))):
        raise UsageError("-o '{}': its folder does not exist".format(a.output))
    runs = [load_run(folder) for folder in a.runs]
    plot(runs, a.output, a.title)
    print("wrote {} ({} run(s))".format(a.output, len(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(errors.run(main))
