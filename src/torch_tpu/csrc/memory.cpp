// The device allocator and the memory accounting (src/torch_tpu/_memory.py is its Python
// home), and what a forked child may do.
//
// The allocator's addresses are unique and non-null but never dereferenced: the bytes live
// in an XLA buffer that Python attaches to the storage. It gives each storage an identity
// and a size (deepcopy, torch.load, HF's shared-tensor check and nbytes all need one),
// counts its bytes against the device's capacity (torch.OutOfMemoryError past it, at the
// call that makes the tensor) and refuses in a forked child. It is a c10::DeviceAllocator,
// so torch.accelerator's memory functions read the same counters as torch.tpu's.
#include <torch/extension.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/Storage.h>

#include "device.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <string>

namespace torch_tpu {

constexpr c10::DeviceType kTPU = c10::DeviceType::PrivateUse1;
extern c10::DeviceIndex g_index;  // tpu_ext.cpp: this process's device
c10::Device own_device();         // tpu_ext.cpp

// ---------------------------------------------------------------- fork
// A child forked after the parent started XLA inherits a runtime whose threads did not
// survive the fork: its next XLA call may hang forever. CUDA refuses at once
// ("Cannot re-initialize CUDA in forked subprocess"); so does every path into tpu here:
// the allocator (every new tpu tensor), OpKernel (every lowered op, csrc/kernel.cpp) and
// the host transfers in Python. _runtime.py's at-fork hook sets this, with its message.
std::atomic<bool> g_bad_fork{false};
std::string g_fork_message = "Cannot re-initialize tpu in forked subprocess";

bool in_bad_fork() { return g_bad_fork.load(std::memory_order_relaxed); }
const char* bad_fork_message() { return g_fork_message.c_str(); }

// ---------------------------------------------------------------- device memory
// The counters of the memory accounting (src/torch_tpu/_memory.py is its Python home).
// A storage's bytes are *reserved* from the moment torch allocates it: the device's
// capacity bounds them, so an allocation past it raises torch.OutOfMemoryError at the
// call that makes the tensor, before any XLA buffer exists; in DeferAndFuse too, whose
// results get their buffers only at the next flush. They are *allocated* once the
// storage's XLA buffer exists (Python calls mark_realized): DeferAndFuse creates storages
// for values that may never get a buffer, and memory_allocated() reports real device
// bytes. Reserved minus allocated is what DeferAndFuse's pending results will take.
struct Counter {  // a c10 Stat that many threads update
  std::atomic<int64_t> current{0}, peak{0}, allocated{0}, freed{0};
  void raise_peak(int64_t now) {
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void add(int64_t n) {
    raise_peak(current += n);
    allocated += n;
  }
  void sub(int64_t n) {
    current -= n;
    freed += n;
  }
  c10::CachingAllocator::Stat stat() const {
    c10::CachingAllocator::Stat s;
    s.current = current.load();
    s.peak = peak.load();
    s.allocated = allocated.load();
    s.freed = freed.load();
    return s;
  }
};
// Per device (a process with several counts each apart, as CUDA's allocator; one device:
// all in the first):
struct DeviceCounters {
  Counter allocated;     // bytes of storages whose XLA buffer exists
  Counter allocations;   // how many such storages
  Counter reserved;      // bytes of every live storage: what the limit bounds
  Counter reservations;  // how many live storages
  std::atomic<int64_t> num_ooms{0};
};
constexpr int kCounted = 64;
DeviceCounters g_counters[kCounted];

// The counters of tpu:d (-1: the current device).
DeviceCounters& counters(c10::DeviceIndex d) {
  if (!g_multi) return g_counters[0];
  if (d < 0) d = current_index();
  return g_counters[d >= 0 && d < kCounted ? d : 0];
}
// The device's capacity and what this process may reserve of it (capacity x
// set_per_process_memory_fraction), in bytes; -1 until _memory.py says, which the first
// allocation asks for (it starts the device, as CUDA's first allocation initializes CUDA).
std::atomic<int64_t> g_capacity{-1};
std::atomic<int64_t> g_limit{-1};
std::string g_oom_hint;      // what the message suggests (_memory.py: per platform)
py::object* g_capacity_fn = nullptr;  // starts the device, which sets the capacity
std::atomic<bool> g_capacity_asked{false};
std::atomic<uint64_t> g_next_addr{uint64_t(1) << 44};  // far from any host mapping
// Strict and Debug give every new storage its buffer at once, so allocations count as
// device memory from the start; DeferAndFuse turns this off and marks storages as their
// buffers appear at a flush.
std::atomic<bool> g_lazy_alloc{false};

// What a storage's DataPtr carries as its context: no global table, so allocating and
// freeing a storage (once per recorded op) takes no lock.
struct AllocInfo {
  size_t nbytes;
  std::atomic<bool> realized;
  uintptr_t addr;
  DeviceCounters* counted;  // its device's
};

// ---------------------------------------------------------------- memory history
// While torch.tpu.memory._record_memory_history is on, every allocation, free and OOM is
// handed to Python (_memory_history.py: the stack, the trace, the snapshot). Off, it costs
// one relaxed load per allocation and free.
std::atomic<bool> g_recording{false};
py::object* g_record_fn = nullptr;  // (action, address, bytes); leaked, as g_capacity_fn

void record_event(const char* action, uintptr_t addr, int64_t n) {
  if (!g_recording.load(std::memory_order_relaxed) || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  try {
    (*g_record_fn)(action, addr, n);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_tpu memory history");
  }
}

void learn_capacity() {
  bool asked = false;
  if (g_capacity_fn == nullptr || !Py_IsInitialized() ||
      !g_capacity_asked.compare_exchange_strong(asked, true))
    return;
  py::gil_scoped_acquire gil;
  try {
    (*g_capacity_fn)();
  } catch (...) {
    g_capacity_asked = false;  // (the device failed to start: the next allocation retries)
    throw;
  }
}

// Take n bytes of a device under the limit; false when they do not fit.
bool reserve(DeviceCounters& c, int64_t n) {
  const int64_t limit = g_limit.load(std::memory_order_relaxed);
  int64_t cur = c.reserved.current.load(std::memory_order_relaxed);
  do {
    if (limit >= 0 && n > limit - cur) return false;
  } while (!c.reserved.current.compare_exchange_weak(cur, cur + n));
  c.reserved.raise_peak(cur + n);
  c.reserved.allocated += n;
  c.reservations.add(1);
  return true;
}

void count_realized(DeviceCounters& c, int64_t n) {
  c.allocated.add(n);
  c.allocations.add(1);
}

PyObject* user_line(PyObject*, PyObject*);  // frames.cpp: (file, line) of the user's frame

// " at file:line" of the user's code running now (_frames.py's rule), or "".
std::string user_location() {
  if (!Py_IsInitialized()) return "";
  py::gil_scoped_acquire gil;
  PyObject* where = user_line(nullptr, nullptr);
  std::string out;
  if (where != nullptr && PyTuple_Check(where) && PyTuple_GET_SIZE(where) == 2) {
    const char* file = PyUnicode_AsUTF8(PyTuple_GET_ITEM(where, 0));
    const long line = PyLong_AsLong(PyTuple_GET_ITEM(where, 1));
    if (file != nullptr && line > 0) out = std::string(" at ") + file + ":" + std::to_string(line);
  }
  Py_XDECREF(where);
  PyErr_Clear();
  return out;
}

// torch.OutOfMemoryError's message, in CUDA's words ("Tried to allocate ...; ... already
// allocated; ... total capacity"), naming the user's line; n < 0: XLA did not say how
// much. Counts one OOM.
std::string out_of_memory_message(int64_t n, const std::string& cause) {
  using c10::CachingAllocator::format_size;
  DeviceCounters& c = counters(-1);
  ++c.num_ooms;
  record_event("oom", 0, n);
  if (g_capacity.load() < 0) {  // (XLA ran out before any tpu storage was allocated)
    try {
      learn_capacity();
    } catch (...) {
    }
  }
  const int64_t cap = g_capacity.load(), limit = g_limit.load();
  const int64_t reserved = c.reserved.current.load(), allocated = c.allocated.current.load();
  std::ostringstream os;
  os << "tpu out of memory. Tried to allocate " << (n >= 0 ? format_size(n) : "more")
     << " (tpu:" << int(current_index()) << "; ";
  if (cap >= 0) os << format_size(cap) << " total capacity; ";
  os << format_size(reserved) << " already allocated";
  if (reserved > allocated)
    os << ", " << format_size(reserved - allocated) << " of it by DeferAndFuse results not yet run";
  if (limit >= 0) {
    os << "; " << format_size(std::max<int64_t>(0, limit - reserved)) << " free";
    if (limit < cap) os << "; " << format_size(limit) << " allowed by set_per_process_memory_fraction";
  }
  os << ")" << user_location() << "." << cause;
  if (!g_oom_hint.empty()) os << " " << g_oom_hint;
  return os.str();
}

void tpu_delete(void* ctx) {
  auto* info = static_cast<AllocInfo*>(ctx);
  const auto n = static_cast<int64_t>(info->nbytes);
  if (n > 0) {
    record_event("free_completed", info->addr, n);
    DeviceCounters& c = *info->counted;
    c.reserved.sub(n);
    c.reservations.sub(1);
    if (info->realized.load()) {
      c.allocated.sub(n);
      c.allocations.sub(1);
    }
  }
  delete info;
}

struct TpuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    TORCH_CHECK(!in_bad_fork(), g_fork_message);
    const auto n = static_cast<int64_t>(nbytes);
    DeviceCounters& c = counters(-1);
    if (n > 0) {
      if (g_limit.load(std::memory_order_relaxed) < 0) learn_capacity();
      TORCH_CHECK_WITH(OutOfMemoryError, reserve(c, n), out_of_memory_message(n, ""));
    }
    // Every storage gets its own address range, so data_ptr()-based identity checks
    // (HF's shared-tensor detection, torch.save's storage dedup) see distinct storages.
    size_t span = ((nbytes + 63) / 64) * 64 + 64;
    void* addr = reinterpret_cast<void*>(g_next_addr.fetch_add(span));
    const bool realized = !g_lazy_alloc.load(std::memory_order_relaxed);
    auto* info = new AllocInfo{nbytes, realized, reinterpret_cast<uintptr_t>(addr), &c};
    if (realized && n > 0) count_realized(c, n);
    if (n > 0) record_event("alloc", info->addr, n);
    return {addr, info, &tpu_delete, own_device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages hold no host bytes; copy through a tensor instead");
  }
  bool initialized() override { return true; }
  // XLA frees a buffer as soon as its storage dies: there is no cache to empty.
  void emptyCache(c10::MempoolId_t) override {}
  // Every tpu program is ordered by its data (one implicit stream): nothing to record.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    DeviceCounters& c = counters(d);
    c10::CachingDeviceAllocator::DeviceStats s;
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.allocated_bytes[all] = s.active_bytes[all] = s.requested_bytes[all] = c.allocated.stat();
    s.allocation[all] = s.active[all] = c.allocations.stat();
    s.reserved_bytes[all] = c.reserved.stat();
    s.segment[all] = c.reservations.stat();
    s.num_ooms = c.num_ooms.load();
    s.num_device_alloc = c.reservations.allocated.load();
    s.num_device_free = c.reservations.freed.load();
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    DeviceCounters& c = counters(d);
    for (Counter* k : {&c.allocated, &c.allocations, &c.reserved, &c.reservations}) {
      k->allocated = 0;
      k->freed = 0;
    }
    c.num_ooms = 0;
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    DeviceCounters& c = counters(d);
    for (Counter* k : {&c.allocated, &c.allocations, &c.reserved, &c.reservations})
      k->peak = k->current.load();
  }
  // (free, total): the device's capacity less what its live tensors reserve, as
  // _memory.mem_get_info
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    if (g_capacity.load() < 0) learn_capacity();
    const int64_t cap = std::max<int64_t>(0, g_capacity.load());
    const int64_t free = std::max<int64_t>(0, cap - counters(d).reserved.current.load());
    return {static_cast<size_t>(free), static_cast<size_t>(cap)};
  }
};
TpuAllocator g_allocator;
REGISTER_ALLOCATOR(kTPU, &g_allocator);

