"""FAKE torch_npu, test-only: the device double. Tensors on ``npu:N`` are tensors of torch's npu device (PrivateUse1,
renamed "npu" as torch_npu does) whose data is a host tensor; every op on them runs on those host tensors.

* ``NpuTensor`` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``): its device is ``npu:N``, its
  ``_data`` the CPU tensor behind it. ``__torch_dispatch__`` runs each aten op on the held CPU tensors and wraps new
  results on the same device. Views share the held storage, so in-place ops reach every view, as on a device.
* Tensors get onto the device through the PrivateUse1 kernels of ``aten::empty.memory_format`` and
  ``aten::empty_strided`` (``.to("npu:0")``, ``torch.zeros(..., device="npu")``, the allocations of C++ code such
  as DDP's gradient buckets): ``torch.library`` kernels on torch >= 2.3; C++ kernels on torch 2.1, where a Python
  kernel may not create a tensor subclass (``_double_native.cpp``).
* As on an NPU: an op with a device tensor and a host tensor that is not a 0-dim scalar, or with tensors of two
  NPUs, raises torch's "Expected all tensors to be on the same device" error (copies between the devices excepted,
  and host index tensors of indexing ops, which torch's accelerators accept).
* Every op whose result needs the device's data on the host is counted in ``torch_npu.d2h_copies`` (by kind in
  ``torch_npu.d2h_ops``), as each waits for the device's queue: the copies (``.cpu()`` / ``.to("cpu")``, a host
  tensor's ``copy_`` from the device, printing, pickling, ``.tolist()``); the ops torch tags as giving a Python scalar
  (``.item()`` and with it ``float()``, ``int()``, ``bool()``, ``is_nonzero``, ``f"{t:.3f}"`` of a 0-dim tensor,
  ``torch.allclose``; ``torch.equal``) or an output shape that depends on the data (``nonzero``, ``masked_select``,
  ``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``, ...), and indexing with a boolean mask
  (``loss[mask]``, ``t[mask] = v`` for a tensor ``v``: the device turns the mask into indices with ``nonzero``).
* ``torch.save`` writes a device tensor as its host copy, so a checkpoint loads as CPU tensors anywhere.
* Collectives (``c10d`` ops) run on the held host tensors: the fake "hccl" process group is Gloo's.
* A PrivateUse1 device guard, DDP's timer for the device (torch_npu registers one; without it DDP warns that time
  stats are only collected for CPU and CUDA) and, on torch >= 2.3, PrivateUse1 hooks with a pinned-memory allocator
  come from ``_double_native.cpp``, built with ``torch.utils.cpp_extension`` at the first import under a torch
  release and kept in ``$FAKE_NPU_BUILD_DIR`` (default ``<tmp>/fake_npu_native-<uid>``). Without a C++ compiler the
  double is off (``unavailable`` says why) and tensors cannot move to the fake device.
* Autocast is the device's own (``torch.autocast("npu")``, AutocastPrivateUse1 kernels from ``_double_native.cpp``):
  torch_npu.npu.amp.autocast casts device tensors; the host's (CPU) autocast never reaches the held tensors.
  float16 convolutions and matrix products run on float32 copies and give float16 (Ascend's cube unit accumulates
  in float32), and so does any op the CPU has no float16 kernel for (torch 2.1: norms, pooling, softmax).
* Ascend kernels that take int32 targets or indices (``nll_loss``, ``gather``) get them as int64 on the host.
* torch 2.1's gaps for a device of tensor subclasses, filled as later torch does: the autograd fallthrough for
  PrivateUse1 (c10d ops), ``isinstance(p, UninitializedParameter)`` (DDP), ``torch.overrides.get_buffer``.
"""

import atexit
import collections
import copy
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_npu
from torch_npu import _faults, _release

unavailable = None  # why the double is off (no C++ compiler, a failed build), else None
_native = None

aten = torch.ops.aten
_HOST = torch.device("cpu")

