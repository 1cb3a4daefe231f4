// The per-op hot path of the eager executors, in C: an op call's arguments in schema
// order (normalize) and their cache key (scan). This file's method table also registers
// frames.cpp's functions, and it exports the argument-kind numbering and the cspec's
// field order (contracts.h). How a tensor or a number becomes a key part is shared, through
// scan.h, with scan_graph.cpp, the same scan of a compiled graph's arguments.
//
// scan(plan, vals) does what OpPlan.scan (op/opcall.py) does for the common case, and
// builds the same key (shapes as plain tuples, which hash and compare like torch.Size):
//   tensors            -> (shape, strides, offset, dtype, buffer length, buffer dtype), and
//                         the storage record's buffer appended to `bufs`; a non-zero offset
//                         that _storage.offset_is_data passes as data is DYNAMIC, its device
//                         scalar appended to `dyns`;
//   Python scalars     -> their type, and the cached device scalar appended to `dyns`
//                         (made and cached through opcall.device_scalar when new);
//   a number passed for a tensor (a wrapped number: `x + 1e-6`) -> ("#", its type), the
//                         same device scalar;
//   static arguments   -> their value (lists as tuples);
//   a factory's key ends with torch's default dtype (what dtype=None follows).
// Whatever is rarer returns None and OpPlan.scan's Python handles it: a storage with no
// buffer yet or of another device, conj/neg views, a tensor passed for a scalar, seeded
// ops, two mutated arguments sharing a storage. The Python path stays the reference.
#include <Python.h>

#include <c10/core/DefaultDtype.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "contracts.h"
#include "device.h"
#include "scan.h"

namespace torch_tpu {

PyObject* g_record_attr = nullptr;  // (scan.h)

namespace {
// a tensor's device index when it is a tpu tensor, else -1
int tpu_index(PyObject* v) {
  if (!THPVariable_Check(v)) return -1;
  const at::Device d = THPVariable_Unpack(v).device();
  return d.type() == c10::DeviceType::PrivateUse1 ? d.index() : -1;
}
}  // namespace

int op_device(PyObject* vals, PyObject* name) {
  int found = -1, named = -1;
  auto see = [&](int d) -> bool {
    if (d < 0) return true;
    if (found < 0) found = d;
    if (d == found) return true;
    PyErr_Format(PyExc_RuntimeError,
                 "Expected all tensors to be on the same device, but found at least two devices, "
                 "tpu:%d and tpu:%d! (when checking arguments for %S)", found, d, name);
    return false;
  };
  const Py_ssize_t n = PyList_GET_SIZE(vals);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyList_GET_ITEM(vals, i);
    if (PyList_Check(v) || PyTuple_Check(v)) {
      const Py_ssize_t m = PySequence_Fast_GET_SIZE(v);
      for (Py_ssize_t j = 0; j < m; ++j)
        if (!see(tpu_index(PySequence_Fast_ITEMS(v)[j]))) return -2;
    } else if (THPDevice_Check(v)) {
      const at::Device d = reinterpret_cast<THPDevice*>(v)->device;
      if (d.type() == c10::DeviceType::PrivateUse1 && d.has_index()) named = d.index();
    } else if (!see(tpu_index(v))) {
      return -2;
    }
  }
  return found >= 0 ? found : named;
}

// spec: the plan's cspec (borrowed)
PyObject* normalize_values(PyObject* spec, PyObject* args, PyObject* kwargs);
PyObject* scan_values(PyObject* plan, PyObject* spec, PyObject* vals);

