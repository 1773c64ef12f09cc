"""FAKE torch_npu.distributed (test-only): the "hccl" backend, backed by Gloo on the CPU.

Real: ``import torch_npu`` calls ``torch.distributed.Backend.register_backend("hccl", ...,
extended_api=True, devices=["npu"])`` (and "lccl"), so ``dist.init_process_group(backend="hccl")``
works by name, and sets ``torch.distributed.is_hccl_available`` (2.14.0:
torch_npu/_init/registry/distributed.py:37-53, _init/patches/distributed_patches.py:44-46;
2.1.0.post17: torch_npu/__init__.py:229-243 and :170). The fake registers
"hccl" for the devices "npu" and "cpu" (its tensors are CPU tensors) and records each process
group it creates as ("hccl.new_group", rank, size). ``HCCL_IF_IP`` (the host address HCCL's links use where a
host has several) binds the Gloo group's sockets to that address.
"""
import os

import torch.distributed as dist

import torch_npu


def is_available():
    return dist.is_available()


def _new_process_group_hccl(dist_backend_opts, pg_options):
    torch_npu._record("hccl.new_group", dist_backend_opts.group_rank, dist_backend_opts.group_size)
    address = os.environ.get("HCCL_IF_IP")
    if address:  # HCCL's host address for its links (several interfaces): Gloo's device bound to it
        options = dist.ProcessGroupGloo._Options()
        options._timeout = dist_backend_opts.timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
        options._threads = 2
        return dist.ProcessGroupGloo(dist_backend_opts.store, dist_backend_opts.group_rank,
                                     dist_backend_opts.group_size, options)
    pg = dist.ProcessGroupGloo(dist_backend_opts.store, dist_backend_opts.group_rank,
                               dist_backend_opts.group_size, timeout=dist_backend_opts.timeout)
    return pg


def _register_hccl():
    if not dist.is_available():
        return
    if "HCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("hccl", _new_process_group_hccl, extended_api=True,
                                      devices=["npu", "cpu"])
    if not hasattr(dist, "is_hccl_available"):
        dist.is_hccl_available = lambda: True
