// The PrivateUse1 kernel of a lowered op, as a C callable (OpKernel).
//
// torch calls a kernel with the op's Python arguments. In DeferAndFuse, when the op's
// entry is cached, OpKernel records the op with no Python frame at all: normalize, scan,
// the cache lookup, record and loop detection, the work of DeferExecutor.execute
// (eager/defer.py). Everything else goes through the current executor's Python
// `execute(plan, vals)`, the reference path: the other modes, a cache miss, what scan
// leaves to Python, ops run at once (data-dependent shapes), and every flush.
//
// The current executor, as op/current.py executor() would say, read on every op from a
// cache that only current.py writes (set_current_executors, from its _publish): this
// thread's innermost `eager_mode` block's, else the global one while no block is open on
// any thread, else current.executor() is asked (threads Python did not start follow the
// blocks open elsewhere). Executors live as long as the process, so these are borrowed.
//
// The Python names called or read here are exported in _C.CONTRACTS (contracts.h):
// "execute" of every executor, DeferExecutor's _graph_starts, _loop_flush and loop, an
// OpPlan's cache, cspec and name, and the slots read at their offsets (slots.h).
#include <Python.h>
#include <structmember.h>

#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "contracts.h"
#include "device.h"
#include "loop.h"
#include "slots.h"

namespace torch_tpu {

PyObject* normalize_values(PyObject* spec, PyObject* args, PyObject* kwargs);  // scan.cpp
PyObject* scan_values(PyObject* plan, PyObject* spec, PyObject* vals);         // scan.cpp
PyObject* run_op(PyObject* entry, PyObject* fn, PyObject* bufs, PyObject* dyns, PyObject* vals,
                 PyObject* held, bool* retry);                                 // results.cpp
PyObject* record_op(PyObject* nodes, PyObject* entry, PyObject* bufs, PyObject* dyns,
                    PyObject* vals, PyObject* held);                           // graph.cpp
bool in_bad_fork();                                                            // memory.cpp
int op_device(PyObject* vals, PyObject* name);                                 // scan.cpp
const char* bad_fork_message();                                                // memory.cpp

namespace {

// ------------------------------------------------------------ OpKernel
struct KernelObject {
  PyObject_HEAD
  PyObject* plan;
  PyObject* spec;   // plan.cspec: what normalize and scan read
  PyObject* cache;  // plan.cache: key -> Entry
  PyObject* precision;  // plan.precision: the settings snapshot of a sensitive op, or null
  PyObject* held;       // plan.held: key -> (the entry at a capacity, its results' hold)
  PyObject* devices;    // index -> this op's kernel on tpu:index (run_on_devices), or null
  bool apart;           // plan.apart: the op is not pointwise (the loop detector's guard)
};

// op/current.py's state, cached (set_current_executors):
thread_local PyObject* t_current = nullptr;  // this thread's eager_mode block's executor
PyObject* g_current = nullptr;  // the executor of every thread without a block, or null
PyObject* g_executor_fn = nullptr;  // op/current.py executor
PyObject* g_defer = nullptr;        // the DeferExecutor
LoopObject* g_loop = nullptr;       // and its loop detector
PyObject* g_strict = nullptr;       // the StrictExecutor
PyObject* g_counters = nullptr;     // metrics.counters
PyObject* g_dispatch_counter = nullptr;  // its key there: DeferAndFuse's dispatches
PyObject* g_strict_counter = nullptr;    // ... and Strict's
// method names of the executor: "execute" every executor has, the others DeferExecutor
enum { S_EXECUTE, S_GRAPH_STARTS, S_LOOP_FLUSH, N_METHODS };
const char* const kMethodNames[N_METHODS] = {"execute", "_graph_starts", "_loop_flush"};
PyObject* g_str[N_METHODS];
// attributes read by name: an OpPlan's (kernel_new, kernel_repr), the DeferExecutor's
// (kernel_setup)
const char kPlanCache[] = "cache", kPlanCSpec[] = "cspec", kPlanName[] = "name",
           kPlanPrecision[] = "precision", kPlanHeld[] = "held", kPlanApart[] = "apart",
           kDeferLoop[] = "loop";
SlotAttr g_entry_fn("Entry", "fn"), g_entry_checks("Entry", "checks"),
    g_ex_nodes("DeferExecutor", "nodes"), g_ex_in_backward("DeferExecutor", "in_backward");

PyObject* execute_in_python(PyObject* ex, PyObject* plan, PyObject* vals) {
  return PyObject_CallMethodObjArgs(ex, g_str[S_EXECUTE], plan, vals, nullptr);
}

bool count_dispatch(PyObject* counter) {
  static PyObject* one = PyLong_FromLong(1);
  PyObject* n = PyDict_GetItemWithError(g_counters, counter);  // borrowed
  if (n == nullptr && PyErr_Occurred()) return false;
  PyObject* m = n == nullptr ? (Py_INCREF(one), one) : PyNumber_Add(n, one);
  if (m == nullptr) return false;
  const int rc = PyDict_SetItem(g_counters, counter, m);
  Py_DECREF(m);
  return rc == 0;
}

// The key of a scanned call in the op's caches (a new reference, or null with an error
// set). A precision-sensitive op's entries are keyed (key, snapshot of the settings now),
// as in _program_cache.op_entry. Measured on the small Llama's decode step in
// DeferAndFuse (22 matmuls a token of 164 ops): the matmuls took Python's execute before,
// ~35 us each.
PyObject* lookup_of(KernelObject* k, PyObject* key) {
  if (k->precision == nullptr) {
    Py_INCREF(key);
    return key;
  }
  PyObject* prec = PyObject_CallNoArgs(k->precision);
  if (prec == nullptr) return nullptr;
  PyObject* lookup = PyTuple_Pack(2, key, prec);
  Py_DECREF(prec);
  return lookup;
}

// A held call's scalars (op/capacity.py _hold_in_c): `pick` None, the scanned ones; else
// (keep, expect): those at `keep`, when each at an `expect` index is that object (an
// offset that is data at the true size, fixed at the capacity); else null, no error.
PyObject* held_dyns(PyObject* pick, PyObject* dyns) {
  if (pick == Py_None) {
    Py_INCREF(dyns);
    return dyns;
  }
  PyObject *keep = PyTuple_GET_ITEM(pick, 0), *expect = PyTuple_GET_ITEM(pick, 1);
  const Py_ssize_t n = PyList_GET_SIZE(dyns);
  for (Py_ssize_t e = 0; e < PyTuple_GET_SIZE(expect); ++e) {
    PyObject* item = PyTuple_GET_ITEM(expect, e);
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
    if (i < 0 || i >= n || PyList_GET_ITEM(dyns, i) != PyTuple_GET_ITEM(item, 1)) return nullptr;
  }
  PyObject* out = PyList_New(PyTuple_GET_SIZE(keep));
  if (out == nullptr) return nullptr;
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(keep); ++j) {
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(keep, j));
    if (i < 0 || i >= n) {
      Py_DECREF(out);
      return nullptr;
    }
    PyObject* d = PyList_GET_ITEM(dyns, i);
    Py_INCREF(d);
    PyList_SET_ITEM(out, j, d);
  }
  return out;
}