namespace {

PyObject* g_scalars = nullptr;  // opcall._SCALARS: (type, value) -> device scalar
PyObject* g_make_scalar = nullptr;  // opcall.device_scalar: makes and caches a missing one
PyObject* g_cspec = nullptr;    // "cspec": a plan's CSpec (contracts.h)
PyObject* g_eq = nullptr;       // "=" (the key part of a None/bool scalar)
PyObject* g_hash = nullptr;     // "#" (the key part of a number passed for a tensor)
PyObject* g_dynamic = nullptr;  // _storage.DYNAMIC (the key part of an offset passed as data)
PyObject* g_jax_dtypes = nullptr;  // _runtime.TORCH_TO_JAX: torch dtype -> jax dtype

// A new reference to the tuple of an IntArrayRef.
PyObject* int_tuple(c10::IntArrayRef xs) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(xs.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < xs.size(); ++i) {
    PyObject* v = PyLong_FromLongLong(xs[i]);
    if (v == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

}  // namespace

PyObject* storage_record(const at::Tensor& t, PyObject** st) {
  *st = THPStorage_Wrap(t.storage());
  if (*st == nullptr) return nullptr;
  PyObject* rec = PyObject_GetAttr(*st, g_record_attr);
  if (rec != nullptr && PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) == 3) return rec;
  Py_XDECREF(rec);
  Py_CLEAR(*st);
  if (rec == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return nullptr;
    PyErr_Clear();
  }
  return BAIL;
}

// _storage.offset_is_data: the offset of a view of part of its buffer, which the buffer
// holds whole in the view's own dtype, goes to the program as data.
int offset_is_data(const at::Tensor& t, PyObject* rec) {
  const int64_t offset = t.storage_offset();
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return 0;
    extent += (t.size(d) - 1) * t.stride(d);
  }
  const int64_t blen = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1));
  if (offset + extent > blen || (offset == 0 && extent >= blen)) return 0;
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  PyObject* jdt = PyDict_GetItemWithError(g_jax_dtypes, dtype);  // borrowed
  if (jdt == nullptr) return PyErr_Occurred() ? -1 : 0;
  return PyObject_RichCompareBool(jdt, PyTuple_GET_ITEM(rec, 2), Py_EQ);
}

PyObject* view_part(const at::Tensor& t, PyObject* rec, PyObject* extra, bool dynamic_offset) {
  PyObject* part = PyTuple_New(extra == nullptr ? 6 : 7);
  PyObject* shape = int_tuple(t.sizes());
  PyObject* stride = int_tuple(t.strides());
  PyObject* offset = dynamic_offset ? (Py_INCREF(g_dynamic), g_dynamic) : PyLong_FromLongLong(t.storage_offset());
  if (part == nullptr || shape == nullptr || stride == nullptr || offset == nullptr) {
    Py_XDECREF(part);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(offset);
    return nullptr;
  }
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  PyObject* items[7] = {shape, stride, offset, dtype, PyTuple_GET_ITEM(rec, 1), PyTuple_GET_ITEM(rec, 2), extra};
  Py_INCREF(dtype);
  for (int i = 4; i < PyTuple_GET_SIZE(part); ++i) Py_INCREF(items[i]);
  for (int i = 0; i < PyTuple_GET_SIZE(part); ++i) PyTuple_SET_ITEM(part, i, items[i]);
  return part;
}

PyObject* number_part(PyObject* v, PyObject* dyns) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(v));
  PyObject* a = nullptr;
  if (!g_multi || current_index() == 0) {  // (another device's scalars: device_scalar keys them)
    PyObject* k = PyTuple_Pack(2, type, v);
    if (k == nullptr) return nullptr;
    a = PyDict_GetItemWithError(g_scalars, k);  // borrowed
    Py_DECREF(k);
  }
  if (a == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    a = PyObject_CallOneArg(g_make_scalar, v);  // a new value (a learning rate's next)
    if (a == nullptr) return nullptr;
    const int rc = PyList_Append(dyns, a);
    Py_DECREF(a);
    if (rc < 0) return nullptr;
  } else if (PyList_Append(dyns, a) < 0) {
    return nullptr;
  }
  Py_INCREF(type);
  return type;
}

namespace {

struct Scan {
  PyObject* bufs;
  PyObject* dyns;
  PyObject* recs;  // the mutated-arguments' storage records (in-place ops), else nullptr