# ops that move data between the host and a device, or between two devices
_COPIES = {aten.copy_.default, aten._to_copy.default, aten._copy_from.default, aten._copy_from_and_resize.default}
for _name in ("copy", "_copy_from"):
    _op = getattr(aten, _name, None)
    if _op is not None and hasattr(_op, "default"):
        _COPIES.add(_op.default)
# the queries of a tensor's sizes and strides (dispatch_sizes_strides_policy="strides")
_METADATA = set()
for _name in ("size", "sym_size", "stride", "sym_stride", "numel", "sym_numel", "dim", "storage_offset",
              "sym_storage_offset", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense"):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        _METADATA.update(getattr(_packet, overload) for overload in _packet.overloads())
# ops whose index tensors may stay on the host (as CUDA's indexing accepts)
_HOST_INDICES = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default,
                 aten._index_put_impl_.default}

# Ops whose result needs the device's data on the host (each waits for the device's queue): those torch itself tags
# as giving a Python scalar read from a tensor (data_dependent_output: _local_scalar_dense, which .item(), float(),
# bool(), int(), is_nonzero and allclose end in; equal) or an output whose shape depends on the data
# (dynamic_output_shape: nonzero, masked_select, unique, bincount, ...). As torch's FakeTensor reads the same tags,
# indexing counts only with a boolean (or uint8) mask, which the device turns into indices with nonzero (index_put
# too, untagged), and repeat_interleave only without its output_size. The kind counted: the op's name.
_READ_TAGS = tuple(getattr(torch.Tag, name) for name in ("data_dependent_output", "dynamic_output_shape")
                   if hasattr(torch.Tag, name))
_KIND_OF = {"_local_scalar_dense": "item", "_unique": "unique", "_unique2": "unique", "index_put_": "index_put",
            "_index_put_impl_": "index_put"}
_READS = {}  # op -> the kind its host read is counted as ("" for none), filled as ops come
_REPEAT_INTERLEAVE = getattr(getattr(aten, "repeat_interleave", None), "Tensor", None)

# Ascend kernels take int32 targets and indices (the porting guide casts targets to int32) where torch's CPU kernels
# want int64: the position of such an argument, cast to int64 on the host before the CPU kernel runs.
_INT64_ARG = {}
for _name, _position in (("nll_loss_forward", 1), ("nll_loss_backward", 2), ("nll_loss2d_forward", 1),
                         ("nll_loss2d_backward", 2), ("gather", 2), ("scatter", 2), ("scatter_", 2),
                         ("scatter_add", 2), ("scatter_add_", 2)):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        _INT64_ARG.update((getattr(_packet, overload), _position) for overload in _packet.overloads())


# float16 convolutions and matrix products: computed in float32 and rounded to float16, as Ascend's cube unit
# accumulates float16 products in float32 (and torch's float16 CPU kernels are slow or missing)
_CUBE = set()
for _name in ("convolution", "convolution_backward", "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv"):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        _CUBE.update(getattr(_packet, overload) for overload in _packet.overloads())
# ops whose float16 CPU kernel is missing (torch 2.1's norms): computed in float32 from the first time one raised
# "not implemented for 'Half'" on (each raise costs milliseconds: torch 2.1 records the C++ stack)
_NO_HALF = set()
_NO_HOST_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _count_d2h(op):
    torch_npu.d2h_copies += 1
    torch_npu.d2h_ops[op] += 1


def _host_read(func, args, kwargs):
    """The kind of ``func``'s read of the device's data on the host (_READS), or None where the call reads none."""
    kind = _READS.get(func)
    if kind is None:
        name = func.overloadpacket.__name__
        read = func in _HOST_INDICES or any(tag in func.tags for tag in _READ_TAGS)
        kind = _READS[func] = _KIND_OF.get(name, name) if read else ""
    if not kind:
        return None
    if func in _HOST_INDICES:  # a mask, not integer indices
        masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        if not masks:
            return None
        # ``t[mask] = 0.0``: one mask on the device and a one-element host value, which torch's index_put turns
        # into masked_fill_ (canDispatchToMaskedFill), no read
        if func is not aten.index.Tensor and len(masks) == len([i for i in args[1] if i is not None]) == 1 \
                and isinstance(masks[0], NpuTensor) and args[2].numel() == 1 and not isinstance(args[2], NpuTensor) \
                and args[2].device.type == "cpu":
            return None
    elif func is _REPEAT_INTERLEAVE and kwargs.get("output_size") is not None:
        return None
    return kind


