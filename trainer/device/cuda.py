"""CUDA GPUs: nccl, pinned memory, torch's fused SGD, bfloat16 from compute capability 8.0, TF32 off for strict
float32, and nvJPEG decode on a stream of its own (--data-backend gpu)."""
import contextlib
import inspect
import os
import threading

import torch

from trainer.device import shims
from trainer.device.base import Device, Handoff


def cuda_native_bf16(index=None):
    """Whether the CUDA device computes bfloat16 natively (compute capability 8.0 or newer)."""
    try:
        return torch.cuda.get_device_capability(index)[0] >= 8
    except Exception:
        return False


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
    decode_ahead = True  # the next batch in a thread of its own: the host would otherwise wait for nvJPEG between steps

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

    bind_thread = _make_current

    def _model_name(self):
        return torch.cuda.get_device_name(self.index)

    def upload(self, tensor):
        """Not waiting for queued work: CUDA copies from pageable memory wait for the stream; pinned ones do not."""
        return tensor.pin_memory().to(self.torch_device, non_blocking=True)

    def synchronize(self):
        torch.cuda.synchronize(self.torch_device)

    def _auto_amp_dtype(self):
        """bfloat16 on a device with native bfloat16 (compute capability 8.0+), float16 on older ones."""
        return (torch.bfloat16 if cuda_native_bf16(self.index) else torch.float16), None

    def _bfloat16_note(self):
        if not cuda_native_bf16(self.index):
            return "--amp-dtype bfloat16: this GPU has no native bfloat16 (emulated, slow)"

    def _reduced_float32_switches(self, hf32=False):
        return [(torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")]

    @contextlib.contextmanager
    def data_work(self):
        """The data work on a stream of its own, overlapping the step; ``handoff.receive()`` in the training thread
        makes its stream wait for that work and keep the results' memory. The stream is drained first, so memory freed
        by the previous batch's work is idle when the decoder (which writes from its own stream) is handed it."""
        if getattr(self._data_thread, "active", False):  # nested: on the outer call's stream
            yield Handoff()
            return
        side = self._data_stream = self._data_stream or torch.cuda.Stream(self.torch_device)
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
        """``torchvision.io.decode_jpeg(..., device=...)`` (nvJPEG)."""
        if "device" not in inspect.signature(tio.decode_jpeg).parameters:
            return None
        batched = shims._torchvision_version() >= (0, 19)  # a list is decoded in one batched nvJPEG call
        dev = self.torch_device

        def decode(raws):
            # torchvision's CUDA decoder allocates on the current stream but writes from a private one that does not
            # wait for it, so it can overwrite memory that queued kernels still read (a step's activations turn to
            # NaN). Hence ``data_work``: a stream of its own, drained before each batch, that training waits for.
            with self.data_work() as handoff:
                out = tio.decode_jpeg(raws, mode=rgb, device=dev) if batched else \
                    [tio.decode_jpeg(r, mode=rgb, device=dev) for r in raws]
                out = [handoff(t) for t in out]
            handoff.receive()  # this thread trains with the results
            return out
        return decode

    def deterministic(self):
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
        return Device.deterministic(self) + ", cudnn.deterministic, cudnn.benchmark off, CUBLAS_WORKSPACE_CONFIG"

    def rng_state(self):
        return torch.cuda.get_rng_state(self.torch_device)

    def set_rng_state(self, state):
        if state is not None:
            torch.cuda.set_rng_state(state.cpu(), self.torch_device)

    def profiler_activities(self):
        prof, activities = Device.profiler_activities(self)
        return prof, activities + [prof.ProfilerActivity.CUDA]
