"""Step profiling for ``main.py --profile-steps START:END [--profile-stop]``: records global steps
START..END-1 with the device's profiler and writes a Chrome trace and an op table per rank.
What is written for torch.profiler and for torch_npu.profiler: docs/DESIGN.md.
"""
import contextlib
import csv
import glob
import json
import os

TABLE_ROWS = 60
# what a rank writes into --output-dir: its Chrome trace (torch.profiler), or the folder of torch_npu's results,
# and its op table
FILES = ("profile_rank{}.json", "profile_rank{}", "profile_ops_rank{}.txt")


def files_of(rank):
    """The names of what rank ``rank`` may write into --output-dir."""
    return [name.format(rank) for name in FILES]


class StepProfiler:
    def __init__(self, steps, stop, device, output_dir, rank, log):
        self.start_step, self.end_step = int(steps[0]), int(steps[1])
        if self.start_step < 0 or self.end_step <= self.start_step:
            raise ValueError("profile steps must be START:END with 0 <= START < END, got {}".format(steps))
        self.stop, self.device, self.output_dir, self.rank, self.log = bool(stop), device, output_dir, int(rank), log
        self.trace_path, self.trace_dir, self.table_path = (os.path.join(output_dir, n) for n in files_of(self.rank))
        self.stop_run = self.done = False
        self.files, self._prof = [], None
        self._module, self._activities = device.profiler_activities()
        self._has_table = hasattr(self._module.profile, "key_averages")
        if self.start_step == 0:
            self._begin(0)

    @property
    def recording(self):
        return self._prof is not None

    def step(self, global_step):
        """``global_step`` (0-based) has just completed."""
        if self.done:
            return
        if global_step < self.end_step - 1:
            if self._prof is None and global_step >= self.start_step - 1:
                self._begin(global_step + 1)
            return
        if self._prof is None:  # the run started (resumed) past the range: nothing left to record
            self.done = True
            self.log("warning: --profile-steps {}:{}: the run is already at global step {}; nothing recorded"
                     .format(self.start_step, self.end_step, global_step + 1))
        else:
            self._finish()
        self.stop_run = self.stop

    def close(self):
        """End of the run: write what was recorded if the range was not reached."""
        if self._prof is not None and not self.done:
            self.log("note: the run ended before global step {}: writing the steps recorded so far"
                     .format(self.end_step))
            self._finish()

    def _begin(self, first):
        kwargs = {"activities": self._activities, "record_shapes": True}
        if not self._has_table:
            os.makedirs(self.trace_dir, exist_ok=True)
            kwargs["on_trace_ready"] = self._module.tensorboard_trace_handler(
                self.trace_dir, worker_name="rank{}".format(self.rank))
            # profiler level 1 where the profiler has levels: its results then hold op_statistic.csv
            make = getattr(self._module, "_ExperimentalConfig", None)
            level = getattr(getattr(self._module, "ProfilerLevel", None), "Level1", None)
            if make is not None and level is not None:
                with contextlib.suppress(Exception):
                    kwargs["experimental_config"] = make(profiler_level=level)
        self.device.synchronize()
        self._prof = self._module.profile(**kwargs)
        self._prof.start()
        self.log("=> profiler: recording global steps {}..{} on {} (rank {})".format(
            first, self.end_step - 1, self.device.name, self.rank))

    def _finish(self):
        prof, self._prof = self._prof, None
        self.done = True
        self.device.synchronize()
        try:
            prof.stop()
            os.makedirs(self.output_dir, exist_ok=True)
            if self._has_table:
                prof.export_chrome_trace(self.trace_path)
                table = self._key_average_table(prof)
                self.files = [self.trace_path, self.table_path]
            else:
                table = table_from_exported(self.trace_dir)
                self.files = [self.trace_dir, self.table_path]
            with open(self.table_path, "w") as f:
                f.write(table if table.endswith("\n") else table + "\n")
        except Exception as exc:  # a failed export must not end the training run
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.log("warning: profiler results not written ({}: {})".format(type(exc).__name__, first[:200]))
            return
        self.log("=> profiler: trace and op table written: {}".format(
            ", ".join(os.path.abspath(p) for p in self.files)))

    def _key_average_table(self, prof):
        averages = prof.key_averages()
        sort_by = "self_cpu_time_total"
        if len(self._activities) > 1 and len(averages):
            # Device time where the profiler recorded a device: the attribute is
            # self_device_time_total on newer torch, self_<kind>_time_total on older ones.
            keys = ("self_device_time_total", "self_{}_time_total".format(self.device.kind))
            sort_by = next((key for key in keys if hasattr(averages[0], key)), sort_by)
        header = "# global steps {}..{} on {}, rank {}; sorted by {}\n".format(
            self.start_step, self.end_step - 1, self.device.name, self.rank, sort_by)
        return header + averages.table(sort_by=sort_by, row_limit=TABLE_ROWS)