  PyObject* tensor(PyObject* v) {
    if (v == Py_None) {
      Py_INCREF(Py_None);
      return Py_None;
    }
    if (!THPVariable_Check(v)) {
      if (PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyComplex_CheckExact(v) || PyBool_Check(v))
        return number_for_tensor(v);
      return BAIL;
    }
    const at::Tensor& t = THPVariable_Unpack(v);
    if (t.is_conj() || t.is_neg()) return BAIL;
    PyObject* st;
    PyObject* rec = storage_record(t, &st);
    if (rec == nullptr || rec == BAIL) return rec;
    Py_DECREF(st);
    if (PyList_Append(bufs, PyTuple_GET_ITEM(rec, 0)) < 0 ||
        (recs != nullptr && PyList_Append(recs, rec) < 0)) {
      Py_DECREF(rec);
      return nullptr;
    }
    const int dynamic = offset_is_data(t, rec);
    PyObject* part = nullptr;
    if (dynamic == 1) {  // the offset's device scalar into dyns, as a number's
      PyObject* off = PyLong_FromLongLong(t.storage_offset());
      PyObject* type = off == nullptr ? nullptr : number(off);
      Py_XDECREF(off);
      Py_XDECREF(type);
      if (type != nullptr) part = view_part(t, rec, nullptr, true);
    } else if (dynamic == 0) {
      part = view_part(t, rec, nullptr);
    }
    Py_DECREF(rec);
    return part;
  }

  PyObject* number(PyObject* v) { return number_part(v, dyns); }

  // A Python number where the schema has a Tensor (torch passes a wrapped number so, as
  // in `x + 1e-6`): ("#", its type), its device scalar into dyns.
  PyObject* number_for_tensor(PyObject* v) {
    PyObject* type = number(v);
    if (type == nullptr || type == BAIL) return type;
    PyObject* part = PyTuple_Pack(2, g_hash, type);
    Py_DECREF(type);
    return part;
  }

  PyObject* scalar(PyObject* v) {
    if (v == Py_None || PyBool_Check(v)) return PyTuple_Pack(2, g_eq, v);
    if (!PyLong_CheckExact(v) && !PyFloat_CheckExact(v) && !PyComplex_CheckExact(v)) return BAIL;
    return number(v);
  }

  // SCALAR_KEYED (lowering/schema.py KEYED_VALUES): 0.5, 1, 2, 3 or inf (an exact int or
  // float) is keyed by value, (type, value), a constant of the program; any other number
  // is a SCALAR.
  PyObject* keyed_scalar(PyObject* v) {
    bool common = false;
    if (PyFloat_CheckExact(v)) {
      const double x = PyFloat_AS_DOUBLE(v);
      common = x == 0.5 || x == 1.0 || x == 2.0 || x == 3.0 || x == HUGE_VAL;
    } else if (PyLong_CheckExact(v)) {
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      common = overflow == 0 && x >= 1 && x <= 3;
    }
    if (common) return PyTuple_Pack(2, reinterpret_cast<PyObject*>(Py_TYPE(v)), v);
    return scalar(v);
  }

  PyObject* tensor_list(PyObject* v) {
    if (!PyList_Check(v) && !PyTuple_Check(v)) return BAIL;
    PyObject* seq = PySequence_Fast(v, "");
    if (seq == nullptr) return nullptr;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject* out = PyTuple_New(n);
    if (out == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* p = tensor(PySequence_Fast_GET_ITEM(seq, i));
      if (p == nullptr || p == BAIL) {
        Py_DECREF(out);
        Py_DECREF(seq);
        return p;
      }
      PyTuple_SET_ITEM(out, i, p);
    }
    Py_DECREF(seq);
    return out;
  }