// The op's entry for its scan, and the hold of its results and the scalars it takes (new
// references; null on a miss, with no error): the cached entry, or for a call on a tensor
// held at a capacity that route has seen (op/capacity.py _hold_in_c) the entry of its call
// at the capacity, which the node records or Strict runs, its results then held as route
// holds them. Measured on nanoGPT's generate (`bench loops`, 128 tokens, ~26 such ops a
// token), DeferAndFuse: 247 -> 203 ms a call, CPU eager 131 ms; route costs ~35 us an op.
PyObject* find_entry(KernelObject* k, PyObject* scanned, PyObject** held, PyObject** dyns) {
  PyObject* lookup = lookup_of(k, PyTuple_GET_ITEM(scanned, 0));
  if (lookup == nullptr) return nullptr;
  // borrowed (the dicts hold them); no Python code runs before the references are taken
  PyObject* entry = PyDict_GetItemWithError(k->cache, lookup);
  PyObject* at = entry == nullptr && !PyErr_Occurred() && PyDict_GET_SIZE(k->held) > 0
                     ? PyDict_GetItemWithError(k->held, lookup)
                     : nullptr;
  Py_DECREF(lookup);
  *held = Py_None;
  *dyns = PyTuple_GET_ITEM(scanned, 2);
  if (at != nullptr) {
    if ((*dyns = held_dyns(PyTuple_GET_ITEM(at, 2), *dyns)) == nullptr)
      return nullptr;  // (an offset that is not the one held: Python's route)
    entry = PyTuple_GET_ITEM(at, 0);
    *held = PyTuple_GET_ITEM(at, 1);
  } else if (entry == nullptr) {
    return nullptr;
  } else {
    Py_INCREF(*dyns);
  }
  Py_INCREF(*held);
  Py_INCREF(entry);
  return entry;
}