AllocInfo* alloc_info(const c10::Storage& storage) {
  const c10::DataPtr& dp = storage.data_ptr();
  return dp.get_deleter() == &tpu_delete ? static_cast<AllocInfo*>(dp.get_context()) : nullptr;
}

void mark_realized(const c10::Storage& storage) {
  AllocInfo* info = alloc_info(storage);
  bool was = false;
  if (info != nullptr && info->realized.compare_exchange_strong(was, true) && info->nbytes > 0)
    count_realized(*info->counted, static_cast<int64_t>(info->nbytes));
}

bool is_realized(const c10::Storage& storage) {
  AllocInfo* info = alloc_info(storage);
  return info != nullptr && info->realized.load();
}

c10::Allocator* device_allocator() { return &g_allocator; }

void add_memory_functions(PyObject* module) {
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("memory_allocated", [](int d) { return counters(static_cast<c10::DeviceIndex>(d)).allocated.current.load(); },
        py::arg("device") = -1);
  m.def("memory_reserved", [](int d) { return counters(static_cast<c10::DeviceIndex>(d)).reserved.current.load(); },
        py::arg("device") = -1);
  m.def("set_memory_capacity", [](int64_t capacity, int64_t limit, std::string hint) {
    g_oom_hint = std::move(hint);
    g_capacity = capacity;
    g_limit = limit;
  }, "set_memory_capacity(capacity, limit, hint): bytes of the device, bytes this process may reserve");
  m.def("set_capacity_callback", [](py::object fn) {
    if (!g_capacity_fn) g_capacity_fn = new py::object();  // leaked: outlives interpreter teardown
    *g_capacity_fn = std::move(fn);
  });
  m.def("out_of_memory_message", &out_of_memory_message,
        "out_of_memory_message(nbytes or -1, cause) -> torch.OutOfMemoryError's text (counts one OOM)");
  m.def("mark_realized", [](py::handle storage) {
    if (!THPStorage_Check(storage.ptr())) throw py::type_error("mark_realized(storage)");
    mark_realized(THPStorage_Unpack(storage.ptr()));
  });
  m.def("set_memory_recorder", [](py::object fn) {
    if (!g_record_fn) g_record_fn = new py::object();
    g_recording = false;
    *g_record_fn = std::move(fn);
    g_recording = !g_record_fn->is_none();
  }, "set_memory_recorder(fn(action, address, bytes) or None): memory history on or off");
  m.def("set_lazy_allocations", [](bool lazy) { g_lazy_alloc = lazy; });
  m.def("set_bad_fork", [](std::string message) {
    g_fork_message = std::move(message);
    g_bad_fork = true;
  });
  m.def("in_bad_fork", &in_bad_fork);
}

}  // namespace torch_tpu
