"""CUDA GPUs: nccl, pinned memory, torch's fused SGD, bfloat16 from compute capability 8.0, TF32 off for strict
float32, and nvJPEG decode on a stream of its own (--data-backend gpu)."""
import contextlib
import inspect
import os
import threading

import torch

from trainer.device import shims
from trainer.device.base import Device


def cuda_native_bf16(index=None):
    """Whether the CUDA device computes bfloat16 natively (compute capability 8.0 or newer)."""
    try:
        major, _ = torch.cuda.get_device_capability(index)
    except Exception:
        return False
    return major >= 8


class StreamHandoff:
    """Results of ``Device.data_work`` on the data stream, on their way to the training stream."""

    def __init__(self, stream):
        self._stream, self._tensors, self._event = stream, [], None

    def __call__(self, tensor):
        self._tensors.append(tensor)
        return tensor

    def seal(self):
        """The work queued on the data stream so far is what ``receive`` waits for."""
        self._event = torch.cuda.Event()
        self._event.record(self._stream)

    def receive(self):
        """The calling thread's current stream waits for the work and owns the results' memory from here."""
        if self._event is None:
            return
        cur = torch.cuda.current_stream(self._stream.device)
        cur.wait_event(self._event)
        for t in self._tensors:
            t.record_stream(cur)
        self._tensors, self._event = [], None


class CudaDevice(Device):
    kind = "cuda"
    auto_rank = 1
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    dist_backend = collective_library = "nccl"
    pin_memory = True
    prefers_torch_fused_sgd = True
    # the device backend prepares the next batch in a thread of its own: the host would otherwise wait for
    # nvJPEG between steps
    decode_ahead = True

    def __init__(self, kind=None, index=None):
        Device.__init__(self, kind, index)
        self._data_stream = None  # the data backend's CUDA stream (data_work)
        self._data_thread = threading.local()  # .active: inside data_work on this thread

    @classmethod
    def count(cls):
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    @classmethod
    def missing(cls):
        return ("--device cuda: torch {} sees no CUDA device (CPU-only build, or no driver); pick --device cpu"
                .format(torch.__version__))

    def _make_current(self):
        torch.cuda.set_device(self.index)

    def _model_name(self):
        return torch.cuda.get_device_name(self.index)

    def upload(self, tensor):
        """Without waiting for the current stream: CUDA copies from pageable memory wait for the stream's queued
        work; from pinned memory they do not."""
        return tensor.pin_memory().to(self.torch_device, non_blocking=True)

    def synchronize(self):
        torch.cuda.synchronize(self.torch_device)

    def _auto_amp_dtype(self):
        """bfloat16 on a device with native bfloat16 (compute capability 8.0+), float16 on older ones."""
        return (torch.bfloat16 if cuda_native_bf16(self.index) else torch.float16), None

    def _bfloat16_note(self):
        if not cuda_native_bf16(self.index):
            return "--amp-dtype bfloat16: this GPU has no native bfloat16 (emulated, slow)"
        return None

    def _autocast_before_1_10(self, dtype):
        return torch.cuda.amp.autocast()

    def _reduced_float32_switches(self):
        return [(torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")]

    def bind_thread(self):
        torch.cuda.set_device(self.index)

    @contextlib.contextmanager
    def data_work(self):
        """The data backend's device work runs on a stream of its own, so that it overlaps the training step;
        ``handoff(t)`` registers each result. After the block, ``handoff.receive()``, called by the thread that
        trains with the results (this one or another), makes the training stream wait for that work and keeps the
        results' memory until the training stream is done with them. The stream is drained first, so memory freed
        by the previous batch's work is idle when the decoder (which writes from a stream of its own) is handed
        it. Nested calls share the outer one."""
        if getattr(self._data_thread, "active", False):
            with Device.data_work(self) as handoff:
                yield handoff
            return
        if self._data_stream is None:
            self._data_stream = torch.cuda.Stream(self.torch_device)
        side = self._data_stream
        handoff = StreamHandoff(side)
        side.synchronize()
        self._data_thread.active = True
        try:
            with torch.cuda.stream(side):
                yield handoff
        finally:
            self._data_thread.active = False
        handoff.seal()

    def _make_jpeg_decoder(self, tio, rgb):
        """``torchvision.io.decode_jpeg(..., device=...)`` (nvJPEG; one batched call where torchvision takes a
        list, 0.19+)."""
        if "device" not in inspect.signature(tio.decode_jpeg).parameters:
            return None
        batched = shims._torchvision_version() >= (0, 19)  # a list is decoded in one batched nvJPEG call
        dev = self.torch_device

        def decode(raws):
            # torchvision's CUDA decoder allocates its outputs on the current stream but writes them from a
            # private stream that does not wait for the current one, so it can be handed (and overwrite)
            # memory that kernels queued on the current stream still read: a training step's activations,
            # which then turn to NaN. So it runs only inside ``data_work``: a stream of its own, drained
            # before each batch, whose results the training stream waits for and marks as its own.
            with self.data_stream() as handoff:
                out = tio.decode_jpeg(raws, mode=rgb, device=dev) if batched else \
                    [tio.decode_jpeg(r, mode=rgb, device=dev) for r in raws]
                for t in out:
                    handoff(t)
            return out
        return decode

    def manual_seed(self, seed):
        torch.manual_seed(seed)  # seeds the CPU and every CUDA device

    def _deterministic_extra(self):
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
        return ["cudnn.deterministic", "cudnn.benchmark off", "CUBLAS_WORKSPACE_CONFIG"]

    def rng_state(self):
        return torch.cuda.get_rng_state(self.torch_device)

    def set_rng_state(self, state):
        if state is not None:
            torch.cuda.set_rng_state(state.cpu(), self.torch_device)

    def _profiler_extra(self, prof):
        return [prof.ProfilerActivity.CUDA]