// The recording fast path; returns the op's result, or NOT_HERE for Python's execute.
PyObject* const NOT_HERE = reinterpret_cast<PyObject*>(1);

// Threads (eager/defer.py's docstring): the pending nodes are read before the scan, and
// the op goes to Python's execute, which waits for the flush, when they are None (another
// thread is flushing) or when they are another list by the time of the append (a flush
// ran while a Python callback, a scalar's upload or _graph_starts, let other threads run:
// the scan may hold values of the graph that ran). From that check to the append no
// Python code runs, so no other thread does.
PyObject* record_deferred(KernelObject* k, PyObject* ex, PyObject* vals) {
  PyObject* nodes = g_ex_nodes.get(ex);
  if (nodes == nullptr) return nullptr;
  if (nodes == Py_None) {
    Py_DECREF(nodes);
    return NOT_HERE;
  }
  if (!PyList_Check(nodes)) {
    Py_DECREF(nodes);
    PyErr_SetString(PyExc_TypeError, "DeferExecutor.nodes must be a list or None");
    return nullptr;
  }
  PyObject* scanned = scan_values(k->plan, k->spec, vals);
  if (scanned == nullptr || scanned == Py_None) {
    Py_DECREF(nodes);
    if (scanned == nullptr) return nullptr;
    Py_DECREF(scanned);
    return NOT_HERE;
  }
  PyObject *held, *dyns;
  PyObject* entry = find_entry(k, scanned, &held, &dyns);
  if (entry == nullptr) {
    Py_DECREF(nodes);
    Py_DECREF(scanned);
    return PyErr_Occurred() ? nullptr : NOT_HERE;  // a miss: execute compiles the entry
  }
  PyObject* result = nullptr;
  PyObject* now = nullptr;
  PyObject* fn = g_entry_fn.get(entry);
  if (fn == nullptr) goto done;
  if (fn == Py_None) {  // run at once (data-dependent shapes): execute flushes first
    result = NOT_HERE;
    goto done;
  }
  if (PyList_GET_SIZE(nodes) == 0) {
    PyObject* r = PyObject_CallMethodNoArgs(ex, g_str[S_GRAPH_STARTS]);
    if (r == nullptr) goto done;
    Py_DECREF(r);
  }
  now = g_ex_nodes.get(ex);
  if (now == nullptr) goto done;
  if (now != nodes) {  // a flush ran since the scan (see above)
    result = NOT_HERE;
    goto done;
  }
  if (!count_dispatch(g_dispatch_counter)) goto done;
  result = record_op(nodes, entry, PyTuple_GET_ITEM(scanned, 1), dyns, vals, held);
  if (result != nullptr) {
    PyObject* in_bw = g_ex_in_backward.get(ex);
    const int busy = in_bw == nullptr ? -1 : PyObject_IsTrue(in_bw);
    Py_XDECREF(in_bw);
    const int verdict =
        busy < 0 ? -1 : loop_push(g_loop, reinterpret_cast<uintptr_t>(entry), busy, k->apart);
    if (verdict > 0) {
      PyObject* code = PyLong_FromLong(verdict);
      PyObject* r = code == nullptr ? nullptr
                                    : PyObject_CallMethodOneArg(ex, g_str[S_LOOP_FLUSH], code);
      Py_XDECREF(code);
      if (r == nullptr) Py_CLEAR(result);
      Py_XDECREF(r);
    }
    if (verdict < 0) Py_CLEAR(result);
  }
done:
  Py_XDECREF(fn);
  Py_XDECREF(now);
  Py_DECREF(nodes);
  Py_DECREF(entry);
  Py_DECREF(held);
  Py_DECREF(dyns);
  Py_DECREF(scanned);
  return result;
}

