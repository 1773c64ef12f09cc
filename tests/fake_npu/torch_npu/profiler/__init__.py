"""FAKE torch_npu.profiler (test-only), a thin layer over torch.profiler on the CPU.

Real: torch_npu/profiler/{profiler,scheduler,experimental_config}.py of the release followed
(torch_npu/_release.py).

* ``profile(*, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
  profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
  experimental_config=None, execution_trace_observer=None, custom_trace_id_callback=None,
  use_cuda=None)`` (2.14.0 profiler.py:201-218); 2.1.0.post17 has neither
  ``execution_trace_observer`` nor ``custom_trace_id_callback`` (profiler.py:183-198). Methods
  start/stop/step/export_chrome_trace/add_metadata, no key_averages(). 2.1.0.post17's
  ``export_chrome_trace`` refuses a path that does not end in ".json" (profiler.py:77-79); like every
  method there it is wrapped in ``no_exception_func``, so the error is printed, not raised, and
  nothing is written.
* ``schedule`` is the class ``Schedule(wait, active, warmup=0, repeat=0, skip_first=0,
  skip_first_wait=0)`` (2.14.0 scheduler.py:34-49); 2.1.0.post17 has no ``skip_first_wait``
  (scheduler.py:24).
* ``tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False)``
  in both; ``ProfilerActivity.CPU`` / ``.NPU``.
* ``_ExperimentalConfig(profiler_level=ProfilerLevel.Level0, aic_metrics=..., ..., export_type=...)``:
  2.14.0 defaults to ``AiCMetrics.PipeUtilization`` and ``ExportType.Text`` (experimental_config.py:
  88-105), 2.1.0.post17 to ``AiCMetrics.AiCoreNone`` and None, which it turns into PipeUtilization
  above level 0 and into text with a warning (experimental_config.py:68-88, 131-134). Both set the
  metrics back to AiCoreNone, with a warning, at level 0.

The fake only exposes those methods, so code written against it also runs on the real one.
"""

import enum
import os
import socket
import time

import torch

import torch_npu
from torch_npu import _release

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction", "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics", "ExportType"]


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


_TO_TORCH_ACTION = {
    ProfilerAction.NONE: torch.profiler.ProfilerAction.NONE,
    ProfilerAction.WARMUP: torch.profiler.ProfilerAction.WARMUP,
    ProfilerAction.RECORD: torch.profiler.ProfilerAction.RECORD,
    ProfilerAction.RECORD_AND_SAVE: torch.profiler.ProfilerAction.RECORD_AND_SAVE,
}


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Db = "db"
    Text = "text"


def _print_msg(level, message):
    # torch_npu/profiler/analysis/prof_common_func/_constant.py print_warn_msg / print_error_msg
    print("{} [{}] [{}] profiler.py: {}".format(time.strftime("[%Y-%m-%d %H:%M:%S]"), level, os.getpid(), message),
          flush=True)


class _ExperimentalConfig:
    if _release.V2_1:
        def __init__(self, profiler_level=ProfilerLevel.Level0, aic_metrics=AiCMetrics.AiCoreNone, l2_cache=False,
                     msprof_tx=False, mstx=False, data_simplification=True, record_op_args=False, op_attr=False,
                     gc_detect_threshold=None, export_type=None, host_sys=None, mstx_domain_include=None,
                     mstx_domain_exclude=None, sys_io=False, sys_interconnection=False):
            if profiler_level not in (ProfilerLevel.Level0, ProfilerLevel.Level_none) and \
                    aic_metrics == AiCMetrics.AiCoreNone:
                aic_metrics = AiCMetrics.PipeUtilization
            self._setup(profiler_level, aic_metrics, export_type)
    else:
        def __init__(self, profiler_level=ProfilerLevel.Level0, aic_metrics=AiCMetrics.PipeUtilization,
                     l2_cache=False, msprof_tx=False, mstx=False, data_simplification=True, record_op_args=False,
                     op_attr=False, gc_detect_threshold=None, export_type=ExportType.Text, host_sys=None,
                     mstx_domain_include=None, mstx_domain_exclude=None, sys_io=False, sys_interconnection=False):
            self._setup(profiler_level, aic_metrics, export_type)

    def _setup(self, profiler_level, aic_metrics, export_type):
        if not export_type:
            _print_msg("WARNING", "Invalid parameter export_type: {}, reset it to text.".format(export_type))
            export_type = [ExportType.Text]
        elif isinstance(export_type, str):
            export_type = [export_type]
        if profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none) and aic_metrics != AiCMetrics.AiCoreNone:
            _print_msg("WARNING", "Please use level1 or level2 if you want to collect aic metrics, "
                                  "reset aic metrics to None!")
            aic_metrics = AiCMetrics.AiCoreNone
        self.profiler_level = profiler_level
        self.aic_metrics = aic_metrics
        self.export_type = list(export_type)


