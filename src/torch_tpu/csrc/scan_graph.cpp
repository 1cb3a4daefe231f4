// A torch.compile graph's call, scanned in C. A tensor becomes a key part as in the eager
// executors' scan (scan.cpp; the helpers are scan.h's), so a view spec, a buffer's length
// and an offset passed as data mean the same in both; Program._promised
// (compile/program.py) predicts this key from fake inputs, to compile ahead of the first
// call.
//
// program_scan(kinds, args, memo) -> (parts, bufs, storages, offsets, same), or None: what
// Program.__call__ (compile/program.py) makes of a compiled graph's arguments. kinds: 0 a
// tpu tensor (part: its view spec, with a DYNAMIC offset whose device scalar is appended
// to offsets as the eager scan does, and the index of its storage's buffer in bufs, one
// per distinct storage), 1 a CPU tensor (None), 2 an int, 3 anything else (itself). None
// when a tpu input's storage has no buffer yet: the Python makes one.
// memo ([signature, parts], or None): the last call's layout. A call laid out the same (each
// view's sizes, strides, static offset and dtype, each buffer's length and dtype, which
// inputs share a storage, each int, each other object by identity: the memo's parts hold
// them, so none can be freed and its address reused) gets the memo's parts and same=True,
// no part built; the caller reuses the last executable without building or hashing a key.
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "scan.h"

namespace torch_tpu {

namespace {

enum InKind { IN_TPU, IN_CPU, IN_INT, IN_OTHER };

PyObject* program_scan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* memo = nargs == 3 ? args[2] : Py_None;
  if (nargs < 2 || nargs > 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1]) ||
      (memo != Py_None && (!PyList_Check(memo) || PyList_GET_SIZE(memo) != 2))) {
    PyErr_SetString(PyExc_TypeError, "program_scan(kinds: list, args: list of the same length[, memo: [signature, parts]])");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(args[1]);
  std::vector<int64_t> sig;
  // the first pass builds no part while the memo may match; a second one does
  for (bool build = memo == Py_None; ; build = true, sig.clear()) {
    PyObject* parts = build ? PyList_New(n) : nullptr;
    PyObject* bufs = PyList_New(0);
    PyObject* storages = PyList_New(0);
    PyObject* offsets = PyList_New(0);  // the device scalars of offsets passed as data
    std::unordered_map<PyObject*, Py_ssize_t> seen;  // storage object -> its index in bufs
    bool ok = (parts != nullptr || !build) && bufs != nullptr && storages != nullptr && offsets != nullptr;
    bool bail = false, fresh = false;  // fresh: an int past int64, no memo
    for (Py_ssize_t i = 0; ok && !bail && i < n; ++i) {
      PyObject* a = PyList_GET_ITEM(args[1], i);
      PyObject* part = nullptr;
      const long kind = PyLong_AsLong(PyList_GET_ITEM(args[0], i));
      sig.push_back(kind);
      switch (kind) {
        case IN_TPU: {
          if (!THPVariable_Check(a)) {
            bail = true;
            break;
          }
          const at::Tensor& t = THPVariable_Unpack(a);
          PyObject* st;
          PyObject* rec = storage_record(t, &st);
          if (rec == nullptr || rec == BAIL) {
            bail = rec == BAIL;
            break;
          }
          auto it = seen.find(st);
          Py_ssize_t j;
          if (it == seen.end()) {
            j = PyList_GET_SIZE(bufs);
            seen.emplace(st, j);
            ok = PyList_Append(bufs, PyTuple_GET_ITEM(rec, 0)) == 0 && PyList_Append(storages, st) == 0;
          } else {
            j = it->second;
          }
          const int dynamic = ok ? offset_is_data(t, rec) : -1;
          if (dynamic == 1) {
            PyObject* off = PyLong_FromLongLong(t.storage_offset());
            PyObject* type = off == nullptr ? nullptr : number_part(off, offsets);
            Py_XDECREF(off);
            Py_XDECREF(type);
            ok = type != nullptr;
          }
          sig.insert(sig.end(), {t.dim(), dynamic == 1 ? -1 : t.storage_offset(), static_cast<int64_t>(t.scalar_type()), j,
                                 PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1)),
                                 reinterpret_cast<int64_t>(PyTuple_GET_ITEM(rec, 2))});
          sig.insert(sig.end(), t.sizes().begin(), t.sizes().end());
          sig.insert(sig.end(), t.strides().begin(), t.strides().end());
          PyObject* idx = ok && dynamic >= 0 && build ? PyLong_FromSsize_t(j) : nullptr;
          part = idx == nullptr ? nullptr : view_part(t, rec, idx, dynamic == 1);
          ok = ok && dynamic >= 0;
          Py_XDECREF(idx);
          Py_DECREF(rec);
          Py_DECREF(st);  // `storages` holds it (so its address stays unique in `seen`)
          break;
        }
        case IN_CPU:
          Py_INCREF(Py_None);
          part = Py_None;
          break;
        case IN_INT: {
          int overflow = 0;
          sig.push_back(PyLong_AsLongLongAndOverflow(a, &overflow));
          fresh = fresh || overflow || PyErr_Occurred();
          PyErr_Clear();
          part = PyNumber_Long(a);
          break;
        }
        default:
          sig.push_back(reinterpret_cast<int64_t>(a));
          Py_INCREF(a);
          part = a;
      }
      if (part == nullptr && build) ok = false;
      else if (build) PyList_SET_ITEM(parts, i, part);
      else Py_XDECREF(part);
    }
    PyObject* result = nullptr;
    if (ok && !bail && !build) {  // the first pass: does the memo match?
      PyObject* last = PyList_GET_ITEM(memo, 0);
      const auto bytes = static_cast<Py_ssize_t>(sig.size() * sizeof(int64_t));
      if (!fresh && PyBytes_Check(last) && PyBytes_GET_SIZE(last) == bytes && memcmp(PyBytes_AS_STRING(last), sig.data(), bytes) == 0)
        result = Py_BuildValue("(OOOOO)", PyList_GET_ITEM(memo, 1), bufs, storages, offsets, Py_True);
      else if (!PyErr_Occurred()) ok = false;  // a new layout: the second pass
    } else if (ok && !bail) {
      result = Py_BuildValue("(OOOOO)", parts, bufs, storages, offsets, Py_False);
      PyObject* s = memo == Py_None ? nullptr
          : PyBytes_FromStringAndSize(reinterpret_cast<const char*>(sig.data()), sig.size() * sizeof(int64_t));
      if (s != nullptr) {
        PyList_SetItem(memo, 0, s);  // (steals s)
        PyList_SetItem(memo, 1, (Py_INCREF(parts), parts));
      }
    }
    Py_XDECREF(parts);
    Py_XDECREF(bufs);
    Py_XDECREF(storages);
    Py_XDECREF(offsets);
    if (bail && !PyErr_Occurred()) Py_RETURN_NONE;
    if (result != nullptr || build || PyErr_Occurred()) return result;
  }
}

PyMethodDef g_methods[] = {
    {"program_scan", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(program_scan)), METH_FASTCALL,
     "program_scan(kinds, args[, memo]) -> (parts, bufs, storages, offsets, same) of a compiled graph's call, or None"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void add_scan_graph_functions(PyObject* module) {
  if (PyModule_AddFunctions(module, g_methods) < 0) throw std::runtime_error("scan_graph functions");
}

}  // namespace torch_tpu