  PyObject* scalar_list(PyObject* v) {
    if (!PyList_Check(v) && !PyTuple_Check(v)) return BAIL;
    const Py_ssize_t n = PySequence_Size(v);
    PyObject* out = PyTuple_New(n);
    if (out == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* x = PySequence_GetItem(v, i);
      PyObject* p = x == nullptr ? nullptr
                  : (PyLong_CheckExact(x) || PyFloat_CheckExact(x)) ? number(x) : BAIL;
      Py_XDECREF(x);
      if (p == nullptr || p == BAIL) {
        Py_DECREF(out);
        return p;
      }
      PyTuple_SET_ITEM(out, i, p);
    }
    return out;
  }
};

// _hashable: lists become tuples, recursively. A new reference.
PyObject* hashable(PyObject* v) {
  if (!PyList_Check(v)) {
    Py_INCREF(v);
    return v;
  }
  const Py_ssize_t n = PyList_GET_SIZE(v);
  PyObject* out = PyTuple_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* x = hashable(PyList_GET_ITEM(v, i));
    if (x == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i, x);
  }
  return out;
}

bool is_member(PyObject* ints, Py_ssize_t i) {
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ints); ++k)
    if (PyLong_AsSsize_t(PyTuple_GET_ITEM(ints, k)) == i) return true;
  return false;
}

// Whether two of the mutated tensors' records (at positions `mut` of `recs`, the records of
// every tensor argument) are one storage's: their writes must chain (Python's scan
// handles that). A mutated tensor sharing with one only read is fine: reads see the
// values from before the op, as the lowering computes them.
bool shares_storage(PyObject* recs, const std::vector<Py_ssize_t>& mut) {
  for (size_t i = 0; i < mut.size(); ++i)
    for (size_t j = i + 1; j < mut.size(); ++j)
      if (PyList_GET_ITEM(recs, mut[i]) == PyList_GET_ITEM(recs, mut[j])) return true;
  return false;
}

// normalize(plan, args, kwargs) -> vals: one value per schema argument, in schema order,
// defaults filled in (what the executors take), from the cspec's npos, names and defaults.
PyObject* normalize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "normalize(plan, args: tuple, kwargs: dict)");
    return nullptr;
  }
  PyObject* spec = PyObject_GetAttr(args[0], g_cspec);
  if (spec == nullptr) return nullptr;
  PyObject* vals = normalize_values(spec, args[1], args[2]);
  Py_DECREF(spec);
  return vals;
}

// scan(plan, vals) -> (key, bufs, dyns), or None for Python's scan.
PyObject* scan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "scan(plan, vals: list)");
    return nullptr;
  }
  PyObject* spec = PyObject_GetAttr(args[0], g_cspec);
  if (spec == nullptr) return nullptr;
  PyObject* scanned = scan_values(args[0], spec, args[1]);
  Py_DECREF(spec);
  return scanned;
}

}  // namespace

// normalize and scan, for OpKernel (kernel.cpp) too, which keeps its plan's cspec
PyObject* normalize_values(PyObject* spec, PyObject* args, PyObject* kwargs) {
  if (!PyTuple_Check(args) || (kwargs != nullptr && kwargs != Py_None && !PyDict_Check(kwargs))) {
    PyErr_SetString(PyExc_TypeError, "normalize(plan, args: tuple, kwargs: dict)");
    return nullptr;
  }
  if (kwargs == nullptr) kwargs = Py_None;
  const Py_ssize_t npos = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, CSPEC_NPOS));
  PyObject* names = PyTuple_GET_ITEM(spec, CSPEC_NAMES);
  PyObject* defaults = PyTuple_GET_ITEM(spec, CSPEC_DEFAULTS);
  const Py_ssize_t total = PyTuple_GET_SIZE(names);
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject* vals = PyList_New(std::max(n, npos) + (total - npos));
  if (vals == nullptr) return nullptr;
  Py_ssize_t k = 0;
  for (; k < n; ++k) {
    PyObject* v = PyTuple_GET_ITEM(args, k);
    Py_INCREF(v);
    PyList_SET_ITEM(vals, k, v);
  }
  for (Py_ssize_t i = n; i < npos; ++i, ++k) {  // positional arguments left to defaults
    PyObject* v = PyTuple_GET_ITEM(defaults, i);
    Py_INCREF(v);
    PyList_SET_ITEM(vals, k, v);
  }
  for (Py_ssize_t i = npos; i < total; ++i, ++k) {  // keyword-only arguments
    PyObject* v = kwargs == Py_None ? nullptr : PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, i));
    if (v == nullptr) {
      if (PyErr_Occurred()) {
        Py_DECREF(vals);
        return nullptr;
      }
      v = PyTuple_GET_ITEM(defaults, i);
    }
    Py_INCREF(v);
    PyList_SET_ITEM(vals, k, v);
  }
  return vals;
}

