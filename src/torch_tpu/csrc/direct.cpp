// DirectCall: a compiled program called through PJRT itself, without jax.jit's per-call
// dispatch: Strict's op entries and torch.compile's graphs.
//
// A cached jax.jit call works out the arguments' signature (shape, dtype, weak type,
// sharding of each), looks it up in jit's own cache, reads jax's configuration, flattens
// the arguments as a pytree and shards them, and only then launches. The key of an op
// entry and of a compiled graph's executable (scan.cpp's scan, scan_graph.cpp's
// program_scan) already fixes every argument's shape and dtype (each buffer's length and
// dtype; each device scalar's type), and every buffer lives on the process's one device,
// so once the program is compiled that work repeats a check already made. DirectCall
// hands the buffers to the LoadedExecutable (`execute_sharded`) and wraps the results with
// jax's own result handlers (`consume_with_handlers`), which make the same jax.Arrays a
// jit call returns.
//
// Measured (medians, 2 cores, load ~0.1): a 4-element add, the bare jax.jit call 4.9 us,
// this path 4.05 us; a program of 400 small inputs and 200 outputs 927 against 680 us
// (jit's signature costs ~0.6 us per argument). Donated inputs are donated alike.
//
// The Python reference is the jitted function itself, and anything outside the plain
// case falls back to it: keywords, another argument count, an argument that is not a
// jax.Array, an executable that raises (a deleted buffer, memory exhausted: jit then
// raises the error the user sees). Fallbacks are counted. _runtime.direct_call builds
// these after a program's first call (~0.3 ms more, jax's caches answer), only for
// programs with no effects, host callbacks or NaN checks; TORCH_TPU_C_FAST_PATH=0 keeps
// the jitted function.
// tests/modes/test_direct_call.py compares both on every case.
#include <Python.h>
#include <structmember.h>

#include <stdexcept>

