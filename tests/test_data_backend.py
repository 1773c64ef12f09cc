"""The two data backends: the CPU backend's decode-what-the-crop-needs transforms, and the device backend's
batch decode + augmentation, run here on CPU tensors (the same code that runs on CUDA / NPU tensors)."""
import os
import shutil
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import ONCE, SMALL, STACK, assert_one_line_error, read_summary, run_main
from tools.make_dataset import generate
from trainer import data
from trainer.config import DataConfig
from trainer.device import Device

pytestmark = [STACK, pytest.mark.timeout(180)]

CPU = Device.create("cpu")


def Cfg(root, backend):
    """The data section these tests load with: 32-pixel crops from a 36-pixel resize."""
    return DataConfig(root=root, data_backend=backend, train_crop_size=32, crop_scale_min=0.25, val_resize_size=36,
                      val_crop_size=32)


def batches(root, backend, workers, n=3, split="train", batch=8):
    train, val, info = data.build(Cfg(root, backend), CPU, data.Sampling(batch, workers=workers, seed=7))
    loader = train if split == "train" else val
    if split == "train":
        loader.sampler.set_epoch(1)
    out = []
    for i, b in enumerate(loader):
        out.append([t.clone() for t in b])
        if i + 1 == n:
            break
    return out, info


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("photos") / "p")
    return generate(root, classes=2, train_per_class=12, val_per_class=5, photos=True, seed=3)


@ONCE
def test_photos_are_imagenet_sized_jpegs(photos):
    sizes = []
    for dirpath, _, files in os.walk(photos):
        for f in files:
            with Image.open(os.path.join(dirpath, f)) as img:
                assert img.format == "JPEG" and img.mode == "RGB"
                sizes.append(max(img.size))
    assert len(sizes) == 34 and all(375 <= s <= 1200 for s in sizes)


def test_device_backend_is_seeded_alike_for_any_worker_count(photos):
    a, info = batches(photos, "gpu", 0)
    b, _ = batches(photos, "gpu", 2)
    assert info.backend == "gpu"
    for x, y in zip(a, b):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
    assert a[0][0].dtype == torch.uint8 and tuple(a[0][0].shape) == (8, 3, 32, 32)



@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_iterating_a_loader_leaves_torchs_global_rng_as_it_was(photos, backend, workers):
    """The training step draws from torch's global RNG (dropout), which a checkpoint keeps and a resume restores: no
    loader draws from it (an iterator's worker seeds come from the loader's own generator), training or validation,
    its first iterator or a later one (persistent workers)."""
    train, val, _ = data.build(Cfg(photos, backend), CPU, data.Sampling(4, workers=workers, seed=7))
    state = torch.get_rng_state()
    for epoch in range(2):
        train.sampler.set_epoch(epoch)
        for loader in (train, val):
            assert len(next(iter(loader))) >= 2
    assert torch.equal(torch.get_rng_state(), state)


def _spied_train_loader(root, decode_spy, ahead=True):
    """The device backend's train loader with its decoder spied on; ``ahead``: decode in a thread, as on CUDA."""
    train, _, _ = data.build(Cfg(root, "gpu"), CPU, data.Sampling(8, seed=7))
    assert train.ahead is False  # a CPU decodes on the training thread: a thread beside it splits the same cores
    train.ahead = ahead
    train.sampler.set_epoch(1)
    real = train.decode
    train.decode = lambda raws: decode_spy(real, raws)
    return train


def _decode_ahead_threads():
    return [t for t in threading.enumerate() if t.name.startswith("decode-ahead")]


def test_device_backend_prepares_the_next_batch_while_the_caller_holds_one(photos):
    calls, second_started = [], threading.Event()

    def spy(real, raws):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            second_started.set()
        return real(raws)

    loader = _spied_train_loader(photos, spy)
    it = iter(loader)
    first = next(it)
    # nothing more asked for: batch 2 is decoded anyway, beside the caller
    assert second_started.wait(30), calls
    assert all(name.startswith("decode-ahead") for name in calls)
    rest = list(it)
    assert len(rest) == len(loader) - 1 == 2
    expected, _ = batches(photos, "gpu", 0)
    for got, want in zip([first] + rest, expected):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not _decode_ahead_threads()



