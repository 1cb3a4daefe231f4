// The C++ piece of torch_tpu: what torch will not take from Python.
//
// - the device allocator is memory.cpp's (identities, sizes and the memory accounting);
// - the metadata kernels (empty, views, resize_, set_) registered from at::native;
// - a generator (seed + offset, consumed by the Python random lowerings);
// - the device guard and the PrivateUse1 hooks (pinned memory, generators, resize);
// - the Python module _C, whose other functions come from dispatch.cpp (the boxed op
//   kernel, attention backend, autocast rules), memory.cpp, scan.cpp, scan_graph.cpp,
//   graph.cpp, kernel.cpp and direct.cpp.
#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>

#include "device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torch_tpu {

constexpr c10::DeviceType kTPU = c10::DeviceType::PrivateUse1;

// ---------------------------------------------------------------- this process's devices
// Under a launcher (torchrun, Slurm, a process group joined before the start) one process
// drives one device: tpu:{LOCAL_RANK} of LOCAL_WORLD_SIZE, as CUDA scripts expect
// (`set_device(local_rank)`, `device_ids=[local_rank]`, device-count guards); tpu:0 is
// another name for it, so code that puts everything on tpu:0 in every process (the
// TorchTPU idiom) runs too, and tensors made through either name share one device. Every
// tpu tensor reports the process's own index. Read once when the module loads, before any
// storage exists (docs/DEVICES.md has the why).
//
// A process alone with several local devices drives them all, as a CUDA process does
// (set_multi): tpu:0..g_count-1 are distinct, and the current device is per thread
// (t_device), set by the device guard and by each op for its duration (kernel.cpp).
c10::DeviceIndex g_index = 0;
c10::DeviceIndex g_count = 1;
bool g_multi = false;
bool g_other_devices = false;
thread_local c10::DeviceIndex t_device = 0;

void make_current(c10::DeviceIndex d) {  // (several devices: d checked)
  t_device = d;
  if (d != 0) g_other_devices = true;
}

void init_local_device() {
  const char* rank = std::getenv("LOCAL_RANK");
  const char* size = std::getenv("LOCAL_WORLD_SIZE");
  if (rank == nullptr || size == nullptr) return;
  const long r = std::strtol(rank, nullptr, 10), n = std::strtol(size, nullptr, 10);
  if (n < 1 || r < 0 || r >= n || n > 1024) return;
  g_index = static_cast<c10::DeviceIndex>(r);
  g_count = static_cast<c10::DeviceIndex>(n);
}

c10::DeviceIndex current_index() { return g_multi ? t_device : g_index; }
c10::Device own_device() { return c10::Device(kTPU, current_index()); }

// Whether a device index names a device of this process; the message says what does.
bool own_index(c10::DeviceIndex d) {
  if (g_multi) return d >= -1 && d < g_count;
  return d == -1 || d == 0 || d == g_index;
}

std::string index_error(c10::DeviceIndex d) {
  if (g_multi)
    return "Invalid device tpu:" + std::to_string(int(d)) + ": this process has " +
           std::to_string(int(g_count)) + " tpu devices, tpu:0 to tpu:" + std::to_string(int(g_count) - 1);
  std::string own = "tpu:" + std::to_string(int(g_index));
  std::string msg = "Invalid device tpu:" + std::to_string(int(d)) + ": this process drives " + own;
  if (g_count > 1) {
    msg += " (local rank " + std::to_string(int(g_index)) + " of " + std::to_string(int(g_count)) +
           " under torchrun; tpu:0 names it too). ";
    msg += d < g_count ? "tpu:" + std::to_string(int(d)) + " belongs to local rank " + std::to_string(int(d)) +
                             ", another process: each process reaches only its own device"
                       : "No process of this job has tpu:" + std::to_string(int(d));
  } else {
    msg += " (one process per device: launch one process per device with torchrun, each sees its own)";
  }
  return msg;
}

void check_index(c10::DeviceIndex d) { TORCH_CHECK(own_index(d), index_error(d)); }

// Make `d` this thread's current device (several devices per process; else only checked).
void set_current(c10::DeviceIndex d) {
  check_index(d);
  if (g_multi && d >= 0) make_current(d);
}

// This thread's current device for the duration of a scope (an allocation on a given
// device, an op on its inputs' device).
DeviceScope::DeviceScope(c10::DeviceIndex d) : prev_(t_device) {
  if (g_multi && d >= 0) make_current(d);
}
DeviceScope::~DeviceScope() { t_device = prev_; }

