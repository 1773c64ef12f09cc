"""The device data backend (``--data-backend gpu``): JPEG decode and augmentation of whole batches where the model runs.

Workers read each file and draw its crop and flip from its seed as the CPU backend does; the training process decodes
the batch with ``Device.jpeg_decoder`` (nvJPEG on CUDA, DVPP via torchvision_npu on NPU, libjpeg on the CPU) and crops
it in a few device calls, uint8 until the normaliser; with ``Device.decode_ahead`` (CUDA; the decode releases the GIL)
in a thread and stream of its own. Files the device cannot take (not a JPEG, e.g. a PNG named .JPEG; CMYK) are decoded
by the worker, same crop, and counted (``fallbacks``); data the device decoder rejects is decoded on the CPU.
"""
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from trainer.data.images import (Box, open_image, pil_to_chw, read_bytes, rgb, sample_rng, tensor_crop_resize,
                                 transformed)
from trainer.data.host import ImageDataset, PaddedEvalDataset, backend_loaders
from trainer.data.samplers import dataloader, item_parts
from trainer.data.transforms import center_region
from trainer.device import uint8_antialias_resize

DEVICE_MODES = ("RGB", "L")  # JPEG colour modes the device decoders convert to RGB themselves


class EncodedDataset(ImageDataset):
    """(path, class) samples -> (file bytes, box, flip, fallback, class, path); ``box``: the training crop, or the whole
    image. One the device cannot decode comes decoded by ``transform`` (``fallback``, uint8 CHW), with no bytes."""

    def __init__(self, samples, transform, train):
        super().__init__(samples, transform)
        self.train = train

    def __getitem__(self, item):
        index, seed, size = item_parts(item)
        path, target = self.samples[index]
        raw = read_bytes(path)
        img = open_image(raw, path)
        if img.format != "JPEG" or img.mode not in DEVICE_MODES:
            transform = self.transform.at(size) if size is not None else self.transform
            return _EMPTY, _NO_BOX, False, transformed(img, transform, seed, path), target, path
        if self.train:
            top, left, h, w, flip = self.transform.params(img.size[0], img.size[1], sample_rng(seed))
            box = Box.from_crop(top, left, h, w)
        else:
            box, flip = Box(0, 0, img.size[0], img.size[1]), False
        box = torch.tensor(box, dtype=torch.int64)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8), box, flip, _EMPTY, target, path


_EMPTY = torch.zeros(0, dtype=torch.uint8)  # no bytes, or no fallback image
_NO_BOX = torch.zeros(4, dtype=torch.int64)


def collate(batch):
    """The file bytes in one buffer with their lengths (one shared-memory block per batch), lists, tensors."""
    cols = list(zip(*batch))
    lengths = torch.tensor([r.numel() for r in cols[0]], dtype=torch.int64)
    out = [(torch.cat(cols[0]) if cols[0] else _EMPTY, lengths), torch.stack(cols[1]),
           torch.tensor(cols[2], dtype=torch.bool), list(cols[3]), torch.tensor(cols[4]), list(cols[5])]
    if len(cols) > 6:
        out.append(torch.tensor(cols[6], dtype=torch.bool))
    return out


class PaddedEncoded(PaddedEvalDataset):
    """Validation padded to ``length`` items (fixed shapes): padding items carry a black fallback image."""

    def padding(self):
        return _EMPTY, _NO_BOX, False, torch.zeros(self.image_shape, dtype=torch.uint8), 0, "", False


