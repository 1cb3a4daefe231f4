// Strict's run of a cached op, and the helpers results.h declares (see there).
#include "results.h"

#include <vector>

namespace torch_tpu {

bool int_vector(PyObject* seq, c10::SmallVector<int64_t, 6>& out);  // dispatch.cpp

SlotAttr g_fresh("Entry", "fresh"), g_out_recs("Entry", "out_recs"), g_mut_slots("Entry", "mut_slots"),
    g_structure("Entry", "structure");

// storage.<attr> = (value, length, dtype): a buffer, or a Lazy while recording
bool set_record(PyObject* st, PyObject* lazy, PyObject* n, PyObject* dtype) {
  PyObject* rec = PyTuple_Pack(3, lazy, n, dtype);
  if (rec == nullptr) return false;
  const int rc = PyObject_SetAttr(st, g_record_attr, rec);
  Py_DECREF(rec);
  return rc == 0;
}

// A call at a capacity (op/capacity.py, OpPlan.held): `held` has per fresh result None, or
// (sizes, attribute, tag): the result, made at the capacity, takes its true sizes (strides
// and storage kept) and its storage the capacity tag, as capacity._hold does.
bool hold_fresh(PyObject* held, PyObject* fresh) {
  if (held == Py_None) return true;
  if (!PyList_Check(held) || PyList_GET_SIZE(held) != PyList_GET_SIZE(fresh)) {
    PyErr_SetString(PyExc_TypeError, "record: held must be a list, one item per fresh result");
    return false;
  }
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(held); ++k) {
    PyObject* h = PyList_GET_ITEM(held, k);
    if (h == Py_None) continue;
    PyObject* t = PyList_GET_ITEM(fresh, k);
    c10::SmallVector<int64_t, 6> size;
    if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 3 || !int_vector(PyTuple_GET_ITEM(h, 0), size)) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "record: a held item is (sizes, attribute, tag)");
      return false;
    }
    const at::Tensor& tensor = THPVariable_Unpack(t);
    const std::vector<int64_t> strides = tensor.strides().vec();
    if (static_cast<size_t>(size.size()) != strides.size()) {
      PyErr_SetString(PyExc_ValueError, "record: held sizes of another rank");
      return false;
    }
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides);
    PyObject* tag = PyTuple_GET_ITEM(h, 2);
    if (tag == Py_None) continue;
    PyObject* st = THPStorage_Wrap(tensor.storage());
    const int rc = st == nullptr ? -1 : PyObject_SetAttr(st, PyTuple_GET_ITEM(h, 1), tag);
    Py_XDECREF(st);
    if (rc < 0) return false;
  }
  return true;
}

// What the op returns, per its schema: structure entries are ("fresh",), ("alias", i),
// ("list", n) or ("value", v). Strict uses it too (strict.assemble).
PyObject* assemble(PyObject* structure, PyObject* vals, PyObject* fresh) {
  const Py_ssize_t n = PyTuple_GET_SIZE(structure);
  if (n == 0) Py_RETURN_NONE;
  PyObject* rets = PyTuple_New(n);
  if (rets == nullptr) return nullptr;
  Py_ssize_t next = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* s = PyTuple_GET_ITEM(structure, i);
    PyObject* tag = PyTuple_GET_ITEM(s, 0);
    PyObject* r;
    if (PyUnicode_CompareWithASCIIString(tag, "fresh") == 0) {
      r = PyList_GetItem(fresh, next++);  // borrowed; IndexError if the entry is malformed
      Py_XINCREF(r);
    } else if (PyUnicode_CompareWithASCIIString(tag, "alias") == 0) {
      r = PyList_GetItem(vals, PyLong_AsSsize_t(PyTuple_GET_ITEM(s, 1)));
      Py_XINCREF(r);
    } else if (PyUnicode_CompareWithASCIIString(tag, "list") == 0) {
      const Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(s, 1));
      r = PyList_GetSlice(fresh, next, next + k);
      next += k;
    } else {
      r = PyTuple_GET_ITEM(s, 1);
      Py_INCREF(r);
    }
    if (r == nullptr) {
      Py_DECREF(rets);
      return nullptr;
    }
    PyTuple_SET_ITEM(rets, i, r);
  }
  if (n == 1) {
    PyObject* r = PyTuple_GET_ITEM(rets, 0);
    Py_INCREF(r);
    Py_DECREF(rets);
    return r;
  }
  return rets;
}

// Strict's cached op in C: the tail of StrictExecutor.execute (eager/strict.py), its
// Python reference. `fn` is the entry's executable; its results become the fresh
// tensors' buffers (allocated after the call: past the device's capacity the allocator
// raises torch.OutOfMemoryError and the op leaves no trace) and the mutated storages'
// new buffers. An exception from `fn` (other than KeyboardInterrupt) is cleared and
// *retry set: Python's execute runs the op again and maps the error to torch's.
PyObject* run_op(PyObject* entry, PyObject* fn, PyObject* bufs, PyObject* dyns, PyObject* vals,
                 PyObject* held, bool* retry) {
  *retry = false;
  if (!PyList_Check(bufs) || !PyList_Check(dyns)) {
    PyErr_SetString(PyExc_TypeError, "run_op: bufs and dyns must be lists");
    return nullptr;
  }
  const Py_ssize_t nb = PyList_GET_SIZE(bufs), nd = PyList_GET_SIZE(dyns);
  std::vector<PyObject*> args(static_cast<size_t>(nb + nd));
  for (Py_ssize_t i = 0; i < nb; ++i) args[i] = PyList_GET_ITEM(bufs, i);
  for (Py_ssize_t i = 0; i < nd; ++i) args[nb + i] = PyList_GET_ITEM(dyns, i);
  PyObject* outs = PyObject_Vectorcall(fn, args.data(), static_cast<size_t>(nb + nd), nullptr);
  if (outs == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
      PyErr_Clear();
      *retry = true;
    }
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(outs, "run_op: an entry's executable returns a list");
  Py_DECREF(outs);
  if (seq == nullptr) return nullptr;
  PyObject* specs = g_fresh.get(entry);
  PyObject* recs = g_out_recs.get(entry);
  PyObject* slots = g_mut_slots.get(entry);
  PyObject* structure = g_structure.get(entry);
  PyObject* fresh = PyList_New(0);
  PyObject* result = nullptr;
  if (specs != nullptr && recs != nullptr && slots != nullptr && structure != nullptr &&
      fresh != nullptr && PyList_Check(specs) && PyList_Check(recs) && PyList_Check(slots) &&
      PyTuple_Check(structure) &&
      PySequence_Fast_GET_SIZE(seq) == PyList_GET_SIZE(specs) + PyList_GET_SIZE(slots)) {
    const Py_ssize_t nfresh = PyList_GET_SIZE(specs);
    auto out = [seq](Py_ssize_t k) {
      PyObject* v = PySequence_Fast_GET_ITEM(seq, k);
      Py_INCREF(v);
      return v;
    };
    if (store_fresh(specs, recs, fresh, [&](Py_ssize_t k, PyObject*) { return out(k); }) &&
        store_mutated(slots, vals, [&](Py_ssize_t k, PyObject*) { return out(nfresh + k); }) &&
        hold_fresh(held, fresh))
      result = assemble(structure, vals, fresh);
  } else if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_TypeError, "run_op: malformed entry or results");
  }
  Py_XDECREF(specs);
  Py_XDECREF(recs);
  Py_XDECREF(slots);
  Py_XDECREF(structure);
  Py_XDECREF(fresh);
  Py_DECREF(seq);
  return result;
}

}  // namespace torch_tpu