// ---------------------------------------------------------------- the device allocator
c10::Allocator* device_allocator();               // memory.cpp
bool is_realized(const c10::Storage& storage);    // memory.cpp: its bytes count as allocated
void mark_realized(const c10::Storage& storage);  // memory.cpp: they do from now on
void add_memory_functions(PyObject* module);      // memory.cpp: the accounting, fork

// ---------------------------------------------------------------- pinned host memory
std::mutex g_pinned_mu;
std::unordered_map<void*, size_t> g_pinned;  // live pinned blocks and their sizes
at::HostStats g_pinned_stats;               // (g_pinned_mu)

void pinned_delete(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    auto it = g_pinned.find(ptr);
    if (it != g_pinned.end()) {
      g_pinned_stats.active_requests.decrease(1);
      g_pinned_stats.active_bytes.decrease(it->second);
      g_pinned_stats.allocations.decrease(1);
      g_pinned_stats.allocated_bytes.decrease(it->second);
      ++g_pinned_stats.num_host_free;
      g_pinned.erase(it);
    }
  }
  std::free(ptr);
}

// Host memory the device copies from; on XLA:CPU nothing is faster than plain
// aligned memory, but tensors must report is_pinned() and survive DataLoader workers.
// It is torch's host allocator for tpu (torch.accelerator.empty_host_cache and
// host_memory_stats ask it): no cache (every block is freed when its tensor dies), no
// event to record (a copy from it is done when the copy returns).
struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      ptr = std::aligned_alloc(64, ((nbytes + 63) / 64) * 64);
      TORCH_CHECK(ptr, "pinned allocation of ", nbytes, " bytes failed");
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned.emplace(ptr, nbytes);
      g_pinned_stats.active_requests.increase(1);
      g_pinned_stats.active_bytes.increase(nbytes);
      g_pinned_stats.allocations.increase(1);
      g_pinned_stats.allocated_bytes.increase(nbytes);
      ++g_pinned_stats.num_host_alloc;
    }
    return {ptr, ptr, &pinned_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    return g_pinned_stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    for (auto* st : {&g_pinned_stats.active_requests, &g_pinned_stats.active_bytes,
                     &g_pinned_stats.allocations, &g_pinned_stats.allocated_bytes})
      st->reset_accumulated();
    g_pinned_stats.num_host_alloc = g_pinned_stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    for (auto* st : {&g_pinned_stats.active_requests, &g_pinned_stats.active_bytes,
                     &g_pinned_stats.allocations, &g_pinned_stats.allocated_bytes})
      st->reset_peak();
  }
};
PinnedAllocator g_pinned_allocator;
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_pinned_allocator)

// ---------------------------------------------------------------- generator
struct TpuGeneratorImpl : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(uint64_t seed = c10::default_rng_seed_val, c10::DeviceIndex d = -1)
      : c10::GeneratorImpl(d < 0 ? own_device() : c10::Device(kTPU, d),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == at::kByte,
                "tpu RNG state must be a uint8 tensor of 16 bytes");
    auto* p = static_cast<const uint64_t*>(state.data());
    seed_ = p[0];
    offset_ = p[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* p = static_cast<uint64_t*>(t.data_ptr());
    p[0] = seed_;
    p[1] = offset_;
    return t.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kTPU; }

 private:
  TpuGeneratorImpl* clone_impl() const override {
    auto* g = new TpuGeneratorImpl(seed_, device().index());
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// One default generator per device (each device's stream, as CUDA's), made on first use.
constexpr int kMaxDevices = 64;
const at::Generator& default_generator(c10::DeviceIndex d = -1) {
  static at::Generator gens[kMaxDevices];
  static std::mutex mu;
  if (!g_multi || d < 0) d = current_index();  // (one device: every index names it)
  check_index(d);
  std::lock_guard<std::mutex> lock(mu);
  if (!gens[d].defined()) gens[d] = at::make_generator<TpuGeneratorImpl>(c10::default_rng_seed_val, d);
  return gens[d];
}

// ---------------------------------------------------------------- python callbacks
// synchronize lives in Python (it waits on the XLA buffers); the guard calls it.
py::object* g_sync_fn = nullptr;

void call_python_sync() {
  if (!g_sync_fn || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  (*g_sync_fn)();
}

// ---------------------------------------------------------------- storage resize
void resize_bytes(const c10::Storage& storage, size_t newsize) {
  // The XLA buffer is sized by Python from the storage's nbytes when it is next read;
  // here the storage only gets a fresh identity of the new size.
  auto* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  const bool was_realized = is_realized(storage);
  DeviceScope on(storage.device().index());
  impl->set_data_ptr_noswap(device_allocator()->allocate(newsize));
  impl->set_nbytes(newsize);
  if (was_realized) mark_realized(storage);
}

// ---------------------------------------------------------------- hooks
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return at::make_generator<TpuGeneratorImpl>(c10::default_rng_seed_val, d);
  }
  at::Device getDeviceFromPtr(void*) const override { return own_device(); }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    return g_pinned.count(const_cast<void*>(data)) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return g_count; }
  c10::DeviceIndex getCurrentDevice() const override { return current_index(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current(d); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const c10::DeviceIndex old = current_index();
    set_current(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    const c10::DeviceIndex old = current_index();
    if (own_index(d)) set_current(d);
    return old;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_bytes(storage, newsize);
  }
};

struct HooksRegistrar {
  HooksRegistrar() { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); }
};
HooksRegistrar g_hooks_registrar;

