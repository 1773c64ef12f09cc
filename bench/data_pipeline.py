#!/usr/bin/env python3
"""Data-pipeline throughput: this trainer's backends against torchvision's default ImageNet pipeline.

    python3 -m bench.data_pipeline DATA [--backend all|cpu|gpu|torchvision] [--workers N] [--images N]
                                   [--batch-size 64] [--split train|val] [--rounds 2] [--device auto]
                                   [--json FILE]
    python3 -m bench.data_pipeline DATA --epoch-vs-examples [--arch shufflenet_v2_x0_5] [--batch-size 64]
                                   [--workers N] [--synthetic] [--json FILE]
    python3 -m bench.data_pipeline DATA --decode-ahead [--arch ...] [--batch-size 64] [--workers N]
                                   [--rounds 2] [--device auto] [--amp] [--steps N] [--json FILE]
    python3 -m bench.data_pipeline DATA --host-memory [--arch ...] [--batch-size 64] [--workers N] [--rounds 2]

Loader mode: each backend delivers --images images as normalised float batches on the device, the way
training consumes them, and is timed from its first to its last batch (the first batch, with worker
start-up, is left out). The backends run one after another, --rounds times in rotating order, on the
same files with the same workers and batch size:

  torchvision  ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize in the
               workers (val: Resize(256) + CenterCrop(224)), as pytorch/examples and torchvision's
               references do
  cpu          this trainer's CPU backend: the crop chosen from the JPEG header, draft-mode decode,
               one resize, uint8 batches, normalisation where the model runs
  gpu          this trainer's device backend: workers read file bytes; whole batches are decoded with
               torchvision.io.decode_jpeg on the device and cropped/resized there (CUDA, or the CPU
               tensors of the same code with --device cpu)

Reported per backend: images/s, CPU seconds used (this process and its workers, from /proc while they
run), images per CPU-second (the per-core rate), and the ratio to torchvision's. This process uses one
thread (torch.set_num_threads(1)), as the workers do.

--epoch-vs-examples: one training epoch from the same JPEGs, this trainer (main.py) against a loop that
does what pytorch/examples' imagenet/main.py does per step (its transforms in the workers, the batch
copied, forward, loss, accuracy, loss.item(), backward, SGD), same model, batch, workers and float32;
images/s of each and their ratio. --synthetic adds both loops on synthetic data (the trainer's --dummy,
the loop on one batch made once), which splits each one's time per image into the model's and the data's.

--host-memory: one training epoch of main.py from the JPEGs with the trainer's host-memory setting on a CPU
(glibc keeps freed blocks for the next step: trainer/device/host.py keep_host_memory) and with glibc's own
behaviour (MALLOC_PERTURB_=0 in the environment, which changes nothing in glibc but leaves the choice to
the user), alternating, --rounds times; images/s and the process's peak resident memory.

--decode-ahead: one training epoch of main.py with --data-backend gpu, in this process, with the next batch
prepared in a thread beside the training step (what CUDA does) and on the training thread (what the other
devices do), alternating, --rounds times (--amp: with --amp --channels-last, as make check-device's FPS
checks train; --steps N: at most N steps of each epoch); images/s and the fraction of time spent waiting
for data. First,
whether the device's JPEG decoder lets two threads run at once: a batch of the files decoded by one
thread, then by two threads each decoding it (about the same time for twice the work: it releases the
interpreter lock, so the thread can overlap the step; twice the time: it does not).
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import torch

from trainer import data as datamod
from trainer.device import Device, user_allocator_choice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MEAN, STD = datamod.MEAN, datamod.STD


_TICK = float(os.sysconf("SC_CLK_TCK"))


def _proc_cpu(pid):
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK  # ppid, utime + stime
    except (OSError, IndexError, ValueError):
        return None, 0.0


def cpu_seconds():
    """CPU seconds used so far by this process and its children (the loader's workers): the living ones from
    /proc, the ended ones from getrusage."""
    me = os.getpid()
    done = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers that already ended (and were reaped)
    total = _proc_cpu(me)[1] + done.ru_utime + done.ru_stime
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            ppid, secs = _proc_cpu(entry)
            if ppid == me:
                total += secs
    return total


def torchvision_loader(root, split, batch, workers):
    from torchvision import datasets, transforms
    norm = transforms.Normalize(MEAN, STD)
    if split == "train":
        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), norm])
    else:
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm])
    ds = datasets.ImageFolder(os.path.join(root, split), tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                       pin_memory=torch.cuda.is_available())


def trainer_loader(root, split, batch, workers, backend, device):
    """The trainer's loader of ``split`` from the ``backend`` data backend, built as ``trainer.data.build``
    builds it (one rank, seed 0, the default crops, the device's default memory format)."""
    backend, decode, _ = datamod.resolve_backend(backend, device)
    need_train = split == "train"
    datamod.check_data_root(root, need_train=need_train)
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = datamod.find_classes(train_dir if os.path.isdir(train_dir) else val_dir)
    val_samples = datamod.scan_val(val_dir, {c: i for i, c in enumerate(classes)})
    train_samples = datamod.scan_train(train_dir, classes) if need_train else None
    spec = datamod.LoaderSpec(batch_per_rank=batch, workers=workers, seed=0,
                              channels_last=device.prefers_channels_last, decode=decode)
    train, val = datamod.BACKENDS[backend](spec, device, train_samples, val_samples)
    return train if need_train else val


def time_loader(loader, images, to_device):
    """Seconds to deliver ``images`` images after the first batch, and the CPU seconds used."""
    it = iter(loader)
    first = next(it)
    to_device(first)
    n, t0, c0 = 0, time.perf_counter(), cpu_seconds()
    while n < images:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        x = to_device(batch)
        n += x.shape[0]
    if x.is_cuda:
        torch.cuda.synchronize()
    return n, time.perf_counter() - t0, cpu_seconds() - c0  # measured while the workers still live


def loader_bench(a, device):
    backends = ["torchvision", "cpu", "gpu"] if a.backend == "all" else [a.backend]
    norm = datamod.Normalizer(device, device.prefers_channels_last)
    results = {b: [] for b in backends}
    for r in range(a.rounds):
        order = backends[r % len(backends):] + backends[:r % len(backends)]
        for b in order:
            if b == "torchvision":
                loader = torchvision_loader(a.data, a.split, a.batch_size, a.workers)
                move = lambda batch: device.move(batch[0])  # noqa: E731 (already normalised floats)
            else:
                loader = trainer_loader(a.data, a.split, a.batch_size, a.workers, b, device)
                move = lambda batch: norm(batch[0])  # noqa: E731
            n, secs, cpu = time_loader(loader, a.images, move)
            del loader
            results[b].append({"images": n, "seconds": secs, "cpu_seconds": cpu})
            print("round {} {:<12} {:8.1f} images/s  {:7.1f} images per CPU-second".format(
                r, b, n / secs, n / cpu if cpu else float("nan")), flush=True)
    out = {}
    for b, runs in results.items():
        n = sum(x["images"] for x in runs)
        secs, cpu = sum(x["seconds"] for x in runs), sum(x["cpu_seconds"] for x in runs)
        out[b] = {"images_per_second": n / secs, "images_per_cpu_second": n / cpu if cpu else None,
                  "seconds": secs, "cpu_seconds": cpu, "images": n}
    base = out.get("torchvision")
    print("\n| backend | images/s | images per CPU-second | vs torchvision (images/s) | vs torchvision (per CPU-s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for b, v in out.items():
        r1 = v["images_per_second"] / base["images_per_second"] if base else None
        r2 = v["images_per_cpu_second"] / base["images_per_cpu_second"] if base and v["images_per_cpu_second"] \
            else None
        v["ratio_images_per_second"], v["ratio_per_cpu_second"] = r1, r2
        print("| {} | {:.1f} | {:.1f} | {} | {} |".format(b, v["images_per_second"], v["images_per_cpu_second"] or 0,
                                                      "{:.2f}".format(r1) if r1 else "-",
                                                      "{:.2f}".format(r2) if r2 else "-"))
    return out


def examples_epoch(root, arch, batch, workers, device, synthetic=False):
    """One epoch the way pytorch/examples' imagenet/main.py trains (float32), images/s after 5 steps; with
    ``synthetic``, as many steps on one random batch made once (the model's cost alone)."""
    import models
    loader = torchvision_loader(root, "train", batch, workers)
    classes = len(loader.dataset.classes)
    if synthetic:
        g = torch.Generator().manual_seed(0)
        loader = [(torch.randn(batch, 3, 224, 224, generator=g), torch.randint(0, classes, (batch,), generator=g))
                  ] * len(loader)
    model = models.get_model(arch, num_classes=classes).to(device.torch_device)
    criterion = torch.nn.CrossEntropyLoss().to(device.torch_device)
    opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    t0, n = None, 0
    for i, (images, target) in enumerate(loader):
        if i == 5:
            device.synchronize()
            t0, n = time.perf_counter(), 0
        images, target = device.move(images), device.move(target)
        output = model(images)
        loss = criterion(output, target)
        _, pred = output.topk(5, 1, True, True)
        pred.t().eq(target.view(1, -1)).float().sum()
        loss.item()  # AverageMeter.update(loss.item(), ...) in examples
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += images.shape[0]
    device.synchronize()
    return n / (time.perf_counter() - t0)


def trainer_epoch(root, arch, batch, workers, device_kind, synthetic=False, env=None, peak=None):
    """main.py's images/s over one epoch from the JPEGs; with ``synthetic``, as many steps of --dummy. ``env``:
    variables added to main.py's environment; ``peak``: a list that gets main.py's peak resident MiB."""
    out = tempfile.mkdtemp(prefix="bench-epoch-")
    source = [root]
    if synthetic:
        jpegs = torchvision_loader(root, "train", batch, 0)
        source = ["--dummy", "--num-classes", str(len(jpegs.dataset.classes)), "--max-steps-per-epoch", str(len(jpegs))]
    cmd = [sys.executable, os.path.join(ROOT, "main.py")] + source + ["-a", arch, "--epochs", "1", "-b", str(batch),
           "-j", str(workers), "--no-validate", "--device", device_kind, "--output-dir", out, "--progress", "lines",
           "--no-tensorboard", "-p", "1000", "--fps-warmup-steps", "5", "--seed", "0"]
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, **(env or {})))
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak resident memory
        proc.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1  # reaped here, not by Popen
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit("main.py failed: " + err.read()[-2000:])
    if peak is not None:
        peak.append(usage.ru_maxrss / 1024.0)  # KiB on Linux
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["train_fps"]


def decoder_threads(root, device, batch, rounds=3):
    """(seconds for one thread to decode a batch of ``root``'s train files with the device's decoder, seconds
    for two threads to decode it once each, at once); best of ``rounds``."""
    import threading
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "train")) for f in fs)[:batch]
    raws = [torch.frombuffer(bytearray(datamod.read_bytes(f)), dtype=torch.uint8) for f in files]
    decode = device.jpeg_decoder()
    if decode is None:
        raise SystemExit(device.jpeg_decoder_missing())

    def work():
        decode(raws)
        device.synchronize()
    work()  # warm-up (decoder start-up)
    one = two = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        work()
        one = min(one, time.perf_counter() - t0)
        threads = [threading.Thread(target=lambda: (device.bind_thread(), work())) for _ in range(2)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        two = min(two, time.perf_counter() - t0)
    return one, two


def decode_ahead_epoch(root, arch, batch, workers, device_kind, ahead, amp=False, steps=None):
    """(images/s, data-time fraction) of one main.py epoch with the device backend, its next batch prepared
    in a thread (``ahead``) or on the training thread; ``amp``: with --amp --channels-last; ``steps``: at
    most that many steps."""
    from tools.check_device import train_in_process
    out = tempfile.mkdtemp(prefix="bench-ahead-")
    extra = ["--amp", "--channels-last"] if amp else []
    if steps is not None:
        extra += ["--max-steps-per-epoch", str(steps)]
    code, s, _ = train_in_process(os.path.join(out, "run"), [
        root, "-a", arch, "--epochs", "1", "-b", str(batch), "-j", str(workers), "--no-validate", "--device",
        device_kind, "--data-backend", "gpu", "-p", "1000", "--fps-warmup-steps", "5", "--seed", "0"] + extra,
        batched=False, decode_ahead=ahead)
    if code != 0 or s.get("status") != "ok":
        raise SystemExit("main.py failed: see {}".format(os.path.join(out, "run.log")))
    return s["train_fps"], s.get("data_time_fraction")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--backend", choices=("all", "cpu", "gpu", "torchvision"), default="all")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--split", choices=("train", "val"), default="train")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--epoch-vs-examples", action="store_true")
    p.add_argument("--arch", default="shufflenet_v2_x0_5")
    p.add_argument("--synthetic", action="store_true",
                   help="with --epoch-vs-examples: also both loops on synthetic data (the model's cost alone)")
    p.add_argument("--host-memory", action="store_true",
                   help="main.py epochs with the trainer's host-memory setting and with glibc's own, alternating")
    p.add_argument("--decode-ahead", action="store_true",
                   help="main.py epochs with --data-backend gpu, the next batch decoded beside the step or not")
    p.add_argument("--amp", action="store_true", help="with --decode-ahead: train with --amp --channels-last")
    p.add_argument("--steps", type=int, default=None, help="with --decode-ahead: at most N steps per epoch")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if (a.amp or a.steps is not None) and not a.decode_ahead:
        p.error("--amp and --steps go with --decode-ahead")
    if a.steps is not None and a.steps < 1:
        p.error("--steps must be at least 1")
    if sum((a.epoch_vs_examples, a.decode_ahead, a.host_memory)) > 1:
        p.error("choose one of --epoch-vs-examples, --decode-ahead and --host-memory")
    if a.host_memory and user_allocator_choice():
        p.error("--host-memory compares the trainer's setting with glibc's own: unset LD_PRELOAD and MALLOC_*")
    if not (a.epoch_vs_examples or a.decode_ahead or a.host_memory):
        # The loader's consumer (normalisation) runs in this process with one thread, as DataLoader workers
        # do: OpenMP threads spinning here would otherwise be counted as the pipeline's CPU time.
        torch.set_num_threads(1)
    device = Device.create(a.device)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "device": device.name,
            "torch": torch.__version__, "workers": a.workers, "batch_size": a.batch_size, "data": a.data}
    print("device {}, {} CPUs, {} workers, batch {}".format(device.name, os.cpu_count(), a.workers, a.batch_size))
    if a.epoch_vs_examples:
        res = {}
        names = ["examples", "trainer"] + (["examples-synthetic", "trainer-synthetic"] if a.synthetic else [])
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                synthetic = name.endswith("-synthetic")
                fps = examples_epoch(a.data, a.arch, a.batch_size, a.workers, device, synthetic) \
                    if name.startswith("examples") else \
                    trainer_epoch(a.data, a.arch, a.batch_size, a.workers, device.kind, synthetic)
                res.setdefault(name, []).append(fps)
                print("round {} {:<18} {:8.1f} images/s".format(r, name, fps), flush=True)
        mean = {k: sum(v) / len(v) for k, v in res.items()}
        result = {"epoch": {"arch": a.arch, "images_per_second": mean, "runs": res,
                            "ratio": mean["trainer"] / mean["examples"]}}
        print("trainer / examples: {:.2f}".format(result["epoch"]["ratio"]))
        if a.synthetic:
            # per image: the model's time (synthetic) and what the JPEGs add to it (the data's CPU time, taken
            # from the cores the model runs on)
            ms = {k: 1000.0 / v for k, v in mean.items()}
            data_ms = {k: ms[k] - ms[k + "-synthetic"] for k in ("examples", "trainer")}
            result["epoch"]["ms_per_image"], result["epoch"]["data_ms_per_image"] = ms, data_ms
            for k in ("examples", "trainer"):
                print("{:<9} {:6.2f} ms per image: model {:6.2f} + data {:5.2f}".format(
                    k, ms[k], ms[k + "-synthetic"], data_ms[k]))
    elif a.host_memory:
        runs = {"kept": [], "glibc": []}
        for r in range(a.rounds):
            for name in (("kept", "glibc") if r % 2 == 0 else ("glibc", "kept")):
                peak = []
                fps = trainer_epoch(a.data, a.arch, a.batch_size, a.workers, device.kind,
                                    env={"MALLOC_PERTURB_": "0"} if name == "glibc" else None, peak=peak)
                runs[name].append({"images_per_second": fps, "peak_mib": peak[0]})
                print("round {} host memory {:<6} {:8.1f} images/s, peak {:7.0f} MiB".format(r, name, fps, peak[0]),
                      flush=True)
        mean = {k: sum(x["images_per_second"] for x in v) / len(v) for k, v in runs.items()}
        result = {"host_memory": {"arch": a.arch, "runs": runs, "images_per_second": mean,
                                  "ratio": mean["kept"] / mean["glibc"]}}
        print("kept / glibc: {:.2f}".format(result["host_memory"]["ratio"]))
    elif a.decode_ahead:
        one, two = decoder_threads(a.data, device, a.batch_size)
        print("decoder: one thread {:.3f} s per batch, two threads a batch each {:.3f} s ({:.2f}x the time "
              "for twice the work)".format(one, two, two / one), flush=True)
        runs = {"thread": [], "training-thread": []}
        for r in range(a.rounds):
            for ahead in ((True, False) if r % 2 == 0 else (False, True)):
                name = "thread" if ahead else "training-thread"
                fps, waiting = decode_ahead_epoch(a.data, a.arch, a.batch_size, a.workers, device.kind, ahead,
                                                  a.amp, a.steps)
                runs[name].append({"images_per_second": fps, "data_time_fraction": waiting})
                print("round {} decode on the {:<15} {:8.1f} images/s, {:.1%} waiting for data".format(
                    r, name, fps, waiting or 0.0), flush=True)
        mean = {k: sum(x["images_per_second"] for x in v) / len(v) for k, v in runs.items()}
        result = {"decode_ahead": {"arch": a.arch, "runs": runs, "images_per_second": mean,
                                   "decoder_seconds": {"one_thread": one, "two_threads_twice_the_work": two},
                                   "ratio": mean["thread"] / mean["training-thread"]}}
        print("thread / training thread: {:.2f}".format(result["decode_ahead"]["ratio"]))
    else:
        result = {"loader": loader_bench(a, device), "split": a.split, "images": a.images}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(result, meta=meta), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