PyObject* scan_values(PyObject* plan, PyObject* spec, PyObject* vals) {
  if (!PyList_Check(vals)) {
    PyErr_SetString(PyExc_TypeError, "scan(plan, vals: list)");
    return nullptr;
  }
  PyObject* kinds = PyTuple_GET_ITEM(spec, CSPEC_KINDS);
  PyObject* mutated = PyTuple_GET_ITEM(spec, CSPEC_MUTATED);  // indices of the arguments the op writes
  const bool mutable_ = PyTuple_GET_SIZE(mutated) > 0;
  std::vector<Py_ssize_t> mut_recs;  // positions in s.recs of the written tensors' records
  const bool python_only = PyTuple_GET_ITEM(spec, CSPEC_PYTHON_ONLY) == Py_True;
  const bool factory = PyTuple_GET_ITEM(spec, CSPEC_FACTORY) == Py_True;
  const Py_ssize_t n = PyList_GET_SIZE(vals);
  if (python_only || PyTuple_GET_SIZE(kinds) < n) Py_RETURN_NONE;
  Scan s{PyList_New(0), PyList_New(0), mutable_ ? PyList_New(0) : nullptr};
  PyObject* parts = PyTuple_New(n + (factory ? 1 : 0));
  PyObject* result = nullptr;
  bool bail = false;
  if (s.bufs == nullptr || s.dyns == nullptr || parts == nullptr || (mutable_ && s.recs == nullptr))
    goto done;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyList_GET_ITEM(vals, i);
    PyObject* p;
    const Py_ssize_t recs_before = mutable_ ? PyList_GET_SIZE(s.recs) : 0;
    switch (PyLong_AsLong(PyTuple_GET_ITEM(kinds, i))) {
      case TENSOR:
      case OPT_TENSOR:
        p = s.tensor(v);
        break;
      case TENSOR_LIST:
      case OPT_TENSOR_LIST:
        p = s.tensor_list(v);
        break;
      case SCALAR:
        p = s.scalar(v);
        break;
      case SCALAR_KEYED:
        p = s.keyed_scalar(v);
        break;
      case SCALAR_LIST:
        p = s.scalar_list(v);
        break;
      case STATIC:
        p = hashable(v);
        break;
      case STATIC_NUMBER:
        p = PyTuple_Pack(2, reinterpret_cast<PyObject*>(Py_TYPE(v)), v);
        break;
      default:  // a generator: only seeded ops use it, and those are python_only
        Py_INCREF(Py_None);
        p = Py_None;
    }
    if (p == nullptr) goto done;
    if (p == BAIL) {
      bail = true;
      goto done;
    }
    PyTuple_SET_ITEM(parts, i, p);
    if (mutable_ && is_member(mutated, i))
      for (Py_ssize_t r = recs_before; r < PyList_GET_SIZE(s.recs); ++r) mut_recs.push_back(r);
  }
  if (s.recs != nullptr && shares_storage(s.recs, mut_recs)) {
    bail = true;
    goto done;
  }
  if (factory) {  // dtype=None factories follow torch.get_default_dtype()
    PyObject* dt = reinterpret_cast<PyObject*>(
        torch::getTHPDtype(c10::typeMetaToScalarType(c10::get_default_dtype())));
    Py_INCREF(dt);
    PyTuple_SET_ITEM(parts, n, dt);
  }
  {
    PyObject* key = PyTuple_Pack(2, plan, parts);
    if (key != nullptr) {
      result = PyTuple_Pack(3, key, s.bufs, s.dyns);
      Py_DECREF(key);
    }
  }