def test_device_backend_on_a_cpu_decodes_on_the_calling_thread(photos):
    threads = []

    def spy(real, raws):
        threads.append(threading.get_ident())
        return real(raws)

    got = list(_spied_train_loader(photos, spy, ahead=False))
    assert len(got) == 3 and set(threads) == {threading.get_ident()}
    expected, _ = batches(photos, "gpu", 0)
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, expected))

def test_loader_spec_chooses_the_device_backends_ways_of_working_or_leaves_them_to_the_device(photos):
    """LoaderSpec.decode_ahead / batched_crops: None is the device's choice (a CPU: on the training thread,
    image by image); True or False decides, for both loaders; the batches are the same either way."""
    classes = data.find_classes(os.path.join(photos, "train"))
    train_samples = data.scan_train(os.path.join(photos, "train"), classes)
    val_samples = data.scan_val(os.path.join(photos, "val"), {c: i for i, c in enumerate(classes)})
    backend, decode, _ = data.resolve_backend("gpu", CPU)

    def loaders(**choices):
        spec = data.LoaderSpec(batch_per_rank=8, seed=7, train_crop_size=32, crop_scale_min=0.25,
                               val_resize_size=36, val_crop_size=32, decode=decode, **choices)
        return data.BACKENDS[backend](spec, CPU, train_samples, val_samples)

    for loader in loaders():
        assert loader.ahead is False and loader._batched is (False if loader._per_image_uint8 else None)
    for loader in loaders(decode_ahead=True, batched_crops=True):
        assert loader.ahead is True and not loader._per_image_uint8 and loader._batched is None
    for loader in loaders(decode_ahead=False, batched_crops=False):
        assert loader.ahead is False and loader._batched is (False if loader._per_image_uint8 else None)
    default, chosen = loaders()[0], loaders(decode_ahead=True)[0]
    default.sampler.set_epoch(1)
    chosen.sampler.set_epoch(1)
    for x, y in zip(default, chosen):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
    assert not _decode_ahead_threads()


def test_device_backend_stopped_early_leaves_no_data_work_and_starts_again_alike(photos):
    loader = _spied_train_loader(photos, lambda real, raws: real(raws))
    for first in loader:
        break  # a step limit: the batch being prepared is finished, then its thread ends
    assert not _decode_ahead_threads()
    again = next(iter(loader))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not _decode_ahead_threads()


class _DecoderFault(Exception):
    pass


@ONCE
def test_device_backend_error_in_the_next_batch_reaches_the_caller_as_raised(photos):
    def spy(real, raws):
        if spy.calls == 1:
            raise _DecoderFault("second batch")
        spy.calls += 1
        return real(raws)
    spy.calls = 0
    it = iter(_spied_train_loader(photos, spy))
    assert tuple(next(it)[0].shape) == (8, 3, 32, 32)
    with pytest.raises(_DecoderFault, match="second batch"):
        next(it)
    assert not _decode_ahead_threads()


def test_device_backend_crops_like_the_cpu_backend(photos):
    """Same seed -> same crops and flips; only the decoder and the resampling filter differ."""
    g, _ = batches(photos, "gpu", 0)
    c, info = batches(photos, "cpu", 0)
    assert info.backend == "cpu"
    def close(a, b):
        # grey levels out of 255; a 32-pixel crop of a 500-pixel photo is a 5-15x downscale, where the CPU
        # backend's draft-mode decode and the bilinear filter differ most; the crops' colours agree closely
        assert (a.float() - b.float()).abs().mean() < 8.0
        assert (a.float().mean((2, 3)) - b.float().mean((2, 3))).abs().max() < 3.0
    for x, y in zip(g, c):
        assert torch.equal(x[1], y[1])
        close(x[0], y[0])
    gv, _ = batches(photos, "gpu", 0, n=2, split="val")
    cv, _ = batches(photos, "cpu", 0, n=2, split="val")
    for x, y in zip(gv, cv):
        assert torch.equal(x[2], y[2])
        close(x[0], y[0])


def _images(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]