class DeviceDecodeLoader:
    """``EncodedDataset`` batches -> (uint8 NCHW on the device, targets[, valid]); ``decode_ahead``, ``batched_crops``
    (one roi_align call per batch, else image by image): None, the device's choice. A sampler's ``size`` is used."""

    def __init__(self, loader, device, decode, size, train, resize=None, decode_ahead=None, batched_crops=None):
        self.loader, self.device, self.decode = loader, device, decode
        self.size, self.train, self.resize = size, train, resize
        self.sampler, self.fallbacks = loader.sampler, 0  # fallbacks: samples decoded on the CPU
        per_image = device.crops_per_image if batched_crops is None else not batched_crops
        self._per_image_uint8 = per_image and uint8_antialias_resize()
        self._batched = False if self._per_image_uint8 else None  # whether roi_align runs here; None: not tried
        self.ahead = device.decode_ahead if decode_ahead is None else bool(decode_ahead)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        """Batches in order; with ``ahead`` a thread prepares batch k+1 during batch k (its errors raised here; an
        early close waits for it, so no data work outlives the iteration)."""
        batches = iter(self.loader)
        size = getattr(self.sampler, "size", None) or self.size
        if not self.ahead:
            for item, handoff in iter(lambda: self._prepare(batches, size), None):
                handoff.receive()
                yield item
            return
        with ThreadPoolExecutor(1, thread_name_prefix="decode-ahead", initializer=self.device.bind_thread) as ahead:
            job = ahead.submit(self._prepare, batches, size)
            while True:
                ready = job.result()
                if ready is None:
                    return
                job = ahead.submit(self._prepare, batches, size)
                item, handoff = ready
                handoff.receive()
                yield item

    def _prepare(self, batches, size=None):
        """The next batch decoded and cropped to ``size``, with its ``Handoff``; None at the end."""
        batch = next(batches, None)
        if batch is None:
            return None
        (buf, lengths), boxes, flips, fallback, target, paths = batch[:6]
        raw = list(torch.split(buf, lengths.tolist()))  # views, one per image
        with torch.no_grad(), self.device.data_work() as handoff:
            images = handoff(self._decode_batch(raw, boxes, flips, fallback, paths, size))
        return ((images, target) if len(batch) == 6 else (images, target, batch[6])), handoff

    def _decode_batch(self, raw, boxes, flips, fallback, paths, s=None):
        n, s, out = len(raw), s or self.size, None
        todo = [k for k in range(n) if raw[k].numel() > 0]
        ready = [k for k in range(n) if raw[k].numel() == 0]
        # the decode first: CUDA's decoder writes from a stream of its own that does not wait for this one, so it runs
        # while nothing queued here (``data_work`` drained it) could still read memory this batch freed
        decoded = self._decode([raw[k] for k in todo], [paths[k] for k in todo])
        decoded = [img if img.device == self.device.torch_device else self.device.move(img) for img in decoded]
        if ready:  # decoded (and augmented) by the workers: one transfer
            out = torch.empty((n, 3, s, s), dtype=torch.uint8, device=self.device.torch_device)
            self.fallbacks += sum(1 for k in ready if paths[k])
            done = self.device.move(torch.stack([fallback[k] for k in ready]))
            out[self.device.upload(torch.tensor(ready))] = done
        if not decoded:
            return out
        rois = [self._roi(img, boxes[k].tolist()) for k, img in zip(todo, decoded)]
        flip = [bool(flips[k]) for k in todo]
        if self._batched is not False:
            try:
                res = resized_crops(decoded, rois, s, flip, self.device.upload)
                self._batched = True
            except (RuntimeError, NotImplementedError):  # no roi_align for this device: image by image
                if self._batched:
                    raise
                self._batched = False
        if self._batched is False:
            res = torch.stack([self._augment(img, box, f, s) for img, box, f in zip(decoded, rois, flip)])
        if out is None:
            return res
        out[self.device.upload(torch.tensor(todo))] = res
        return out

    def _roi(self, img, box):
        """The source region (y1, x1, y2, x2): the sample's crop, or what Resize + CenterCrop keep (validation)."""
        if self.train:
            return tuple(float(v) for v in Box(*box).yxyx())
        return center_region(img.shape[-1], img.shape[-2], self.resize, self.size)[1].yxyx()

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
                    out.append(pil_to_chw(rgb(open_image(bytes(raw.numpy()), path), path)))
                    self.fallbacks += 1
            return out

    def _augment(self, img, roi, flip, s=None):
        """One image: the region ``roi`` resized to s x s (default: the loader's size), flipped if asked."""
        s = s or self.size
        if img.shape[0] == 1:
            img = img.expand(3, -1, -1)
        if self._per_image_uint8:
            return tensor_crop_resize(img, Box(roi[1], roi[0], roi[3], roi[2]), s, flip)
        y1, x1, y2, x2 = (int(round(v)) for v in roi)
        y1, x1 = max(y1, 0), max(x1, 0)
        y2, x2 = max(min(y2, img.shape[1]), y1 + 1), max(min(x2, img.shape[2]), x1 + 1)
        x = img[:, y1:y2, x1:x2].unsqueeze(0).float()
        x = F.interpolate(x, size=(s, s), mode="bilinear", align_corners=False, antialias=True)
        x = x.round_().clamp_(0, 255).to(torch.uint8)[0]
        return x.flip(-1) if flip else x