// Strict's fast path: the op's cached entry run at once (results.cpp run_op), or NOT_HERE
// for Python's execute: a miss, what scan leaves to Python, data-dependent shapes, ops
// with device-side asserts (op/asserts.py) and an executable that raised (execute maps
// its error).
//
// Measured (a 4-element add, best of 15 rounds of 200 calls, 2 cores at load ~4): 19.4 us
// per op against 22.4 us through Python's execute, a bare jax.jit call 10.5 us. What is
// left above jax.jit is mostly outside this path (torch's dispatch to the boxed kernel,
// and the cyclic GC's collections that each op's new containers trigger: ~13% of a
// profile). The Python reference is StrictExecutor.execute, which
// TORCH_TPU_C_FAST_PATH=0 runs for every op (tests/unit/test_c_contracts.py compares them).
PyObject* run_strict(KernelObject* k, PyObject* vals) {
  PyObject* scanned = scan_values(k->plan, k->spec, vals);
  if (scanned == nullptr) return nullptr;
  if (scanned == Py_None) {
    Py_DECREF(scanned);
    return NOT_HERE;
  }
  PyObject *held, *dyns;
  PyObject* entry = find_entry(k, scanned, &held, &dyns);
  if (entry == nullptr) {
    Py_DECREF(scanned);
    return PyErr_Occurred() ? nullptr : NOT_HERE;
  }
  PyObject* result = nullptr;
  PyObject* checks = nullptr;
  PyObject* fn = g_entry_fn.get(entry);
  if (fn == nullptr) goto done;
  checks = g_entry_checks.get(entry);
  if (checks == nullptr) goto done;
  if (fn == Py_None || checks != Py_None) {
    result = NOT_HERE;
    goto done;
  }
  {
    bool retry = false;
    result = run_op(entry, fn, PyTuple_GET_ITEM(scanned, 1), dyns, vals, held, &retry);
    if (retry) result = NOT_HERE;
    else if (result != nullptr && !count_dispatch(g_strict_counter)) Py_CLEAR(result);
  }
done:
  Py_XDECREF(fn);
  Py_XDECREF(checks);
  Py_DECREF(entry);
  Py_DECREF(held);
  Py_DECREF(dyns);
  Py_DECREF(scanned);
  return result;
}

// Several devices per process: the op runs with its values' device current (CUDA's
// device guard), so its results, uploads and constants are made there, by the op's kernel
// for that device (its plan: OpPlan.on_device, with a cache of its own, so its programs
// are compiled for that device). Strict takes its fast path on every device. DeferAndFuse
// records in C until an op ran on another device than tpu:0; from then on its ops go
// through Python's execute, which flushes the pending graph when the device changes (a
// graph never spans two).
PyObject* g_on_device = nullptr;  // "on_device"

// The op's kernel on tpu:d (d > 0), made on first use (borrowed), or null with an error.
KernelObject* kernel_for(KernelObject* k, int d) {
  if (k->devices == nullptr && (k->devices = PyDict_New()) == nullptr) return nullptr;
  PyObject* index = PyLong_FromLong(d);
  if (index == nullptr) return nullptr;
  PyObject* found = PyDict_GetItemWithError(k->devices, index);  // borrowed
  if (found == nullptr && !PyErr_Occurred()) {
    if (g_on_device == nullptr && (g_on_device = PyUnicode_InternFromString("on_device")) == nullptr) {
      Py_DECREF(index);
      return nullptr;
    }
    PyObject* plan = PyObject_CallMethodOneArg(k->plan, g_on_device, index);
    PyObject* made = plan == nullptr ? nullptr : PyObject_CallOneArg(reinterpret_cast<PyObject*>(Py_TYPE(k)), plan);
    Py_XDECREF(plan);
    if (made != nullptr && PyDict_SetItem(k->devices, index, made) == 0) found = made;
    Py_XDECREF(made);  // (the dict holds it)
  }
  Py_DECREF(index);
  return reinterpret_cast<KernelObject*>(found);
}

PyObject* run_on_devices(KernelObject* k, PyObject* ex, PyObject* vals) {
  const int d = op_device(vals, k->plan);
  if (d == -2) return nullptr;
  DeviceScope on(static_cast<c10::DeviceIndex>(d));
  const int cur = current_index();
  KernelObject* kk = cur == 0 ? k : kernel_for(k, cur);
  if (kk == nullptr) return nullptr;
  PyObject* r = ex == g_strict                       ? run_strict(kk, vals)
                : ex == g_defer && !g_other_devices ? record_deferred(kk, ex, vals)
                                                     : NOT_HERE;
  return r == NOT_HERE ? execute_in_python(ex, kk->plan, vals) : r;
}