def test_batched_crop_resize_copies_an_identity_region_and_is_independent_of_its_batch(monkeypatch):
    from trainer.data import device_backend as bd
    imgs = _images([(40, 50), (64, 32), (30, 30), (100, 80)])
    assert torch.equal(bd.resized_crops([imgs[2]], [(0.0, 0.0, 30.0, 30.0)], 30, [False])[0], imgs[2])
    assert torch.equal(bd.resized_crops([imgs[2]], [(0.0, 0.0, 30.0, 30.0)], 30, [True])[0], imgs[2].flip(-1))
    # regions touching the images' right and bottom edges: a smaller image padded to a bigger one's size
    # reads its own last row and column, as it does alone
    rois = [(5.0, 7.0, 40.0, 50.0), (10.0, 0.0, 64.0, 32.0), (0.0, 0.0, 30.0, 30.0), (20.0, 30.0, 100.0, 80.0)]
    flips = [False, True, False, True]
    alone = [bd.resized_crops([im], [roi], 24, [f])[0] for im, roi, f in zip(imgs, rois, flips)]
    together = bd.resized_crops(imgs, rois, 24, flips)
    for a, b in zip(alone, together):
        assert torch.equal(a, b)
    monkeypatch.setattr(bd, "CHUNK_PIXELS", 40 * 50 * 2)  # several padded buffers, one per chunk
    assert torch.equal(bd.resized_crops(imgs, rois, 24, flips), together)


@pytest.mark.parametrize("uint8", [False, True], ids=["float-resize", "uint8-resize"])
def test_batched_crop_resize_is_close_to_antialiased_interpolation(uint8):
    """roi_align's box filter against the triangle filter of the image-by-image antialiased resize (float, as
    on an accelerator without roi_align; uint8, as on a CPU), on smooth images (shrinking up to 4x and
    enlarging): a fraction of a grey level apart on average."""
    from trainer.data import device_backend as bd
    from trainer.device import uint8_antialias_resize
    if uint8 and not uint8_antialias_resize():
        pytest.skip("this torch has no uint8 antialiased resize")
    g = torch.Generator().manual_seed(1)
    sizes = [(40, 50), (64, 32), (96, 96), (100, 80)]
    imgs = [torch.nn.functional.interpolate(torch.rand(1, 3, 8, 8, generator=g), size=hw, mode="bilinear",
                                            align_corners=False).mul(255).round().byte()[0] for hw in sizes]
    rois = [(5.0, 7.0, 40.0, 50.0), (10.0, 0.0, 64.0, 32.0), (0.0, 0.0, 96.0, 96.0), (30.0, 40.0, 42.0, 52.0)]
    loader = bd.DeviceDecodeLoader.__new__(bd.DeviceDecodeLoader)
    loader.size, loader._per_image_uint8 = 24, uint8
    batched = bd.resized_crops(imgs, rois, 24, [False] * 4).float()
    single = torch.stack([loader._augment(im, roi, False) for im, roi in zip(imgs, rois)]).float()
    assert (batched - single).abs().mean() < 1.0
    # most apart on a region's border: the image-by-image path sees only the crop, roi_align also the
    # pixels just outside it (as PIL's resize with a box does)
    assert (batched - single).abs().max() <= 16


@pytest.fixture(params=["torch-resize", "pil-resize", "pillow-simd"])
def resize_path(request, monkeypatch):
    """The CPU backend's two resizes: torch's uint8 one (torch >= 2.1, Pillow), PIL's (older torch, or
    pillow-simd installed; its detection is faked here, its resize is Pillow's)."""
    from trainer.device import shims as devmod  # the guard's module, which holds its cache
    use_torch = request.param == "torch-resize"
    if request.param != "pil-resize" and not devmod.uint8_antialias_resize():
        pytest.skip("this torch has no uint8 antialiased resize")
    monkeypatch.setattr(devmod, "_UINT8_RESIZE", [request.param != "pil-resize"])
    from trainer.data import images
    monkeypatch.setattr(images, "_PIL_SIMD", [request.param == "pillow-simd"])
    assert data.torch_resize() == use_torch
    return request.param


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cpu_crop_equals_torchvision_when_nothing_is_drafted(resize_path):
    from torchvision.transforms import functional as F
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8))
    crop = data.TrainCrop(64, 0.5)
    for seed in range(5):
        top, left, h, w, flip = crop.params(160, 120, data.sample_rng(seed))
        ref = F.pil_to_tensor(F.resized_crop(img, top, left, h, w, [64, 64], F.InterpolationMode.BILINEAR))
        if flip:
            ref = ref.flip(-1)
        ours = crop(img.copy(), "x", data.sample_rng(seed))
        # PIL's resize(box=...) filters the crop's edge pixels with their real neighbours, where
        # crop-then-resize repeats the edge; everything inside is the same
        assert (ours.int() - ref.int())[:, 1:-1, 1:-1].abs().max() <= 1
        if resize_path == "torch-resize":  # crop, then resize: torchvision's own order, edges included
            tv = F.resized_crop(F.pil_to_tensor(img), top, left, h, w, [64, 64], F.InterpolationMode.BILINEAR,
                                antialias=True)
            assert (ours.int() - (tv.flip(-1) if flip else tv).int()).abs().max() <= 1


