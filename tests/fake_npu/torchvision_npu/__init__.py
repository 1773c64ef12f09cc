"""FAKE torchvision_npu (Ascend's torchvision adapter), test-only.

The real package patches ``torchvision.io.decode_jpeg`` so that ``device="npu:N"`` decodes with the DVPP
hardware. The fake does the same patch; an NPU request is decoded on the CPU (fake NPUs hold no tensors)
and recorded in ``calls`` as ("decode_jpeg", device).
"""
import torchvision.io
import torchvision.io.image

FAKE = True
calls = []

_decode_jpeg_ori = torchvision.io.image.decode_jpeg


def _decode_jpeg(input, mode=torchvision.io.ImageReadMode.UNCHANGED, device="cpu", **kwargs):
    if "npu" in str(device):
        calls.append(("decode_jpeg", str(device)))
        return _decode_jpeg_ori(input, mode=mode, **kwargs)
    return _decode_jpeg_ori(input, mode=mode, device=device, **kwargs)


torchvision.io.image.decode_jpeg = _decode_jpeg
torchvision.io.decode_jpeg = _decode_jpeg