// The op with its argument values in schema order: record it (DeferAndFuse, cached
// entry), run it (Strict, cached entry) or hand it to the current executor's Python
// execute.
PyObject* kernel_run(KernelObject* k, PyObject* vals) {
  if (g_executor_fn == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "OpKernel: kernel_setup was not called");
    return nullptr;
  }
  if (in_bad_fork()) {  // a forked child: XLA's threads are gone, any call may hang
    PyErr_SetString(PyExc_RuntimeError, bad_fork_message());
    return nullptr;
  }
  PyObject* ex = t_current != nullptr ? t_current : g_current;
  if (ex != nullptr) {
    Py_INCREF(ex);
  } else {
    ex = PyObject_CallNoArgs(g_executor_fn);
    if (ex == nullptr) return nullptr;
  }
  PyObject* result = g_multi ? run_on_devices(k, ex, vals)
                     : ex == g_defer  ? record_deferred(k, ex, vals)
                     : ex == g_strict ? run_strict(k, vals)
                                      : NOT_HERE;
  if (result == NOT_HERE) result = execute_in_python(ex, k->plan, vals);
  Py_DECREF(ex);
  return result;
}

PyObject* kernel_call(PyObject* o, PyObject* args, PyObject* kwargs) {
  auto* k = reinterpret_cast<KernelObject*>(o);
  PyObject* vals = normalize_values(k->spec, args, kwargs);
  if (vals == nullptr) return nullptr;
  PyObject* result = kernel_run(k, vals);
  Py_DECREF(vals);
  return result;
}

PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* plan;
  if (!PyArg_ParseTuple(args, "O", &plan)) return nullptr;
  PyObject* cache = PyObject_GetAttrString(plan, kPlanCache);
  PyObject* spec = cache == nullptr ? nullptr : PyObject_GetAttrString(plan, kPlanCSpec);
  PyObject* precision = spec == nullptr ? nullptr : PyObject_GetAttrString(plan, kPlanPrecision);
  PyObject* held = precision == nullptr ? nullptr : PyObject_GetAttrString(plan, kPlanHeld);
  PyObject* apart = held == nullptr ? nullptr : PyObject_GetAttrString(plan, kPlanApart);
  const int is_apart = apart == nullptr ? -1 : PyObject_IsTrue(apart);
  Py_XDECREF(apart);
  if (is_apart < 0) Py_CLEAR(spec);
  KernelObject* self = nullptr;
  if (spec != nullptr && (!PyDict_CheckExact(cache) || !PyDict_CheckExact(held) ||
                          !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != CSPEC_SIZE))
    PyErr_SetString(PyExc_TypeError,
                    "OpKernel(plan): plan.cache and plan.held must be dicts, plan.cspec a CSpec");
  else if (spec != nullptr)
    self = reinterpret_cast<KernelObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    Py_XDECREF(cache);
    Py_XDECREF(spec);
    Py_XDECREF(precision);
    Py_XDECREF(held);
    return nullptr;
  }
  if (precision == Py_None) Py_CLEAR(precision);
  Py_INCREF(plan);
  self->plan = plan;
  self->spec = spec;
  self->cache = cache;
  self->precision = precision;
  self->held = held;
  self->devices = nullptr;
  self->apart = is_apart;
  return reinterpret_cast<PyObject*>(self);
}

void kernel_dealloc(PyObject* o) {
  auto* self = reinterpret_cast<KernelObject*>(o);
  Py_XDECREF(self->plan);
  Py_XDECREF(self->spec);
  Py_XDECREF(self->cache);
  Py_XDECREF(self->precision);
  Py_XDECREF(self->held);
  Py_XDECREF(self->devices);
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);
}

PyObject* kernel_plan(PyObject* o, void*) {
  PyObject* plan = reinterpret_cast<KernelObject*>(o)->plan;
  Py_INCREF(plan);
  return plan;
}

PyObject* kernel_repr(PyObject* o) {
  PyObject* name = PyObject_GetAttrString(reinterpret_cast<KernelObject*>(o)->plan, kPlanName);
  if (name == nullptr) return nullptr;
  PyObject* r = PyUnicode_FromFormat("<tpu kernel of %S>", name);
  Py_DECREF(name);
  return r;
}