def supported_activities():
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


class Schedule:
    if _release.V2_1:
        def __init__(self, wait, active, warmup=0, repeat=0, skip_first=0):
            self._setup(wait, active, warmup, repeat, skip_first, 0)
    else:
        def __init__(self, wait, active, warmup=0, repeat=0, skip_first=0, skip_first_wait=0):
            self._setup(wait, active, warmup, repeat, skip_first, skip_first_wait)

    def _setup(self, wait, active, warmup, repeat, skip_first, skip_first_wait):
        self.wait = wait
        self.active = active
        self.warmup = warmup
        self.repeat = repeat
        self.skip_first = skip_first
        self.skip_first_wait = skip_first_wait  # 0 on 2.1.0.post17, which has no such step

    def __call__(self, step):
        if step < 0:
            raise ValueError("Invalid parameter step, which must be not less than 0.")
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait != 0:
            step += self.wait
        period = self.wait + self.warmup + self.active
        if self.repeat > 0 and step / period >= self.repeat:
            return ProfilerAction.NONE
        m = step % period
        if m < self.wait:
            return ProfilerAction.NONE
        if m < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if m < period - 1 else ProfilerAction.RECORD_AND_SAVE


schedule = Schedule


def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False):
    """Writes <dir_name>/<worker_name>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json (fake layout)."""
    dir_name = dir_name or os.getcwd()
    worker = worker_name or "{}_{}".format(socket.gethostname(), os.getpid())
    torch_npu._record("tensorboard_trace_handler", dir_name, worker_name)

    def handler_fn(prof_inst):
        out = os.path.join(dir_name, worker + "_ascend_pt", "ASCEND_PROFILER_OUTPUT")
        os.makedirs(out, exist_ok=True)
        prof_inst.export_chrome_trace(os.path.join(out, "trace_view.json"))

    return handler_fn


class profile:
    if _release.V2_1:
        def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                     profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                     experimental_config=None, use_cuda=None):
            self._setup(activities, schedule, on_trace_ready, record_shapes, profile_memory, with_stack,
                        with_flops, with_modules)
    else:
        def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                     profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                     experimental_config=None, execution_trace_observer=None, custom_trace_id_callback=None,
                     use_cuda=None):
            self._setup(activities, schedule, on_trace_ready, record_shapes, profile_memory, with_stack,
                        with_flops, with_modules)

    def _setup(self, activities, schedule, on_trace_ready, record_shapes, profile_memory, with_stack, with_flops,
               with_modules):
        acts = set(activities) if activities else supported_activities()
        torch_npu._record("profile", sorted(a.name for a in acts))
        self.activities = acts
        self.on_trace_ready = on_trace_ready
        self.metadata = {}
        user_schedule = schedule

        def torch_schedule(step):
            return _TO_TORCH_ACTION[user_schedule(step)]

        def torch_handler(_inner):
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

        self._prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch_schedule if user_schedule is not None else None,
            on_trace_ready=torch_handler if on_trace_ready is not None else None,
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
            with_flops=with_flops, with_modules=with_modules)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()

    def start(self):
        self._prof.start()

    def stop(self):
        self._prof.stop()

    def step(self):
        self._prof.step()

    def export_chrome_trace(self, output_path):
        torch_npu._record("export_chrome_trace", output_path)
        if _release.V2_1 and not os.path.basename(output_path).endswith(".json"):
            _print_msg("ERROR", "Call export_chrome_trace failed. Exception: Invalid parameter output_path, "
                                "which must be a json file.")
            return
        self._prof.export_chrome_trace(output_path)

    def add_metadata(self, key, value):
        self.metadata[key] = value
