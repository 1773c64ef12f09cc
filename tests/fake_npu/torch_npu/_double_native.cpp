// FAKE torch_npu, test-only: the C++ part of the device double (torch_npu/_double.py builds it with
// torch.utils.cpp_extension at its first import under a torch release and keeps the build).
//
// * A PrivateUse1 DeviceGuardImplInterface: the autograd engine sizes its device threads by the guards'
//   deviceCount(), and torch's Python-registered guard (torch 2.14: torch._C._acc) answers 1, so a backward on
//   npu:1 would fail; torch 2.1 has no Python registration at all.
// * torch >= 2.3: PrivateUse1 hooks that pin host memory with the CPU allocator (the DataLoader pins for the
//   current accelerator; the Python hooks of torch._C._acc have no pinned allocator).
// * torch 2.1: aten::empty.memory_format and aten::empty_strided for PrivateUse1. A Python kernel registered
//   through torch.library cannot create a tensor subclass there (it runs as a hermetic PyObject), so these C++
//   kernels allocate the host tensor and hand it to the Python factory that wraps it as a tensor on npu:N. Also
//   pinning for the device (a host copy) and the autograd fallthrough that torch 2.1 has for its own devices only.
// * Autocast for the device (AutocastPrivateUse1), as torch_npu registers it: torch's op lists for CUDA where this
//   torch has them as lists (AT_FORALL_LOWER_PRECISION_FP, ...), else the matrix products and convolutions in the
//   lower precision and the losses and softmaxes in float32; torch 2.1 also gets the autocast state functions that
//   torch.autocast asks the device module for.
// * DDP's timer for the device (c10d::TimerRegistry), as torch_npu registers its NpuTimer: without one DDP's logger
//   warns "Time stats are currently only collected for CPU and CUDA devices" on every rank. Like torch_npu's, it
//   measures only under TORCH_DISTRIBUTED_DEBUG=DETAIL; the host's timestamps are the device's (one in-order host
//   "stream").
// * settle_autograd_threads, run at exit (below).
#include <atomic>
#include <chrono>
#include <thread>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/extension.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define FAKE_NPU_HOOKS 1
#include <ATen/detail/PrivateUse1HooksInterface.h>
#endif

// DDP's timer for the device (registered in c10d, as torch_npu registers its own)
namespace c10d {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
using TimeDifference = std::optional<int64_t>;
#else
using TimeDifference = c10::optional<int64_t>;
#endif

struct NpuTimer final : public c10d::Timer {
  explicit NpuTimer(c10::Device) {}
  TimeDifference measureDifference(Event start, Event end) override {
    if (c10d::debug_level() != c10d::DebugLevel::Detail) return TimeDifference();
    auto start_time = getTimestamp(start);
    auto end_time = getTimestamp(end);
    if (!start_time || !end_time || *end_time < *start_time) return TimeDifference();
    return TimeDifference(*end_time - *start_time);
  }
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, NpuTimer);

}  // namespace
}  // namespace c10d

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

std::atomic<int> g_count{8};
thread_local DeviceIndex g_current = 0;

// Whether an autograd device thread has run (the engine's threads set their NPU as they take a task).
std::atomic<bool> g_device_threads_ran{false};

struct NpuGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    uncheckedSetDevice(d);
    return old;
  }
  Device getDevice() const override { return Device(DeviceType::PrivateUse1, g_current); }
  void setDevice(Device d) const override {
    uncheckedSetDevice(d);
    g_device_threads_ran = true;
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    if (d.index() >= 0) g_current = d.index();
  }
  Stream getStream(Device d) const noexcept override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const noexcept override { return s; }
  DeviceIndex deviceCount() const noexcept override { return static_cast<DeviceIndex>(g_count.load()); }
  // One in-order host "stream": events are complete as soon as recorded.
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuard);

#ifdef FAKE_NPU_HOOKS
struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return static_cast<DeviceIndex>(g_count.load()); }
  at::Allocator* getPinnedMemoryAllocator() const override { return at::getCPUAllocator(); }
  const at::Generator& getDefaultGenerator(DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void*) const override { return Device(DeviceType::PrivateUse1, g_current); }
};
#endif

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3
py::object* g_factory = nullptr;  // torch_npu._double._from_native(host_tensor, index), set by set_factory

