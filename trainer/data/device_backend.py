"""The device data backend (``--data-backend gpu``): JPEG decode and augmentation of whole batches where
the model runs.

Workers only read each file's bytes and its header (size, format, colour mode), draw the sample's crop
and flip from its seed exactly as the CPU backend does (``TrainCrop.params``: the same draws, so the
same crop for the same seed), and hand over (bytes, box, flip). The training process decodes the batch
with the device's decoder (``Device.jpeg_decoder``: nvJPEG through torchvision.io.decode_jpeg on CUDA,
DVPP through torchvision_npu on NPU, libjpeg on the CPU), then crops, resizes and flips the whole batch in
a few device calls (``resized_crops``: torchvision's ``roi_align``; image by image with antialiased
``interpolate`` where the device has no roi_align), uint8 until the normaliser. Validation: the region
that ``Resize`` then ``CenterCrop`` keep, resized the same way. On CUDA (``Device.decode_ahead``) a thread
of its own prepares each batch while the training step of the one before runs (the decode call releases
the GIL, measured for the CPU decoder, so the host waits for it there, not in the training loop); its device work
runs on a stream of its own (``Device.data_work``), which the training stream waits for only when it
takes the batch.

Files the device decoder cannot take (not a JPEG, e.g. a PNG named .JPEG; CMYK or other colour modes) are
decoded by the worker with the CPU backend's transform, same crop, and counted (``fallbacks``). A file whose
header cannot be read stops the run naming it, as on the CPU backend; one whose data the device decoder
rejects is decoded on the CPU, which names it if it is corrupt.
"""
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from trainer.data.images import (Box, open_image, pil_to_chw, read_bytes, rgb, sample_rng, tensor_crop_resize,
                                 transformed)
from trainer.data.samplers import EpochSampler, ShardSampler, dataloader, item_parts, padded_length
from trainer.data.transforms import center_region, train_transform, val_transform
from trainer.device import uint8_antialias_resize

DEVICE_MODES = ("RGB", "L")  # JPEG colour modes the device decoders convert to RGB themselves


class EncodedDataset(torch.utils.data.Dataset):
    """(path, class) samples -> (file bytes, box, flip, fallback image, class, path) for a device decoder.

    ``box`` is the Box (as int64 left, top, right, bottom) to resize to ``size`` (train: the sample's
    RandomResizedCrop; val: the whole image, resized then centre-cropped on the device). A sample the
    device cannot decode comes back decoded here (``fallback``, uint8 CHW) with empty bytes, at the item's size
    where the sampler gives one (a resolution schedule).
    """

    def __init__(self, samples, train, cpu_transform, size):
        self.samples, self.train, self.cpu_transform, self.size = samples, train, cpu_transform, size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, item):
        index, seed, size = item_parts(item)
        path, target = self.samples[index]
        raw = read_bytes(path)
        img = open_image(raw, path)
        if img.format != "JPEG" or img.mode not in DEVICE_MODES:
            transform = self.cpu_transform.at(size) if size is not None else self.cpu_transform
            return _EMPTY, _NO_BOX, False, transformed(img, transform, seed, path), target, path
        if self.train:
            top, left, h, w, flip = self.cpu_transform.params(img.size[0], img.size[1], sample_rng(seed))
            box = Box.from_crop(top, left, h, w)
        else:
            box, flip = Box(0, 0, img.size[0], img.size[1]), False
        box = torch.tensor(box, dtype=torch.int64)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8), box, flip, _NO_IMAGE, target, path


_EMPTY = torch.zeros(0, dtype=torch.uint8)
_NO_BOX = torch.zeros(4, dtype=torch.int64)
_NO_IMAGE = torch.zeros(0, dtype=torch.uint8)


def collate(batch):
    """The batch's file bytes in one buffer with their lengths (a worker hands over one shared-memory block
    per batch, not one per image), lists for the other variable-size parts, tensors for the rest; a
    trailing ``valid`` (padded validation) kept."""
    cols = list(zip(*batch))
    raws = cols[0]
    lengths = torch.tensor([r.numel() for r in raws], dtype=torch.int64)
    out = [(torch.cat(raws) if raws else _EMPTY, lengths), torch.stack(cols[1]),
           torch.tensor(cols[2], dtype=torch.bool), list(cols[3]), torch.tensor(cols[4]), list(cols[5])]
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
    """Wraps a DataLoader of ``EncodedDataset`` batches: yields (uint8 NCHW on the device, targets[, valid]).

    ``decode_ahead``: prepare the next batch in a thread beside the caller; ``batched_crops``: crop a batch
    with one roi_align call (False: image by image, with the uint8 resize where torch has it). None, the
    default of each: the device's choice (``Device.decode_ahead``, ``not Device.crops_per_image``). A sampler
    with a ``size`` (a resolution schedule's, read when an epoch's iteration starts) sets the training size."""

    def __init__(self, loader, device, decode, size, train, resize=None, decode_ahead=None, batched_crops=None):
        self.loader, self.device, self.decode = loader, device, decode
        self.size, self.train, self.resize = size, train, resize
        self.sampler = loader.sampler
        self.fallbacks = 0  # samples the workers decoded on the CPU
        # whether resized_crops (roi_align) runs on this device; None: not tried yet. Image by image where the
        # device resizes uint8 images faster than one batched roi_align (a CPU)
        per_image = device.crops_per_image if batched_crops is None else not batched_crops
        self._per_image_uint8 = per_image and uint8_antialias_resize()
        self._batched = False if self._per_image_uint8 else None
        self.ahead = device.decode_ahead if decode_ahead is None else bool(decode_ahead)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        """Batches in the loader's order. With ``ahead``, batch k+1 is read, decoded and cropped by a thread
        of its own while the caller works with batch k; an error there is raised here, as it was raised there,
        and closing the iteration before its end (a step limit; the caller dropping its iterator) waits for the
        batch in preparation, so no data work outlives it."""
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
        n, s = len(raw), s or self.size
        out = None
        todo = [k for k in range(n) if raw[k].numel() > 0]
        ready = [k for k in range(n) if raw[k].numel() == 0]
        # the decode first: CUDA's decoder writes from a stream of its own that does not wait for this one, so
        # it runs while nothing is queued here (``data_work`` drained it) that could still read memory this
        # batch freed, such as an index tensor of the transfer below
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
        """The source region (y1, x1, y2, x2) that becomes the output: the sample's crop (train), or the part
        of the image that Resize(resize) then CenterCrop(size) keep, in source pixels (validation)."""
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
                    img = open_image(bytes(raw.numpy()), path)
                    out.append(pil_to_chw(rgb(img, path)))
                    self.fallbacks += 1
            return out

    def _augment(self, img, roi, flip, s=None):
        """One image: the region ``roi`` resized to s x s (the loader's size by default; antialiased bilinear),
        flipped if asked."""
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