class NpuTensor(torch.Tensor):
    """A tensor on ``npu:N`` whose data is the host tensor ``_data``."""

    @staticmethod
    def __new__(cls, data, index):
        out = torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            layout=data.layout, device=torch.device("npu", index), requires_grad=False,
            dispatch_sizes_strides_policy="strides")
        out._data = data
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, **kwargs):
        _count_d2h("repr")
        text = repr(self._data)
        suffix = ", device='{}'".format(self.device)
        if self.requires_grad:
            suffix += ", requires_grad=True"
        if text.endswith(")"):
            return text[:-1] + suffix + ")"
        return text

    def tolist(self):
        _count_d2h("tolist")
        return self._data.tolist()

    def data_ptr(self):
        """The held tensor's address (a device tensor has one: tools such as msprobe skip tensors without)."""
        return self._data.data_ptr()

    def __deepcopy__(self, memo):
        # torch's Tensor.__deepcopy__ copies the storage of a subclass whose data_ptr() is not 0, and this wrapper's
        # storage is empty (its data is the held tensor): a clone, as torch copies the other wrapper subclasses, with
        # the grad flag, the gradient and the attributes (a parameter's ``_is_param``; not torch's cached strides,
        # ``_sym_strides_capsule``, which it makes again) copied too
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for name, value in self.__dict__.items():
            if name != "_data" and not name.startswith("_sym_"):
                setattr(new, name, copy.deepcopy(value, memo))
        memo[id(self)] = new
        return new

    def __format__(self, format_spec):
        # torch's Tensor.__format__ formats a 0-dim tensor's number (its item: one read) for plain tensors only, and
        # a device's tensors are plain tensors there
        if self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert {} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                        "memory first.".format(self.device))

    def __reduce_ex__(self, protocol):
        _count_d2h("save")
        host = self._data.clone()
        if self.requires_grad:
            host.requires_grad_(True)
        return host.__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:  # sizes and strides are the held tensor's (an out= op may resize it in place)
            return func(args[0]._data, *args[1:], **(kwargs or {}))
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        indices = sorted({t.device.index for t in flat if isinstance(t, NpuTensor)})
        copy = func in _COPIES
        if len(indices) > 1 and not copy:
            _mixed("npu:{}".format(indices[0]), "npu:{}".format(indices[1]))
        if not copy:
            host = [t for t in _host_args(func, args, kwargs) if isinstance(t, torch.Tensor)
                    and not isinstance(t, NpuTensor) and t.device.type == "cpu" and t.dim() > 0]
            if host:
                _mixed("npu:{}".format(indices[0]), "cpu")
        index = indices[0]
        out_device = kwargs.get("device")
        if out_device is not None:
            out_device = torch.device(out_device)
            if out_device.type == "npu":
                index = torch_npu.npu.current_device() if out_device.index is None else out_device.index
                kwargs = dict(kwargs, device=_HOST)
        if func is aten._to_copy.default and out_device is not None and out_device.type == "cpu":
            _count_d2h("to_cpu")
        elif func is aten.copy_.default and not isinstance(args[0], NpuTensor):
            _count_d2h("copy_to_host")
        elif func is aten._copy_from.default and not isinstance(args[1], NpuTensor):
            _count_d2h("copy_to_host")
        else:
            read = _host_read(func, args, kwargs)
            if read is not None:
                _count_d2h(read)
        given = {}

        def unwrap(t):
            if isinstance(t, NpuTensor):
                given[id(t._data)] = t
                return t._data
            if isinstance(t, torch.Tensor):
                given[id(t)] = t
            return t

        host_args, host_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        position = _INT64_ARG.get(func)
        if position is not None and len(host_args) > position and isinstance(host_args[position], torch.Tensor) \
                and host_args[position].dtype == torch.int32:
            host_args = host_args[:position] + (host_args[position].long(),) + host_args[position + 1:]
        with torch._C._ExcludeDispatchKeyGuard(_NO_HOST_AUTOCAST):  # the device's autocast already decided
            if (func in _CUBE or func in _NO_HALF) and any(isinstance(t, torch.Tensor) and t.dtype == torch.float16
                                                          for t in host_args):
                result = _in_float32(func, host_args, host_kwargs)
            else:
                try:
                    result = func(*host_args, **host_kwargs)
                except (RuntimeError, NotImplementedError) as exc:
                    if "not implemented for 'Half'" not in str(exc):
                        raise
                    _NO_HALF.add(func)
                    result = _in_float32(func, host_args, host_kwargs)
        if out_device is not None and out_device.type != "npu":
            return result
        result = _faults.corrupt(func, result)

        def wrap(t):
            if not isinstance(t, torch.Tensor):
                return t
            known = given.get(id(t))
            if known is not None:
                return known
            return NpuTensor(t, index)

        return tree_map(wrap, result)