PyGetSetDef kernel_getset[] = {
    {"plan", kernel_plan, nullptr, "the op's OpPlan", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot kernel_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(kernel_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(kernel_dealloc)},
    {Py_tp_call, reinterpret_cast<void*>(kernel_call)},
    {Py_tp_repr, reinterpret_cast<void*>(kernel_repr)},
    {Py_tp_getset, kernel_getset},
    {Py_tp_doc, const_cast<char*>("OpKernel(plan): the PrivateUse1 kernel of a lowered op")},
    {0, nullptr}};

PyTypeObject* g_kernel_type = nullptr;

PyType_Spec kernel_spec = {"torch_tpu._C.OpKernel", sizeof(KernelObject), 0, Py_TPFLAGS_DEFAULT,
                           kernel_slots};

// kernel_setup(executor_fn, defer_executor or None, strict_executor or None, counters,
//              defer_counter, strict_counter)
PyObject* kernel_setup(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyDict_Check(args[3]) || !PyUnicode_Check(args[4]) || !PyUnicode_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError,
                    "kernel_setup(executor_fn, defer_executor, strict_executor, counters: dict, "
                    "defer_counter: str, strict_counter: str)");
    return nullptr;
  }
  LoopObject* loop = nullptr;  // the executor keeps its detector for life
  if (args[1] != Py_None) {
    PyObject* l = PyObject_GetAttrString(args[1], kDeferLoop);
    if (l == nullptr) return nullptr;
    if (!is_loop_detector(l)) {
      Py_DECREF(l);
      PyErr_SetString(PyExc_TypeError, "kernel_setup: defer_executor.loop must be a LoopDetector");
      return nullptr;
    }
    loop = reinterpret_cast<LoopObject*>(l);
  }
  Py_XSETREF(g_loop, loop);
  PyObject** slots[] = {&g_executor_fn, &g_defer, &g_strict, &g_counters, &g_dispatch_counter,
                        &g_strict_counter};
  for (int i = 0; i < 6; ++i) {
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  Py_RETURN_NONE;
}

// set_current_executors(thread, global): op/current.py's _publish, after each change.
PyObject* set_current_executors(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "set_current_executors(thread_executor or None, global_executor or None)");
    return nullptr;
  }
  t_current = args[0] == Py_None ? nullptr : args[0];
  g_current = args[1] == Py_None ? nullptr : args[1];
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"kernel_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(kernel_setup)), METH_FASTCALL,
     "kernel_setup(executor_fn, defer_executor, strict_executor, counters, defer_counter, "
     "strict_counter): what OpKernel calls"},
    {"set_current_executors", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(set_current_executors)),
     METH_FASTCALL,
     "set_current_executors(thread, global): op/current.py's cache in C: this thread's innermost "
     "eager_mode block's executor, and the executor of threads outside blocks while no block is "
     "open anywhere (each None when there is none)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// For the dispatcher's boxed kernel (dispatch.cpp): `kernel` is an OpKernel, `vals` the
// argument values in schema order, defaults included, as normalize would give them.
PyObject* run_op_kernel(PyObject* kernel, PyObject* vals) {
  return kernel_run(reinterpret_cast<KernelObject*>(kernel), vals);
}

bool is_op_kernel(PyObject* o) { return g_kernel_type != nullptr && Py_TYPE(o) == g_kernel_type; }

void add_kernel_functions(PyObject* module) {
  for (int i = 0; i < N_METHODS; ++i) g_str[i] = PyUnicode_InternFromString(kMethodNames[i]);
  auto* kernel_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kernel_spec));
  g_kernel_type = kernel_type;
  if (kernel_type == nullptr || !add_loop_type(module) ||
      PyModule_AddObject(module, "OpKernel", reinterpret_cast<PyObject*>(kernel_type)) < 0 ||
      PyModule_AddFunctions(module, g_methods) < 0)
    throw std::runtime_error("kernel types");
  Py_INCREF(g_kernel_type);  // PyModule_AddObject stole one; the global keeps its own
  add_names(module, "methods", "executor", {kMethodNames[S_EXECUTE]});
  add_names(module, "methods", "DeferExecutor", {kMethodNames[S_GRAPH_STARTS], kMethodNames[S_LOOP_FLUSH]});
  add_names(module, "attributes", "OpPlan", {kPlanCache, kPlanCSpec, kPlanName, kPlanPrecision, kPlanHeld,
                                                 kPlanApart});
  add_names(module, "attributes", "DeferExecutor", {kDeferLoop});
  export_slots(module);  // every file's SlotAttrs (graph.cpp's too)
}

}  // namespace torch_tpu