def test_val_crop_is_resize_then_center_crop(resize_path):
    """Validation: torchvision's Resize then CenterCrop; with torch's resize, within one grey level of
    torchvision's tensor resize everywhere (rounding), and of its PIL resize inside the crop."""
    from torchvision.transforms import functional as F
    rng = np.random.default_rng(1)
    for hw in [(120, 160), (161, 97), (50, 50)]:
        img = Image.fromarray(rng.integers(0, 255, hw + (3,), dtype=np.uint8))
        ours = data.ValCrop(40, 32)(img.copy(), "x")
        assert tuple(ours.shape) == (3, 32, 32)
        assert ours.permute(1, 2, 0).is_contiguous()  # channels-last in memory, as the collate stacks it
        ref_pil = F.pil_to_tensor(F.center_crop(F.resize(img, 40, F.InterpolationMode.BILINEAR), 32))
        assert (ours.int() - ref_pil.int())[:, 1:-1, 1:-1].abs().float().mean() < 1.0
        if resize_path == "torch-resize":
            ref = F.center_crop(F.resize(F.pil_to_tensor(img), 40, F.InterpolationMode.BILINEAR, antialias=True), 32)
            assert (ours.int() - ref.int()).abs().max() <= 1


def test_channels_last_collate_and_normalizer_match_the_nchw_path():
    """The channels-last batch holds the NCHW batch's values; normalised through its NHWC rows it gives the
    NCHW normaliser's floats bit for bit, in channels-last format; padded validation's flags pass through."""
    g = torch.Generator().manual_seed(3)
    hwc = [torch.randint(0, 256, (20, 24, 3), dtype=torch.uint8, generator=g) for _ in range(5)]
    samples = [(x.permute(2, 0, 1), k, k % 2 == 0) for k, x in enumerate(hwc)]
    plain = torch.utils.data.dataloader.default_collate(samples)
    cl = data.channels_last_collate(samples)
    assert torch.equal(cl[0], plain[0]) and cl[0].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(cl[1], plain[1]) and torch.equal(cl[2], plain[2])
    ref = data.Normalizer(CPU, channels_last=False)(plain[0])
    out = data.Normalizer(CPU, channels_last=True)(cl[0])
    assert torch.equal(out, ref) and out.is_contiguous(memory_format=torch.channels_last)
    # an NCHW batch given to a channels-last normaliser (the device backend's) is converted
    out2 = data.Normalizer(CPU, channels_last=True)(plain[0])
    assert torch.equal(out2, ref) and out2.is_contiguous(memory_format=torch.channels_last)
    assert data.Normalizer(CPU, channels_last=False)(cl[0]).is_contiguous()


@ONCE
def test_draft_mode_decodes_a_small_crop_of_a_big_jpeg_at_reduced_size(tmp_path):
    path = str(tmp_path / "big.JPEG")
    Image.fromarray(np.full((800, 1000, 3), 128, dtype=np.uint8)).save(path, quality=90)
    img = data.open_image(data.read_bytes(path), path)
    from trainer.data import transforms
    sx, sy = transforms._draft(img, 300, 240)  # the crop needs 300 x 240 of the whole image's scale
    assert (sx, sy) == (0.5, 0.5) and img.size == (500, 400)
    out = data.ValCrop(36, 32)(data.open_image(data.read_bytes(path), path), path)
    assert tuple(out.shape) == (3, 32, 32) and int(out.float().mean().round()) == 128


