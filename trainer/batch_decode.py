"""The device data backend (``--data-backend gpu``): JPEG decode and augmentation of whole batches where
the model runs.

Workers only read each file's bytes and its header (size, format, colour mode), draw the sample's crop
and flip from its seed exactly as the CPU backend does (``data.TrainCrop.params``: the same draws, so the
same crop for the same seed), and hand over (bytes, box, flip). The training process decodes
the batch with the device's decoder (``Device.jpeg_decoder``: nvJPEG through torchvision.io.decode_jpeg on
CUDA, DVPP through torchvision_npu on NPU, libjpeg on the CPU) and crops, resizes (bilinear, antialiased:
torchvision's tensor ``resized_crop``) and flips each image on the device, uint8 until the normaliser.
Validation: ``Resize`` then ``CenterCrop`` on the device, torchvision's tensor semantics.

Files the device decoder cannot take (not a JPEG, e.g. a PNG named .JPEG; CMYK or other colour modes) are
decoded by the worker with the CPU backend's transform, same crop, and counted (``fallbacks``). A file whose
header cannot be read stops the run naming it, as on the CPU backend; one whose data the device decoder
rejects is decoded on the CPU, which names it if it is corrupt.
"""
import torch
import torch.nn.functional as F

DEVICE_MODES = ("RGB", "L")  # JPEG colour modes the device decoders convert to RGB themselves


class EncodedDataset(torch.utils.data.Dataset):
    """(path, class) samples -> (file bytes, box, flip, fallback image, class, path) for a device decoder.

    ``box`` is (top, left, height, width) of the region to resize to ``size`` (train: the sample's
    RandomResizedCrop; val: the whole image, resized then centre-cropped on the device). A sample the
    device cannot decode comes back decoded here (``fallback``, uint8 CHW) with empty bytes.
    """

    def __init__(self, samples, train, cpu_transform, size):
        self.samples, self.train, self.cpu_transform, self.size = samples, train, cpu_transform, size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, item):
        from trainer import data
        index, seed = item if isinstance(item, tuple) else (item, None)
        path, target = self.samples[index]
        raw = data.read_bytes(path)
        img = data.open_image(raw, path)
        if img.format != "JPEG" or img.mode not in DEVICE_MODES:
            return _EMPTY, _NO_BOX, False, data.transformed(img, self.cpu_transform, seed, path), target, path
        if self.train:
            top, left, h, w, flip = self.cpu_transform.params(img.size[0], img.size[1], data.sample_rng(seed))
        else:
            (left, top), (w, h), flip = (0, 0), img.size, False
        box = torch.tensor([top, left, h, w], dtype=torch.int64)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8), box, flip, _NO_IMAGE, target, path


_EMPTY = torch.zeros(0, dtype=torch.uint8)
_NO_BOX = torch.zeros(4, dtype=torch.int64)
_NO_IMAGE = torch.zeros(0, dtype=torch.uint8)


def collate(batch):
    """Lists for the variable-size parts, tensors for the rest; a trailing ``valid`` (padded validation) kept."""
    cols = list(zip(*batch))
    out = [list(cols[0]), torch.stack(cols[1]), torch.tensor(cols[2], dtype=torch.bool), list(cols[3]),
           torch.tensor(cols[4]), list(cols[5])]
    if len(cols) > 6:
        out.append(torch.tensor(cols[6], dtype=torch.bool))
    return out


class PaddedEncoded(torch.utils.data.Dataset):
    """Validation padded to ``length`` items (fixed shapes): padding items carry a black fallback image."""

    def __init__(self, dataset, length, size):
        self.dataset, self.length, self.size = dataset, length, size

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        if index < len(self.dataset):
            return tuple(self.dataset[index]) + (True,)
        return _EMPTY, _NO_BOX, False, torch.zeros((3, self.size, self.size), dtype=torch.uint8), 0, "", False


class DeviceDecodeLoader:
    """Wraps a DataLoader of ``EncodedDataset`` batches: yields (uint8 NCHW on the device, targets[, valid])."""

    def __init__(self, loader, device, decode, size, train, resize=None):
        self.loader, self.device, self.decode = loader, device, decode
        self.size, self.train, self.resize = size, train, resize
        self.sampler = loader.sampler
        self.fallbacks = 0  # samples the workers decoded on the CPU

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            raw, boxes, flips, fallback, target, paths = batch[:6]
            images = self.decode_batch(raw, boxes, flips, fallback, paths)
            yield (images, target) if len(batch) == 6 else (images, target, batch[6])

    def decode_batch(self, raw, boxes, flips, fallback, paths):
        n, s = len(raw), self.size
        out = torch.empty((n, 3, s, s), dtype=torch.uint8, device=self.device.torch_device)
        todo = [k for k in range(n) if raw[k].numel() > 0]
        for k in range(n):
            if raw[k].numel() == 0:
                out[k] = self.device.move(fallback[k])
                if paths[k]:
                    self.fallbacks += 1
        decoded = self._decode([raw[k] for k in todo], [paths[k] for k in todo])
        for k, img in zip(todo, decoded):
            if img.device != out.device:  # decoded on the CPU after the device decoder refused it
                img = self.device.move(img)
            out[k] = self._augment(img, boxes[k].tolist(), bool(flips[k]))
        return out

    def _decode(self, raws, paths):
        if not raws:
            return []
        try:
            return self.decode(raws)
        except RuntimeError:  # one of them is not decodable there: find it, decode it on the CPU
            out = []
            for raw, path in zip(raws, paths):
                try:
                    out.extend(self.decode([raw]))
                except RuntimeError:
                    from trainer import data
                    img = data.open_image(bytes(raw.numpy()), path)
                    out.append(data.pil_to_chw(data.rgb(img, path)))
                    self.fallbacks += 1
            return out

    def _augment(self, img, box, flip):
        s = self.size
        if img.shape[0] == 1:
            img = img.expand(3, -1, -1)
        if self.train:
            top, left, h, w = box
            x = img[:, top:top + h, left:left + w].unsqueeze(0).float()
            x = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False, antialias=True)
        else:
            hh, ww = img.shape[1], img.shape[2]
            short, long_ = (hh, ww) if hh <= ww else (ww, hh)
            new_long = int(self.resize * long_ / short)  # torchvision's Resize(int)
            size = (self.resize, new_long) if hh <= ww else (new_long, self.resize)
            x = F.interpolate(img.unsqueeze(0).float(), size=size, mode="bilinear", align_corners=False,
                              antialias=True)
            top = int(round((size[0] - s) / 2.0))
            left = int(round((size[1] - s) / 2.0))
            x = x[:, :, top:top + s, left:left + s]
        x = x.round_().clamp_(0, 255).to(torch.uint8)[0]
        return x.flip(-1) if flip else x