// ---------------------------------------------------------------- device guard
struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTPU; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = own_device();
    if (d.has_index()) set_current(d.index());
    return old;
  }
  c10::Device getDevice() const override { return own_device(); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) set_current(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (g_multi && d.has_index() && d.index() >= 0 && d.index() < g_count) make_current(d.index());
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, g_multi && d.has_index() ? d : own_device());
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return g_count; }
  // Events: XLA orders work per device, so a recorded event is complete once its
  // device is synchronized; record/block need no bookkeeping.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { call_python_sync(); }
  void synchronizeEvent(void*) const override { call_python_sync(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { call_python_sync(); }

 private:
  static void check(c10::Device d) {
    if (d.has_index()) check_index(d.index());
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ---------------------------------------------------------------- kernels
static void check_device(std::optional<at::Device> device) {
  if (device.has_value()) {
    if (device->has_index()) check_index(device->index());
  }
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_device(device);
  DeviceScope on(device.has_value() && device->has_index() ? device->index() : -1);
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  check_device(device);
  DeviceScope on(device.has_value() && device->has_index() ? device->index() : -1);
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  // as CPU's resize_: the same sizes keep the strides (a non-contiguous out= tensor of the
  // right shape stays as it is), other sizes make the tensor contiguous
  if (self.sizes() != size) {
    impl->set_sizes_contiguous(size);
    const auto itemsize = self.dtype().itemsize();
    const auto needed = static_cast<size_t>(
        (self.storage_offset() + c10::multiply_integers(size)) * itemsize);
    if (self.storage().nbytes() < needed) {
      resize_bytes(self.storage(), needed);
    }
  }
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& result, c10::Storage storage, int64_t storage_offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(result, storage, storage_offset, size, stride);
  result.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  std::optional<c10::IntArrayRef> stride_opt =
      stride.data() != nullptr ? std::optional<c10::IntArrayRef>(stride) : std::nullopt;
  // Bounds are checked against the storage; a larger view grows the storage, as on CPU.
  int64_t max_elem = 1;
  if (!size.empty()) {
    max_elem = storage_offset + 1;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] == 0) { max_elem = storage_offset; break; }
      int64_t st = stride_opt ? (*stride_opt)[i] : 1;
      max_elem += (size[i] - 1) * st;
    }
  } else {
    max_elem = storage_offset + 1;
  }
  if (stride_opt) {
    result.unsafeGetTensorImpl()->set_sizes_and_strides(size, *stride_opt);
  } else {
    result.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  }
  const size_t needed = static_cast<size_t>(max_elem) * result.dtype().itemsize();
  if (result.storage().nbytes() < needed) {
    resize_bytes(result.storage(), needed);
  }
  return result;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  DeviceScope on(self.device().index());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

// The aten ops given C++ kernels here, by overload packet ("set_.source_Storage" ->
// "set_"): filled by the registrations below as the library loads, and exported as
// _C.NATIVE_KERNELS, which _dispatch leaves out when it registers the lowering table's
// kernels (a lowered `view` must not replace at::native's).
std::set<std::string>& native_kernels() {
  static std::set<std::string> names;
  return names;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  auto impl = [&m](const char* name, auto kernel) {
    native_kernels().emplace(name, std::strcspn(name, "."));
    m.impl(name, kernel);
  };
  impl("set_.source_Storage", set_source_storage);
  impl("set_.source_Tensor", set_source_tensor);
  impl("set_", set_empty);
  impl("is_set_to", at::native::is_set_to);
  impl("empty.memory_format", empty_memory_format);
  impl("empty_strided", empty_strided);
  impl("as_strided", at::native::as_strided_tensorimpl);
  impl("view", at::native::view);
  impl("_reshape_alias", at::native::_reshape_alias);
  impl("unfold", at::native::unfold);
  impl("view_as_real", at::native::view_as_real);
  impl("view_as_complex", at::native::view_as_complex);
  impl("resize_", resize_);
  impl("set_.source_Storage_storage_offset", set_storage);
}


void add_dispatch_functions(PyObject* module);  // dispatch.cpp: register_op_kernel, empty_with_storage
void add_scan_functions(PyObject* module);   // scan.cpp: the executors' per-op key scan
void add_scan_graph_functions(PyObject* module);  // scan_graph.cpp: a compiled graph's call scan
void add_graph_functions(PyObject* module);  // graph.cpp: DeferAndFuse's Node, Lazy, record
void add_kernel_functions(PyObject* module);  // kernel.cpp: OpKernel (and loop.cpp's LoopDetector)
void add_direct_functions(PyObject* module);  // direct.cpp: DirectCall
void add_graph_impl(py::module_& m);  // graphs.cpp: torch.accelerator.Graph's tpu implementation
void add_cpu_kernel_functions(py::module_& m);  // cpu_kernels.cpp: ATen kernels in XLA:CPU programs

}  // namespace torch_tpu