def test_fallback_files_are_counted_and_a_corrupt_file_stops_the_run(tmp_path):
    root = generate(str(tmp_path / "d"), classes=2, train_per_class=8, val_per_class=3, size=40, seed=1)
    cls = sorted(os.listdir(os.path.join(root, "train")))[0]
    src = os.path.join(root, "train", cls, sorted(os.listdir(os.path.join(root, "train", cls)))[0])
    Image.open(src).save(os.path.join(root, "train", cls, "png_inside.JPEG"), "PNG")
    Image.open(src).convert("CMYK").save(os.path.join(root, "train", cls, "cmyk.JPEG"), "JPEG")
    args = ["-a", "tiny_cnn", "--epochs", "1", "-b", "6", "--device", "cpu", "--data-backend", "gpu", "--seed", "1",
            "--no-tensorboard"] + SMALL
    proc = run_main([root, "--output-dir", str(tmp_path / "o")] + args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path / "o")
    assert s["data_backend"] == "gpu"
    # 18 training images, 3 steps of 6: the epoch sees all of them, the two fallbacks included
    assert s["data_fallback_images"] == 2
    assert "image(s) so far decoded on the CPU" in proc.stdout
    shutil.copy(src, os.path.join(root, "train", cls, "zz_broken.JPEG"))
    with open(os.path.join(root, "train", cls, "zz_broken.JPEG"), "r+b") as f:
        f.seek(200)
        f.write(b"\x00" * 64 + b"\xff\xd9")  # a header that reads, data that does not
        f.truncate()
    bad = run_main([root, "--output-dir", str(tmp_path / "o2")] + args)
    assert_one_line_error(bad, "cannot decode image", "zz_broken.JPEG")


class _RecordingDevice:
    """The CPU device, with the order of the data backend's decodes and host-to-device transfers recorded."""

    def __init__(self, device, events):
        self._device, self._events = device, events

    def __getattr__(self, name):
        attr = getattr(self._device, name)
        if name not in ("move", "upload"):
            return attr

        def recorded(*args, **kwargs):
            self._events.append(name)
            return attr(*args, **kwargs)
        return recorded


@ONCE
def test_device_backend_decodes_a_batch_before_it_transfers_the_worker_decoded_images(tmp_path):
    """CUDA's decoder writes from a stream that does not wait for the data stream, so each batch's decode comes
    before anything queued there that could still read memory freed for it (the fallback images' transfer)."""
    root = generate(str(tmp_path / "d"), classes=2, train_per_class=6, val_per_class=1, size=40, seed=1)
    cls_dir = os.path.join(root, "train", sorted(os.listdir(os.path.join(root, "train")))[0])
    for k, name in enumerate(sorted(os.listdir(cls_dir))[:3]):
        Image.open(os.path.join(cls_dir, name)).save(os.path.join(cls_dir, "png_{}.JPEG".format(k)), "PNG")
    train, _, _ = data.build(Cfg(root, "gpu"), CPU, data.Sampling(5, seed=7))
    events = []
    train.device = _RecordingDevice(CPU, events)
    real_decode, real_batch = train.decode, train._decode_batch
    train.decode = lambda raws: events.append("decode") or real_decode(raws)
    train._decode_batch = lambda *a: events.append("batch") or real_batch(*a)
    train.sampler.set_epoch(0)
    assert len(list(train)) == 3
    assert train.fallbacks == 3
    per_batch = " ".join(events).split("batch")[1:]
    transferred = [b.split() for b in per_batch if "upload" in b]
    assert transferred, events  # some batch mixed fallback images with ones to decode
    for b in transferred:
        assert b[0] == "decode" and "decode" not in b[1:], events


def test_validation_counts_every_image_once(tmp_path):
    """The device backend (the CPU backend's count is checked in test_train.py)."""
    backend = "gpu"
    root = generate(str(tmp_path / "d"), classes=3, train_per_class=4, val_per_class=7, size=40, seed=2)
    proc = run_main([root, "-e", "-a", "tiny_cnn", "-b", "8", "--device", "cpu", "--data-backend", backend,
                     "--output-dir", str(tmp_path / "o")] + SMALL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path / "o", "eval_summary.json")
    assert s["val_images"] == 21  # 3 batches of 8, the last padded with 3 images that count nowhere

@ONCE
def test_workers_default_from_the_cores_and_are_reported(tmp_path):
    """No -j: the device's default per process (a CPU here), in the log line and summary.json."""
    from trainer.device import Device
    root = generate(str(tmp_path / "d"), classes=2, train_per_class=8, val_per_class=2, size=32, seed=4)
    k = SMALL.index("-j")
    args = SMALL[:k] + SMALL[k + 2:]
    proc = run_main([root, "-a", "tiny_cnn", "--epochs", "1", "-b", "4", "--device", "cpu", "--no-tensorboard",
                     "--output-dir", str(tmp_path / "o")] + args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = Device.of("cpu").default_workers(1)
    assert read_summary(tmp_path / "o")["data_workers"] == expected
    assert "{} worker{} per process".format(expected, "" if expected == 1 else "s") in proc.stdout