done:
  Py_XDECREF(parts);
  Py_XDECREF(s.bufs);
  Py_XDECREF(s.dyns);
  Py_XDECREF(s.recs);
  if (bail) Py_RETURN_NONE;
  return result;
}

namespace {

// setup(attr, scalars, make_scalar, dynamic, jax_dtypes): the storage attribute's name,
// opcall's device-scalar cache and the function that fills it, _storage.DYNAMIC and the
// dtype map (for offset_is_data).
PyObject* setup(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[1]) || !PyCallable_Check(args[2]) ||
      !PyDict_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "setup(attr: str, scalars: dict, make_scalar: callable, dynamic: str, jax_dtypes: dict)");
    return nullptr;
  }
  Py_XDECREF(g_dynamic);
  Py_XDECREF(g_jax_dtypes);
  Py_INCREF(args[3]);
  Py_INCREF(args[4]);
  g_dynamic = args[3];
  g_jax_dtypes = args[4];
  Py_XDECREF(g_record_attr);
  Py_XDECREF(g_scalars);
  Py_XDECREF(g_make_scalar);
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  Py_INCREF(args[2]);
  g_record_attr = args[0];
  g_scalars = args[1];
  g_make_scalar = args[2];
  if (g_cspec == nullptr) g_cspec = PyUnicode_InternFromString("cspec");
  if (g_eq == nullptr) g_eq = PyUnicode_InternFromString("=");
  if (g_hash == nullptr) g_hash = PyUnicode_InternFromString("#");
  Py_RETURN_NONE;
}

}  // namespace

PyObject* user_line(PyObject*, PyObject*);         // frames.cpp
PyObject* frames_setup(PyObject*, PyObject*);      // frames.cpp
PyObject* is_internal_code(PyObject*, PyObject*);  // frames.cpp

namespace {

PyMethodDef g_methods[] = {
    {"scan_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(setup)), METH_FASTCALL,
     "scan_setup(attr, scalars, make_scalar, dynamic, jax_dtypes): the storage attribute, the device-scalar cache and its filler, the dynamic-offset marker and the dtype map"},
    {"normalize", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(normalize)), METH_FASTCALL,
     "normalize(plan, args, kwargs) -> the argument values in schema order, defaults filled in"},
    {"scan", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(scan)), METH_FASTCALL,
     "scan(plan, vals) -> (key, bufs, dyns), or None where OpPlan.scan's Python must do it"},
    {"user_line", user_line, METH_NOARGS,
     "user_line() -> (file, line) of the innermost caller whose code is not internal"},
    {"frames_setup", frames_setup, METH_O,
     "frames_setup(prefixes): the directories whose code is internal (torch's, torch_tpu's)"},
    {"is_internal_code", is_internal_code, METH_O,
     "is_internal_code(code) -> whether the code is torch's, torch_tpu's or importlib's"},
    {nullptr, nullptr, 0, nullptr}};

// _C.CONTRACTS["kinds"]: name -> number
PyObject* kinds_contract() {
  PyObject* d = PyDict_New();
  for (int k = 0; d != nullptr && k < N_KINDS; ++k) {
    PyObject* v = PyLong_FromLong(k);
    if (v == nullptr || PyDict_SetItemString(d, kKindNames[k], v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

// _C.CONTRACTS["cspec"]: the field names, in order
PyObject* cspec_contract() {
  PyObject* t = PyTuple_New(CSPEC_SIZE);
  for (int i = 0; t != nullptr && i < CSPEC_SIZE; ++i) {
    PyObject* s = PyUnicode_FromString(kCSpecNames[i]);
    if (s == nullptr) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

}  // namespace

void add_scan_functions(PyObject* module) {
  if (PyModule_AddFunctions(module, g_methods) < 0) throw std::runtime_error("scan functions");
  add_contract(module, "kinds", kinds_contract());
  add_contract(module, "cspec", cspec_contract());
  add_names(module, "attributes", "OpPlan", {"cspec"});  // g_cspec
}

}  // namespace torch_tpu