// ---------------------------------------------------------------- python surface
PYBIND11_MODULE(_C, m) {
  torch_tpu::init_local_device();
  m.def("local_device", []() { return std::make_pair(int(torch_tpu::g_index), int(torch_tpu::g_count)); });
  m.def("check_device_index", [](int d) { torch_tpu::check_index(static_cast<c10::DeviceIndex>(d)); });
  // several local devices in this process (before any storage exists): tpu:0..count-1
  m.def("set_multi", [](int count) {
    TORCH_CHECK(count >= 1 && count <= torch_tpu::kMaxDevices, "set_multi: bad device count ", count);
    torch_tpu::g_multi = count > 1;
    torch_tpu::g_index = 0;
    torch_tpu::g_count = static_cast<c10::DeviceIndex>(count);
  });
  // one device per process, as tpu:index of count (a process group joined before the start)
  m.def("set_local_device", [](int index, int count) {
    TORCH_CHECK(count >= 1 && index >= 0 && index < count, "set_local_device: bad ", index, " of ", count);
    torch_tpu::g_multi = false;
    torch_tpu::g_index = static_cast<c10::DeviceIndex>(index);
    torch_tpu::g_count = static_cast<c10::DeviceIndex>(count);
  });
  m.def("current_index", []() { return int(torch_tpu::current_index()); });
  m.def("multi", []() { return torch_tpu::g_multi; });
  // set this thread's current index without checks, returning the last (a Python scope's)
  m.def("swap_index", [](int d) {
    const int prev = torch_tpu::current_index();
    if (torch_tpu::g_multi && d >= 0 && d < torch_tpu::g_count) torch_tpu::make_current(static_cast<c10::DeviceIndex>(d));
    return prev;
  });
  // which local device (of the runtime's) this thread's ops run on: 0 unless several
  m.def("slot", []() { return torch_tpu::g_multi ? int(torch_tpu::t_device) : 0; });
  torch_tpu::add_scan_functions(m.ptr());
  torch_tpu::add_scan_graph_functions(m.ptr());
  torch_tpu::add_graph_functions(m.ptr());
  torch_tpu::add_kernel_functions(m.ptr());
  torch_tpu::add_direct_functions(m.ptr());
  torch_tpu::add_dispatch_functions(m.ptr());
  torch_tpu::add_memory_functions(m.ptr());  // memory.cpp
  torch_tpu::add_graph_impl(m);
  torch_tpu::add_cpu_kernel_functions(m);
  m.attr("NATIVE_KERNELS") = py::tuple(py::cast(std::vector<std::string>(
      torch_tpu::native_kernels().begin(), torch_tpu::native_kernels().end())));
  m.def("default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torch_tpu::default_generator(static_cast<c10::DeviceIndex>(d))));
  }, py::arg("index") = -1);
  m.def("set_current_index", [](int d) { torch_tpu::set_current(static_cast<c10::DeviceIndex>(d)); });
  m.def("set_sync_callback", [](py::object fn) {
    if (!torch_tpu::g_sync_fn) torch_tpu::g_sync_fn = new py::object();  // leaked: outlives interpreter teardown
    *torch_tpu::g_sync_fn = std::move(fn);
  });
  m.def("is_pinned_ptr", [](uint64_t p) {
    std::lock_guard<std::mutex> lock(torch_tpu::g_pinned_mu);
    return torch_tpu::g_pinned.count(reinterpret_cast<void*>(p)) > 0;
  });
}