# pixels (images x padded height x padded width) resized in one roi_align call: bounds its float32 buffer
# (3 channels: 384 MiB); a larger image gets a call of its own
CHUNK_PIXELS = 1 << 25


def resized_crops(images, rois, size, flips, upload=None):
    """A batch's crops and resizes in a few device calls: ``images`` (uint8 CHW, any sizes, one device),
    ``rois`` (y1, x1, y2, x2) in source pixels, ``flips`` (bools) -> uint8 (N, 3, size, size). ``upload``
    puts a host tensor on the images' device (``Device.upload``: without waiting for queued work).

    Images of similar size share a padded float32 buffer (one copy each; the padding repeats each image's
    last row and column, so a region touching the image's edge reads what a lone image would), and
    ``torchvision.ops.roi_align`` (aligned, adaptive sampling) resizes every region at once: each output
    pixel is the mean of bilinear samples spaced at most one source pixel apart over its footprint (a box
    filter when shrinking, plain bilinear when enlarging). torchvision's antialiased ``resize`` weighs the
    same footprint with a triangle instead: outputs differ by a few levels where the image has detail."""
    from torchvision.ops import roi_align
    n = len(images)
    dev = images[0].device
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
    small_h = small_w = False
    for k, img in enumerate(images):
        h, w = img.shape[-2:]
        buf[k, :, :h, :w].copy_(img)  # greyscale (1 channel) broadcasts to 3
        small_h, small_w = small_h or h < hmax, small_w or w < wmax
    if small_h:  # rows past an image's last repeat it
        rows = torch.minimum(torch.arange(hmax, device=dev).view(1, hmax), meta[:, 0:1].long() - 1)
        buf = torch.gather(buf, 2, rows.view(n, 1, hmax, 1).expand(n, 3, hmax, wmax))
    if small_w:
        cols = torch.minimum(torch.arange(wmax, device=dev).view(1, wmax), meta[:, 1:2].long() - 1)
        buf = torch.gather(buf, 3, cols.view(n, 1, 1, wmax).expand(n, 3, hmax, wmax))
    boxes = torch.cat([torch.arange(n, device=dev, dtype=torch.float32).view(n, 1), meta[:, 2:6]], 1)
    return roi_align(buf, boxes, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def loaders(spec, device, train_samples, val_samples):
    """(train loader or None, validation loader) of uint8 batches decoded on the device by ``spec.decode``
    (the workers read the files; not pinned: the decoder copies the bytes itself)."""
    train = None
    if train_samples is not None:
        sampler = EpochSampler(len(train_samples), spec.seed, spec.rank, spec.world_size, spec.train_sizes)
        crop = train_transform(spec.train_crop_size, spec.crop_scale_min)
        ds = EncodedDataset(train_samples, True, crop, spec.train_crop_size)
        train = DeviceDecodeLoader(dataloader(ds, spec.batch_per_rank, sampler, spec.workers, False, True, collate),
                                   device, spec.decode, spec.train_crop_size, True, decode_ahead=spec.decode_ahead,
                                   batched_crops=spec.batched_crops)
    center = val_transform(spec.val_resize_size, spec.val_crop_size)
    length = padded_length(len(val_samples), spec.batch_per_rank, spec.world_size)
    padded = PaddedEncoded(EncodedDataset(val_samples, False, center, spec.val_crop_size), length, spec.val_crop_size)
    val = DeviceDecodeLoader(
        dataloader(padded, spec.batch_per_rank, ShardSampler(length, spec.rank, spec.world_size), spec.workers,
                   False, False, collate), device, spec.decode, spec.val_crop_size, False, resize=spec.val_resize_size,
        decode_ahead=spec.decode_ahead, batched_crops=spec.batched_crops)
    return train, val