namespace torch_tpu {

namespace {

struct DirectObject {
  PyObject_HEAD
  PyObject* jitted;      // the entry's jax.jit function: the reference and the fallback
  PyObject* executable;  // its LoadedExecutable
  PyObject* kept;        // tuple of the argument indices the program reads (jax drops the rest)
  PyObject* handlers;    // list: one result handler per output
  PyObject* array_type;  // jax.Array's concrete type
  PyObject* counters;    // metrics.counters
  PyObject* fallback;    // its key counting fallbacks
  Py_ssize_t nargs;      // the argument count of the call it was built from
  Py_ssize_t split;      // -1: the outputs as one list; k: a pair of lists, split at k
  PyObject* profiling;   // _program_cache.PROFILING, or null: while [0] is true, jit's call
                         // (a device trace names each program by its jit)
  vectorcallfunc vectorcall;
};

PyObject* g_execute = nullptr;  // "execute_sharded"
PyObject* g_consume = nullptr;  // "consume_with_handlers"

PyObject* call_jitted(DirectObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  static PyObject* one = PyLong_FromLong(1);
  PyObject* n = PyDict_GetItemWithError(self->counters, self->fallback);  // borrowed
  if (n == nullptr && PyErr_Occurred()) return nullptr;
  PyObject* m = n == nullptr ? (Py_INCREF(one), one) : PyNumber_Add(n, one);
  if (m == nullptr || PyDict_SetItem(self->counters, self->fallback, m) < 0) {
    Py_XDECREF(m);
    return nullptr;
  }
  Py_DECREF(m);
  return PyObject_Vectorcall(self->jitted, args, nargsf, kwnames);
}

PyObject* direct_vectorcall(PyObject* o, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<DirectObject*>(o);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (self->profiling != nullptr && PyList_GET_ITEM(self->profiling, 0) != Py_False)
    return PyObject_Vectorcall(self->jitted, args, nargsf, kwnames);
  if (kwnames != nullptr || nargs != self->nargs) return call_jitted(self, args, nargsf, kwnames);
  const Py_ssize_t nkept = PyTuple_GET_SIZE(self->kept);
  PyObject* bufs = PyList_New(nkept);
  if (bufs == nullptr) return nullptr;
  for (Py_ssize_t j = 0; j < nkept; ++j) {
    PyObject* a = args[PyLong_AsSsize_t(PyTuple_GET_ITEM(self->kept, j))];
    if (Py_TYPE(a) != reinterpret_cast<PyTypeObject*>(self->array_type)) {
      Py_DECREF(bufs);
      return call_jitted(self, args, nargsf, kwnames);
    }
    Py_INCREF(a);
    PyList_SET_ITEM(bufs, j, a);
  }
  PyObject* results = PyObject_CallMethodOneArg(self->executable, g_execute, bufs);
  Py_DECREF(bufs);
  if (results == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) return nullptr;
    PyErr_Clear();
    return call_jitted(self, args, nargsf, kwnames);
  }
  PyObject* outs = PyObject_CallMethodOneArg(results, g_consume, self->handlers);
  Py_DECREF(results);
  if (outs == nullptr || self->split < 0) return outs;
  PyObject* pair = nullptr;
  if (PyList_Check(outs) && PyList_GET_SIZE(outs) >= self->split) {
    PyObject* head = PyList_GetSlice(outs, 0, self->split);
    PyObject* tail = PyList_GetSlice(outs, self->split, PyList_GET_SIZE(outs));
    if (head != nullptr && tail != nullptr) pair = PyTuple_Pack(2, head, tail);
    Py_XDECREF(head);
    Py_XDECREF(tail);
  } else {
    PyErr_SetString(PyExc_TypeError, "DirectCall: fewer results than its split");
  }
  Py_DECREF(outs);
  return pair;
}

PyObject* direct_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *jitted, *executable, *kept, *handlers, *array_type, *counters, *fallback;
  PyObject* profiling = nullptr;
  Py_ssize_t nargs, split = -1;
  static const char* kw[] = {"jitted", "executable", "kept", "handlers", "array_type",
                             "counters", "fallback", "nargs", "split", "profiling", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!O!O!Un|nO!", const_cast<char**>(kw), &jitted,
                                   &executable, &PyTuple_Type, &kept, &PyList_Type, &handlers,
                                   &PyType_Type, &array_type, &PyDict_Type, &counters, &fallback,
                                   &nargs, &split, &PyList_Type, &profiling))
    return nullptr;
  if (profiling != nullptr && PyList_GET_SIZE(profiling) < 1) {
    PyErr_SetString(PyExc_ValueError, "DirectCall: profiling must be a one-item list");
    return nullptr;
  }
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(kept); ++j) {
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(kept, j));
    if (i < 0 || i >= nargs) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "DirectCall: a kept index out of range");
      return nullptr;
    }
  }
  auto* self = reinterpret_cast<DirectObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  PyObject* held[] = {jitted, executable, kept, handlers, array_type, counters, fallback};
  for (PyObject* h : held) Py_INCREF(h);
  self->jitted = jitted;
  self->executable = executable;
  self->kept = kept;
  self->handlers = handlers;
  self->array_type = array_type;
  self->counters = counters;
  self->fallback = fallback;
  self->nargs = nargs;
  self->split = split;
  Py_XINCREF(profiling);
  self->profiling = profiling;
  self->vectorcall = direct_vectorcall;
  return reinterpret_cast<PyObject*>(self);
}

void direct_dealloc(PyObject* o) {
  auto* self = reinterpret_cast<DirectObject*>(o);
  Py_XDECREF(self->jitted);
  Py_XDECREF(self->executable);
  Py_XDECREF(self->kept);
  Py_XDECREF(self->handlers);
  Py_XDECREF(self->array_type);
  Py_XDECREF(self->counters);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->profiling);
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);
}

PyMemberDef direct_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(DirectObject, vectorcall), READONLY, nullptr},
    {"jitted", T_OBJECT, offsetof(DirectObject, jitted), READONLY, "the jax.jit function it stands for"},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot direct_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(direct_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(direct_dealloc)},
    {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
    {Py_tp_members, direct_members},
    {Py_tp_doc, const_cast<char*>("DirectCall(jitted, executable, kept, handlers, array_type, counters, "
                                  "fallback, nargs, split=-1, profiling=None): a compiled program called through PJRT")},
    {0, nullptr}};

PyType_Spec direct_spec = {"torch_tpu._C.DirectCall", sizeof(DirectObject), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL, direct_slots};

}  // namespace

void add_direct_functions(PyObject* module) {
  g_execute = PyUnicode_InternFromString("execute_sharded");
  g_consume = PyUnicode_InternFromString("consume_with_handlers");
  PyObject* type = PyType_FromSpec(&direct_spec);
  if (g_execute == nullptr || g_consume == nullptr || type == nullptr ||
      PyModule_AddObject(module, "DirectCall", type) < 0)
    throw std::runtime_error("DirectCall type");
}

}  // namespace torch_tpu