# ---------------------------------------------------------------- tables from exported files


def _number(text, default=0.0):
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def table_from_trace(path):
    """Op table from a Chrome trace (``{"traceEvents": [...]}`` or a bare list): complete events grouped by name,
    by total duration."""
    with open(path) as f:
        data = json.load(f)
    data = data.get("traceEvents", []) if isinstance(data, dict) else data
    stats = {}
    for e in data if isinstance(data, list) else []:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        dur = _number(e.get("dur"), None)  # a number, or a numeric string in some exporters
        if dur is None:
            continue
        key = (str(e.get("name", "?")), str(e.get("cat", "")))
        count, total = stats.get(key, (0, 0.0))
        stats[key] = (count + 1, total + dur)
    ordered = sorted(stats.items(), key=lambda kv: -kv[1][1])[:TABLE_ROWS]
    width = max([len(n) for (n, _), _ in ordered] + [4])
    lines = ["# from {}: complete events by total duration".format(path),
             "{:<{w}}  {:<16}  {:>8}  {:>14}  {:>12}".format("Name", "Category", "Calls", "Total (us)",
                                                                 "Avg (us)", w=width)]
    lines += ["{:<{w}}  {:<16}  {:>8}  {:>14.1f}  {:>12.1f}".format(name, cat[:16], count, total, total / count,
                                                                    w=width)
              for (name, cat), (count, total) in ordered]
    return "\n".join(lines) + "\n"


SORT_COLUMNS = ("Total Time(us)", "Device Self Duration(us)", "Device Total Duration(us)", "Duration(us)")


def table_from_csv(path):
    """A CSV op statistic (e.g. ``op_statistic.csv``) as an aligned table, longest first."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    if not table:
        return "# {} is empty\n".format(path)
    header, body = table[0], table[1:]
    for col in SORT_COLUMNS:  # longest first where the file has a duration column
        if col in header:
            i = header.index(col)
            body.sort(key=lambda r: -_number(r[i]) if i < len(r) else 0.0)
            break
    table = [header] + body[:TABLE_ROWS]
    widths = [max(len(r[i]) if i < len(r) else 0 for r in table) for i in range(len(table[0]))]
    lines = ["# from {}".format(path)]
    lines += ["  ".join(c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(r)).rstrip() for r in table]
    return "\n".join(lines) + "\n"


def table_from_exported(folder):
    """Op table from a profiler's result folder: its op statistics, else its trace."""
    def found(name):
        return sorted(glob.glob(os.path.join(folder, "**", name), recursive=True))
    stats = found("op_statistic.csv") or found("operator_details.csv")
    traces = found("trace_view.json") or found("*.json")
    parts = ([table_from_csv(stats[-1])] if stats else []) + ([table_from_trace(traces[-1])] if traces else [])
    return "\n".join(parts) if parts else "# no op statistics or trace found under {}\n".format(folder)