# pixels (images x padded h x w) per roi_align call: its float32 buffer <= 384 MiB; a larger image gets its own call
CHUNK_PIXELS = 1 << 25


def resized_crops(images, rois, size, flips, upload=None):
    """uint8 (N, 3, size, size) of ``images`` (uint8 CHW), ``rois`` (y1, x1, y2, x2), ``flips`` in a few device calls.
    Images of similar size share a padded float32 buffer (repeating each one's last row and column); roi_align
    averages bilinear samples over each output pixel's footprint, where torchvision's resize weighs it by a triangle."""
    from torchvision.ops import roi_align
    n, dev = len(images), images[0].device
    upload = upload or (lambda t: t.to(dev))
    sizes = [tuple(img.shape[-2:]) for img in images]
    order = sorted(range(n), key=lambda k: sizes[k][0] * sizes[k][1])
    chunks, start = [], 0
    while start < n:  # consecutive (by area) images while the padded buffer stays within CHUNK_PIXELS
        stop, hmax, wmax = start, 0, 0
        while stop < n:
            h, w = sizes[order[stop]]
            hh, ww = max(hmax, h), max(wmax, w)
            if stop > start and (stop - start + 1) * hh * ww > CHUNK_PIXELS:
                break
            stop, hmax, wmax = stop + 1, hh, ww
        chunks.append((start, stop, hmax, wmax))
        start = stop
    # every size, region, destination and flip in one transfer
    meta = upload(torch.tensor([[sizes[k][0], sizes[k][1], rois[k][1], rois[k][0], rois[k][3], rois[k][2], k,
                                 1.0 if flips[k] else 0.0] for k in order], dtype=torch.float32))
    res = torch.empty((n, 3, size, size), dtype=torch.uint8, device=dev)
    for start, stop, hmax, wmax in chunks:
        m = meta[start:stop]
        crops = _roi_chunk(roi_align, [images[k] for k in order[start:stop]], m, size, hmax, wmax)
        crops = crops.round_().clamp_(0, 255).to(torch.uint8)
        crops = torch.where(m[:, 7].view(-1, 1, 1, 1) > 0, crops.flip(-1), crops)
        res.index_copy_(0, m[:, 6].long(), crops)
    return res


def _roi_chunk(roi_align, images, meta, size, hmax, wmax):
    n, dev = len(images), images[0].device
    buf = torch.empty((n, 3, hmax, wmax), dtype=torch.float32, device=dev)
    for k, img in enumerate(images):
        buf[k, :, :img.shape[-2], :img.shape[-1]].copy_(img)  # greyscale (1 channel) broadcasts to 3
    if any(img.shape[-2] < hmax for img in images):  # rows past an image's last repeat it
        rows = torch.minimum(torch.arange(hmax, device=dev).view(1, hmax), meta[:, 0:1].long() - 1)
        buf = torch.gather(buf, 2, rows.view(n, 1, hmax, 1).expand(n, 3, hmax, wmax))
    if any(img.shape[-1] < wmax for img in images):
        cols = torch.minimum(torch.arange(wmax, device=dev).view(1, wmax), meta[:, 1:2].long() - 1)
        buf = torch.gather(buf, 3, cols.view(n, 1, 1, wmax).expand(n, 3, hmax, wmax))
    boxes = torch.cat([torch.arange(n, device=dev, dtype=torch.float32).view(n, 1), meta[:, 2:6]], 1)
    return roi_align(buf, boxes, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def loaders(spec, device, train_samples, val_samples):
    """(train loader or None, validation loader) decoded by ``spec.decode`` (not pinned: it copies the bytes)."""
    def loader(dataset, sampler, train):
        batches = dataloader(dataset, spec.batch_per_rank, sampler, spec.workers, False, train, collate, seed=spec.seed)
        return DeviceDecodeLoader(batches, device, spec.decode, spec.train_crop_size if train else spec.val_crop_size,
                                  train, resize=None if train else spec.val_resize_size,
                                  decode_ahead=spec.decode_ahead, batched_crops=spec.batched_crops)
    return backend_loaders(spec, train_samples, val_samples, EncodedDataset, PaddedEncoded, loader)
