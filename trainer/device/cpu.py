"""The CPU: one device, tensors in host memory, gloo for several processes, bfloat16 autocast only where the CPU
computes bfloat16 natively."""
import torch

from trainer.device import host, shims
from trainer.device.base import Device


def slow_bf16():
    """Why bfloat16 autocast runs many times slower than float32 here, None where it need not: a CPU without native
    bfloat16, or a torch whose CPU kernels do not use it (torch 1.11: ResNet18's step in bfloat16 autocast took about
    115x float32's on an AVX-512 BF16 CPU; torch 2.1 is the oldest measured fast, docs/PRECISION.md)."""
    if not host.cpu_native_bf16():
        return "this CPU has no native bfloat16 (no avx512_bf16 or AMX)"
    if shims.major_minor(torch.__version__) < (2, 1):
        return "torch {}'s CPU kernels have no native bfloat16 (torch >= 2.1 has)".format(torch.__version__)


class CpuDevice(Device):
    kind = "cpu"
    auto_rank = 2  # always there: the last resort of --device auto
    numbered = False
    tensors_on_host = True
    dist_backend = "gloo"
    supports_sync_bn = supports_apex = False
    prefers_channels_last = True  # oneDNN's convolutions run NHWC (bench/channels_last.py, docs/BENCHMARKS.md)
    # its flags do not tell whether bfloat16 autocast beats float32 (0.64x and 1.87x on two 2-core AVX-512 BF16
    # CPUs): where it has native bfloat16, auto times the run's model in both (docs/PRECISION.md)
    measures_amp_dtype = True
    non_blocking = False
    binds_host_cores = False  # a CPU run binds nothing unless asked (--cpu-binding on)
    computes_on_host_cores = True  # a node's ranks split its cores' compute threads (torch.set_num_threads)
    crops_per_image = True  # torch's uint8 resize per image: a batched roi_align pays on accelerators (launches) only
    # no decode-ahead thread: it would split the same cores with the step (ShuffleNetV2 x0.5, 2 cores: 0.83x the
    # images/s; docs/BENCHMARKS.md)

    @classmethod
    def count(cls):
        return 1

    @classmethod
    def settings_problem(cls, section):
        if section.pin_memory == "on":
            return "--pin-memory on: pinned memory serves copies to an accelerator; drop it on CPU"
        return super().settings_problem(section)

    @classmethod
    def default_workers(cls, procs_per_node, cpus=None):
        """Workers take cores from the model's own computation: pytorch/examples' 4, at most the process's share."""
        share = (cpus or host.usable_cpus()) // max(1, procs_per_node)
        return max(1, min(4, share))

    def _auto_amp_dtype(self):
        why = slow_bf16()
        if why is None:
            return torch.bfloat16, None
        return None, ("--amp: {}, where bfloat16 autocast is many times slower than float32: training in float32 "
                      "(--amp-dtype bfloat16 forces it)".format(why))

    def _bfloat16_note(self):
        why = slow_bf16()
        if why is not None:
            return "--amp-dtype bfloat16: {}: expect float32 to be several times faster".format(why)

    def float16_missing(self):
        if not shims._has_amp_grad_scaler():
            return "on CPU needs torch >= 2.3 (CPU GradScaler); this is torch {}".format(torch.__version__)

    def compile_warning(self, dtype):
        """Where graph mode measured slower than eager (docs/BENCHMARKS.md "Graph mode")."""
        if dtype == torch.bfloat16:
            return ("--compile with bfloat16 autocast on a CPU trained slower than eager where measured (0.84-0.86x "
                    "the eager images/s on a 2-core AVX-512 BF16 CPU, docs/RUNNING.md \"Graph mode\"); float32 gains "
                    "(1.1-1.3x)")
        flags = host._cpuinfo_flags()
        if flags and "avx512f" not in flags and dtype is None:
            return ("--compile on a CPU without AVX-512 trained no faster than eager where measured (0.92-1.03x the "
                    "eager images/s, ShuffleNetV2 and ResNet18 float32 on a 2-core AVX2 CPU; docs/RUNNING.md "
                    "\"Graph mode\")")

    def _make_jpeg_decoder(self, tio, rgb):
        def decode(raws):  # torchvision's libjpeg decode
            with shims._quiet_stderr():  # libjpeg prints "Corrupt JPEG data" itself; the trainer names the file
                return [tio.decode_jpeg(r, mode=rgb) for r in raws]
        return decode