def _in_float32(func, args, kwargs):
    """``func`` where the CPU has no float16 kernel (torch 2.1's convolutions, matrix products, norms) and the NPU
    has one: computed on float32 copies, float16 again where every floating input was float16; a mutated argument
    gets the result back."""
    copies = {}

    def up(t):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
            f = t.float()
            copies[id(f)] = (f, t)
            return f
        return torch.float32 if t is torch.float16 else t  # a dtype argument (``input_dtype`` of a backward)

    floating = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    all_half = all(t.dtype == torch.float16 for t in floating)
    # a float16 input with float32 parameters (a norm of apex O2's model, whose norms stay float32): the first
    # result (the output, or the input's gradient) follows the input, the others (statistics, the parameters'
    # gradients) stay float32, as the device's mixed kernels give them
    input_half = bool(floating) and floating[0].dtype == torch.float16
    result = func(*tree_map(up, args), **tree_map(up, kwargs))
    if func._schema.is_mutable:
        for f, t in copies.values():
            t.copy_(f)
    first = tree_flatten(result)[0][:1]

    def down(r):
        if isinstance(r, torch.Tensor):
            if id(r) in copies:
                return copies[id(r)][1]
            if r.dtype == torch.float32 and (all_half or (input_half and first and r is first[0])):
                return r.half()
        return r

    return tree_map(down, result)


def _host_args(func, args, kwargs):
    """The tensors of an op that must be on its device (indexing ops: not the indices)."""
    if func in _HOST_INDICES:
        return [args[0]] + list(args[2:]) if func is not aten.index.Tensor else [args[0]]
    return tree_flatten((args, kwargs))[0]


def _mixed(a, b):
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, {} and {}!"
                       .format(a, b))


def _from_native(host, index):
    """The C++ factory's callback (torch 2.1): the host tensor it allocated, on ``npu:index``."""
    return NpuTensor(host, index)


def _index_of(device):
    if device is None or torch.device(device).index is None:
        return torch_npu.npu.current_device()
    return torch.device(device).index


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return NpuTensor(torch.empty_strided(size, stride, dtype=dtype, device=_HOST), _index_of(device))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return NpuTensor(torch.empty(size, dtype=dtype, device=_HOST,
                                 memory_format=memory_format or torch.contiguous_format), _index_of(device))


_library = None


def _parameter_check_of_torch_2_2():
    """torch 2.1's ``isinstance(p, UninitializedParameter)`` holds for every parameter that is a tensor subclass (its
    ``_ParameterMeta`` answers for the subclasses of Parameter too), and DDP refuses such modules: the check of torch
    >= 2.2, where only ``Parameter`` itself looks at the ``_is_param`` flag."""
    meta = type(torch.nn.Parameter)
    base = torch._C._TensorMeta.__instancecheck__

    def __instancecheck__(self, instance):
        if self is torch.nn.Parameter and isinstance(instance, torch.Tensor) and getattr(instance, "_is_param", False):
            return True
        return base(self, instance)

    meta.__instancecheck__ = __instancecheck__


