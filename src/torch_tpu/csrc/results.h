// An op's results become tensors and buffer records: one mechanism for DeferAndFuse's
// recording (graph.cpp record: the values are Lazy) and Strict's run at once
// (results.cpp run_op: the values are the executable's buffers).
//
// The Python they replace: StrictExecutor.execute's and finish's tail (eager/strict.py)
// and DeferExecutor.execute's (eager/defer.py).
#pragma once

#include <Python.h>

#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "slots.h"

namespace torch_tpu {

PyObject* empty_with_storage(PyObject*, PyObject* const* args, Py_ssize_t nargs);  // dispatch.cpp
extern PyObject* g_record_attr;  // scan.cpp: the storage attribute holding (buffer, length, dtype)
// an opcall.Entry's slots: the fresh results' (shape, dtype, strides), their (length, jax
// dtype), the mutated arguments' (index, list index), and the schema's return structure
extern SlotAttr g_fresh, g_out_recs, g_mut_slots, g_structure;

bool set_record(PyObject* st, PyObject* value, PyObject* n, PyObject* dtype);
PyObject* assemble(PyObject* structure, PyObject* vals, PyObject* fresh);
bool hold_fresh(PyObject* held, PyObject* fresh);  // a call at a capacity's results

// An op's fresh result tensors: new tensors, storage k's buffer record holding
// value(k, storage) (a new reference: a Lazy when recording, a buffer when run at once).
template <typename Value>
bool store_fresh(PyObject* specs, PyObject* recs, PyObject* fresh, Value value) {
  const Py_ssize_t n = PyList_GET_SIZE(specs);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* spec = PyList_GET_ITEM(specs, k);  // (shape, torch dtype, strides or None)
    PyObject* rec = PyList_GET_ITEM(recs, k);    // (flat length, jax dtype)
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
      PyErr_SetString(PyExc_TypeError, "record: an entry's fresh spec is not (shape, dtype, strides)");
      return false;
    }
    // the strides of the meta kernel's layout, which the entry's body writes the flat
    // buffer in (op/opcall.py _layout); None: contiguous
    PyObject* args[3] = {PyTuple_GET_ITEM(spec, 0), PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 1)};
    PyObject* pair = empty_with_storage(nullptr, args, 3);
    if (pair == nullptr) return false;
    PyObject* st = PyTuple_GET_ITEM(pair, 1);
    PyObject* v = value(k, st);
    const bool ok = v != nullptr &&
                    set_record(st, v, PyTuple_GET_ITEM(rec, 0), PyTuple_GET_ITEM(rec, 1)) &&
                    PyList_Append(fresh, PyTuple_GET_ITEM(pair, 0)) == 0;
    Py_XDECREF(v);
    Py_DECREF(pair);
    if (!ok) return false;
  }
  return true;
}

// The storages an op mutates: storage k's buffer record now holds value(k, storage) (a
// new reference), its length and dtype kept.
template <typename Value>
bool store_mutated(PyObject* slots, PyObject* vals, Value value) {
  const Py_ssize_t n = PyList_GET_SIZE(slots);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* slot = PyList_GET_ITEM(slots, k);  // (arg index, list index or None)
    PyObject* t = PyList_GET_ITEM(vals, PyLong_AsSsize_t(PyTuple_GET_ITEM(slot, 0)));
    PyObject* j = PyTuple_GET_ITEM(slot, 1);
    if (j != Py_None) t = PySequence_Fast_GET_ITEM(t, PyLong_AsSsize_t(j));
    if (!THPVariable_Check(t)) {
      PyErr_SetString(PyExc_TypeError, "record: a mutated argument is not a tensor");
      return false;
    }
    PyObject* st = THPStorage_Wrap(THPVariable_Unpack(t).storage());
    if (st == nullptr) return false;
    PyObject* old = PyObject_GetAttr(st, g_record_attr);
    PyObject* v = old == nullptr ? nullptr : value(k, st);
    const bool ok = v != nullptr &&
                    set_record(st, v, PyTuple_GET_ITEM(old, 1), PyTuple_GET_ITEM(old, 2));
    Py_XDECREF(v);
    Py_XDECREF(old);
    Py_DECREF(st);
    if (!ok) return false;
  }
  return true;
}

}  // namespace torch_tpu