DeviceIndex index_of(c10::optional<Device> device) {
  return device.has_value() && device->has_index() ? device->index() : g_current;
}

at::Tensor wrap(const at::Tensor& host, DeviceIndex index) {
  TORCH_CHECK(g_factory != nullptr, "fake torch_npu: the device double is not set up");
  py::gil_scoped_acquire gil;
  return (*g_factory)(host, static_cast<int>(index)).cast<at::Tensor>();
}

at::Tensor empty_memory_format(at::IntArrayRef size, c10::optional<at::ScalarType> dtype,
                               c10::optional<at::Layout> layout, c10::optional<Device> device,
                               c10::optional<bool> pin_memory, c10::optional<at::MemoryFormat> memory_format) {
  auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  return wrap(at::empty(size, options, memory_format), index_of(device));
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, c10::optional<at::ScalarType> dtype,
                         c10::optional<at::Layout> layout, c10::optional<Device> device,
                         c10::optional<bool> pin_memory) {
  auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  return wrap(at::empty_strided(size, stride, options), index_of(device));
}

// Pinned host memory for the device (the DataLoader's pin_memory_device="npu") is host memory.
at::Tensor pin_memory(const at::Tensor& self, c10::optional<Device> device) { return self.clone(); }

bool is_pinned(const at::Tensor& self, c10::optional<Device> device) { return false; }

// Ops without an autograd formula (the c10d collectives) go below autograd, as torch >= 2.3 does for PrivateUse1
// and torch 2.1 for its own devices.
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_pin_memory", pin_memory);
  m.impl("is_pinned", is_pinned);
}
#endif

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#ifdef AT_FORALL_LOWER_PRECISION_FP
using namespace at;  // the op lists name ATen's types unqualified

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define FAKE_NPU_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(FAKE_NPU_LOWER)
#define FAKE_NPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(FAKE_NPU_FP32)
#define FAKE_NPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(FAKE_NPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define FAKE_NPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(FAKE_NPU_PROMOTE)
}
#else
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(conv1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv3d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv_transpose1d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE2(conv_transpose2d, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE2(conv_transpose3d, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmv, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(mv, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(prelu, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(layer_norm, fp32)
  KERNEL_PRIVATEUSEONE(group_norm, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss2d, fp32)
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(smooth_l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(kl_div, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  KERNEL_PRIVATEUSEONE2(softmax, int, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE2(log_softmax, int, fp32_set_opt_dtype)
}
#endif

}  // namespace

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3
// torch.autocast("npu") asks the device module for these (torch_npu: torch_npu/npu/autocast_utils.py over its C++).
// A dtype crosses as an empty tensor of that dtype (torch 2.1 has no pybind caster for ScalarType).
bool autocast_enabled() { return at::autocast::is_privateuseone_enabled(); }
void set_autocast_enabled(bool enabled) { at::autocast::set_privateuseone_enabled(enabled); }
at::Tensor autocast_dtype() { return at::empty({0}, at::TensorOptions().dtype(at::autocast::get_autocast_privateuseone_dtype())); }
void set_autocast_dtype(const at::Tensor& like) { at::autocast::set_autocast_privateuseone_dtype(like.scalar_type()); }
#endif

// count: the number of NPUs the double shows. factory: the Python wrapper factory (used on torch 2.1 only).
void setup(int64_t count, py::object factory) {
  g_count = static_cast<int>(count);
#ifdef FAKE_NPU_HOOKS
  static NpuHooks hooks;
  if (!at::isPrivateUse1HooksRegistered()) at::RegisterPrivateUse1HooksInterface(&hooks);
#endif
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3
  if (g_factory == nullptr) g_factory = new py::object(factory);  // kept for the life of the process
#endif
}

void set_current(int64_t index) { g_current = static_cast<DeviceIndex>(index); }

// At exit, before Python finalizes: the GIL left free for a moment where the autograd engine's device threads have
// run. A device thread drops its last graph task just after backward() has returned, and the task's thread-local
// state holds Python objects (torch 2.14 keeps the caller's contextvars there); a thread that takes the GIL for them
// while Python finalizes ends in std::terminate. (Stopping the threads instead wakes the idle ones into the same
// race.)
void settle_autograd_threads() {
  if (!g_device_threads_ran) return;
  py::gil_scoped_release no_gil;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}