def _get_buffer(tensor_subclass, data, prefix):
    """torch 2.1's C++ reads the sizes and strides of a tensor subclass with dispatch_sizes_strides_policy through
    ``torch.overrides.get_buffer``, which its Python lacks (torch 2.2 has it): (address, length) of an int64 array
    kept on the tensor. A new array when the values changed (an in-place resize); the old ones stay alive."""
    import ctypes
    name = "_{}_buffers".format(prefix)
    kept = tensor_subclass.__dict__.setdefault(name, [])
    values = [int(v) for v in data]
    if not kept or list(kept[-1]) != values:
        kept.append((ctypes.c_longlong * len(values))(*values))
    return ctypes.addressof(kept[-1]), len(values)


def _register_python_kernels():
    global _library
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty_strided", _empty_strided, "PrivateUse1")
    _library.impl("empty.memory_format", _empty, "PrivateUse1")


# ---- the C++ part ---------------------------------------------------------------------------------------------

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_double_native.cpp")


def build_dir():
    return os.environ.get("FAKE_NPU_BUILD_DIR") or os.path.join(
        tempfile.gettempdir(), "fake_npu_native-{}".format(os.getuid() if hasattr(os, "getuid") else "user"))


def _module_name():
    with open(_SOURCE, "rb") as f:
        key = hashlib.sha1(f.read() + torch.__version__.encode() + sys.version.encode()).hexdigest()[:12]
    return "fake_npu_native_" + key


def _load_native():
    """The extension module: loaded from the kept build, else built (in a folder of its own, then moved into place,
    so that processes building at the same time never load a half-written library)."""
    name = _module_name()
    root = build_dir()
    path = os.path.join(root, name + ".so")
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        work = tempfile.mkdtemp(prefix=name + "-", dir=root)
        try:
            from torch.utils import cpp_extension
            with open(_SOURCE) as f:
                source = f.read()
            functions = ["setup", "set_current", "settle_autograd_threads"]
            if _release.V2_1:
                functions += ["autocast_enabled", "set_autocast_enabled", "autocast_dtype", "set_autocast_dtype"]
            cpp_extension.load_inline(name, cpp_sources=[source], functions=functions, build_directory=work,
                                      verbose=False)
            os.replace(os.path.join(work, name + ".so"), path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def native():
    """The C++ part (``setup`` built it); RuntimeError with the reason where it is off."""
    if _native is None:
        raise RuntimeError("fake torch_npu: " + (unavailable or "the device double is not set up"))
    return _native


def set_current(index):
    """torch.npu.set_device: the guard's current device follows."""
    if _native is not None:
        _native.set_current(int(index))


def setup():
    """Build or load the C++ part and register the device's kernels; sets ``unavailable`` when that fails."""
    global _native, unavailable
    if _native is not None or unavailable is not None:
        return
    try:
        _native = _load_native()
    except Exception as exc:  # no compiler, no ninja: the fake works as before, without device tensors
        lines = [line for line in str(exc).splitlines() if "error" in line] or [type(exc).__name__]
        unavailable = "the device double's C++ part does not build here: {}".format(lines[0].strip()[-300:])
        return
    _native.setup(max(torch_npu.npu.device_count(), 1), _from_native)
    _native.set_current(torch_npu.npu.current_device())
    atexit.register(_native.settle_autograd_threads)
    if _release.V2_1:
        _parameter_check_of_torch_2_2()
        if not hasattr(torch.overrides, "get_buffer"):
            torch.overrides.get_buffer = _get_buffer
    else:
        _register_python_kernels()


torch_npu.d2h_copies = 0
torch_npu.d2h_ops = collections.Counter()
