"""FAKE torchvision_npu (Ascend's torchvision adapter), test-only.

The real package patches ``torchvision.io.decode_jpeg`` so that ``device="npu:N"`` decodes with the DVPP
hardware. The fake does the same patch; an NPU request is decoded on the CPU, its images moved to the device
(the fake torch_npu's device double; they stay on the CPU where the double is off), and recorded in ``calls`` as
("decode_jpeg", device) (and in ``$FAKE_NPU_CALL_LOG`` as ("decode_jpeg", device, images), package
"torchvision_npu").
"""
import torchvision.io
import torchvision.io.image

FAKE = True
calls = []

_decode_jpeg_ori = torchvision.io.image.decode_jpeg


def _to_device(images, device):
    import torch_npu
    if torch_npu._double.unavailable is not None:
        return images
    if isinstance(images, (list, tuple)):
        return [image.to(device) for image in images]
    return images.to(device)


def _decode_jpeg(input, mode=torchvision.io.ImageReadMode.UNCHANGED, device="cpu", **kwargs):
    if "npu" in str(device):
        calls.append(("decode_jpeg", str(device)))
        from torch_npu._recorder import record
        record([], "torchvision_npu", "decode_jpeg", str(device), len(input) if isinstance(input, (list, tuple))
               else 1)
        return _to_device(_decode_jpeg_ori(input, mode=mode, **kwargs), device)
    return _decode_jpeg_ori(input, mode=mode, device=device, **kwargs)


torchvision.io.image.decode_jpeg = _decode_jpeg
torchvision.io.decode_jpeg = _decode_jpeg
