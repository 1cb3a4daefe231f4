// DeferAndFuse's loop detector (LoopDetector): see loop.h and eager/defer.py.
#include "loop.h"

#include <structmember.h>

#include <algorithm>

namespace torch_tpu {

Verdict loop_push(LoopObject* self, uintptr_t h, bool in_backward, bool apart) {
  auto& hist = *self->hist;
  const Py_ssize_t i = static_cast<Py_ssize_t>(hist.size());
  hist.push_back(h);
  self->apart->push_back(self->apart->back() + (apart ? 1 : 0));
  const Py_ssize_t p = self->period;
  if (p && hist[i - p] == h) {
    self->run += 1;
    // inside a backward pass its layers' gradients repeat: not the loop
    if (self->run >= p && p >= self->min_period && 20 * p >= 9 * (i + 1) && !in_backward)
      return LOOP;
  } else {
    auto it = self->last->find(h);
    self->period = it != self->last->end() ? i - it->second : 0;
    self->run = it != self->last->end() ? 1 : 0;
  }
  (*self->last)[h] = i;
  return i + 1 >= self->max_nodes ? SIZE_CAP : NONE;
}

void loop_reset(LoopObject* self) {
  self->hist->clear();
  self->apart->assign(1, 0);
  self->last->clear();
  self->period = self->run = 0;
}

namespace {

PyObject* loop_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  Py_ssize_t min_period, max_nodes;
  static const char* kw[] = {"min_period", "max_nodes", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nn", const_cast<char**>(kw), &min_period,
                                   &max_nodes))
    return nullptr;
  auto* self = reinterpret_cast<LoopObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->hist = new std::vector<uintptr_t>();
  self->last = new std::unordered_map<uintptr_t, Py_ssize_t>();
  self->apart = new std::vector<int32_t>(1, 0);
  self->period = self->run = 0;
  self->min_period = min_period;
  self->max_nodes = max_nodes;
  return reinterpret_cast<PyObject*>(self);
}

void loop_dealloc(PyObject* o) {
  auto* self = reinterpret_cast<LoopObject*>(o);
  delete self->hist;
  delete self->last;
  delete self->apart;
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);
}

PyObject* loop_push_py(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "push(h: int, in_backward: bool, apart: bool)");
    return nullptr;
  }
  const uintptr_t h = static_cast<uintptr_t>(PyLong_AsSize_t(args[0]));
  if (PyErr_Occurred()) return nullptr;
  const int in_backward = PyObject_IsTrue(args[1]);
  const int apart = in_backward < 0 ? -1 : PyObject_IsTrue(args[2]);
  if (apart < 0) return nullptr;
  return PyLong_FromLong(loop_push(reinterpret_cast<LoopObject*>(o), h, in_backward, apart));
}

// repeated_block(repeats, max_block) -> (P, 0): P is the shortest block of ids that the
// newest ones repeat `repeats` times in a row and that holds an id compiling apart;
// (0, k): none, but the shortest such block that the newest ids repeat twice would have
// its repeats k pushes on; (0, 0): neither. Blocks are at most max_block long and looked
// for among the newest repeats * max_block ids. Newest first: a block of P ends with an id
// equal to the newest, P ids back; the prefix counts make "holds one compiling apart" one
// subtraction. tests/unit/test_guard_search.py checks it against the definition.
PyObject* loop_repeated_block(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  Py_ssize_t repeats, max_block;
  if (nargs != 2 || (repeats = PyLong_AsSsize_t(args[0])) < 2 ||
      (max_block = PyLong_AsSsize_t(args[1])) < 1) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "repeated_block(repeats >= 2, max_block >= 1)");
    return nullptr;
  }
  auto* self = reinterpret_cast<LoopObject*>(o);
  const auto& ids = *self->hist;
  const auto& apart = *self->apart;
  const Py_ssize_t total = static_cast<Py_ssize_t>(ids.size());
  const Py_ssize_t n = std::min(total, repeats * max_block);
  auto rev = [&](Py_ssize_t j) { return ids[total - 1 - j]; };  // j ids before the newest
  const Py_ssize_t limit = std::min(n / 2, max_block) + 1;
  const int32_t last = apart[total];
  Py_ssize_t found = 0, soon = 0;
  if (n > 0 && last != apart[std::max<Py_ssize_t>(0, total - limit)]) {
    for (Py_ssize_t p = 1; p < limit; ++p) {
      if (rev(p) != rev(0) || last == apart[total - p]) continue;
      bool twice = true;
      for (Py_ssize_t j = 0; j < p && twice; ++j) twice = rev(p + j) == rev(j);
      if (!twice) continue;
      Py_ssize_t k = 2;  // the repeats: blocks back from the newest equal to it
      for (; k < repeats && (k + 1) * p <= n; ++k) {
        bool same = true;
        for (Py_ssize_t j = 0; j < p && same; ++j) same = rev(k * p + j) == rev(j);
        if (!same) break;
      }
      if (k >= repeats)
        found = p;
      else
        soon = (repeats - k) * p;
      break;
    }
  }
  return Py_BuildValue("(nn)", found, soon);
}

PyObject* loop_reset_py(PyObject* o, PyObject*) {
  loop_reset(reinterpret_cast<LoopObject*>(o));
  Py_RETURN_NONE;
}

PyObject* loop_len(PyObject* o, void*) {
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(reinterpret_cast<LoopObject*>(o)->hist->size()));
}

PyMethodDef loop_methods[] = {
    {"push", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(loop_push_py)), METH_FASTCALL,
     "push(entry id, in_backward, compiles apart) -> 0, or 1 (a loop iteration ended: "
     "flush), or 2 (size cap)"},
    {"reset", loop_reset_py, METH_NOARGS, "forget what was recorded (after a flush)"},
    {"repeated_block", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(loop_repeated_block)),
     METH_FASTCALL, "repeated_block(repeats, max_block) -> (P, 0), (0, pushes until), or (0, 0)"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef loop_getset[] = {
    {"recorded", loop_len, nullptr, "ids pushed since the last reset", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMemberDef loop_members[] = {
    {"max_nodes", T_PYSSIZET, offsetof(LoopObject, max_nodes), 0, "the graph-size cap"},
    {"min_period", T_PYSSIZET, offsetof(LoopObject, min_period), 0, "the shortest loop body"},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot loop_slots[] = {
    {Py_tp_members, loop_members},
    {Py_tp_new, reinterpret_cast<void*>(loop_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(loop_dealloc)},
    {Py_tp_methods, loop_methods},
    {Py_tp_getset, loop_getset},
    {Py_tp_doc, const_cast<char*>("LoopDetector(min_period, max_nodes): DeferAndFuse's loop detection")},
    {0, nullptr}};

PyType_Spec loop_spec = {"torch_tpu._C.LoopDetector", sizeof(LoopObject), 0, Py_TPFLAGS_DEFAULT,
                         loop_slots};


PyTypeObject* g_loop_type = nullptr;

}  // namespace

bool is_loop_detector(PyObject* o) { return g_loop_type != nullptr && Py_TYPE(o) == g_loop_type; }

bool add_loop_type(PyObject* module) {
  g_loop_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&loop_spec));
  if (g_loop_type == nullptr ||
      PyModule_AddObject(module, "LoopDetector", reinterpret_cast<PyObject*>(g_loop_type)) < 0)
    return false;
  Py_INCREF(g_loop_type);  // PyModule_AddObject stole one; the global keeps its own
  return true;
}

}  // namespace torch_tpu
