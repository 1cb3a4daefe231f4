// What C and Python must agree on by position or by name, declared once on the C side
// and exported as the dict `_C.CONTRACTS`; tests/unit/test_c_contracts.py checks each entry
// against its Python counterpart:
//   "kinds"       argument kind -> number (lowering/schema.py KINDS), from the list below
//   "cspec"       the field order of a plan's cspec tuple (op/opcall.py CSpec)
//   "key_layout"  the sections of DeferAndFuse's graph key (graph.cpp; eager/fuse.py _decode)
//   "slots"       class -> the __slots__ attributes C reads at their offsets (slots.h)
//   "methods"     class -> the Python methods C calls by name (kernel.cpp)
//   "attributes"  class -> the other attributes C reads by name (scan.cpp, kernel.cpp)
#pragma once

#include <Python.h>

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace torch_tpu {

// Argument kinds, numbered in this order. The order matters to both sides: kind <=
// OPT_TENSOR is "one tensor", kind <= OPT_TENSOR_LIST (scalars ruled out) "a tensor list".
#define TPU_ARG_KINDS(X) \
  X(TENSOR) X(OPT_TENSOR) X(TENSOR_LIST) X(OPT_TENSOR_LIST) X(SCALAR) X(SCALAR_LIST) \
  X(GENERATOR) X(STATIC) X(STATIC_NUMBER) X(SCALAR_KEYED)

#define TPU_ENUM_ITEM(k) k,
enum Kind { TPU_ARG_KINDS(TPU_ENUM_ITEM) N_KINDS };
#undef TPU_ENUM_ITEM
#define TPU_NAME_ITEM(k) #k,
inline constexpr const char* kKindNames[N_KINDS] = {TPU_ARG_KINDS(TPU_NAME_ITEM)};
#undef TPU_NAME_ITEM

// The fields of OpPlan.cspec, what scan.cpp and kernel.cpp read of a plan, by position.
#define TPU_CSPEC_FIELDS(X)                                                             \
  X(CSPEC_KINDS, "kinds")             /* the argument kinds */                          \
  X(CSPEC_MUTATED, "mutated")         /* indices of the arguments the op writes */      \
  X(CSPEC_PYTHON_ONLY, "python_only") /* True: scan returns None (seeded ops) */        \
  X(CSPEC_NPOS, "npos")               /* how many arguments are positional */           \
  X(CSPEC_NAMES, "names")             /* every argument's name */                       \
  X(CSPEC_DEFAULTS, "defaults")       /* every argument's default (None if none) */     \
  X(CSPEC_FACTORY, "factory")         /* no tensor argument: the key ends with the default dtype */

#define TPU_ENUM_FIELD(e, name) e,
enum CSpecField { TPU_CSPEC_FIELDS(TPU_ENUM_FIELD) CSPEC_SIZE };
#undef TPU_ENUM_FIELD
#define TPU_NAME_FIELD(e, name) name,
inline constexpr const char* kCSpecNames[CSPEC_SIZE] = {TPU_CSPEC_FIELDS(TPU_NAME_FIELD)};
#undef TPU_NAME_FIELD

// _C.CONTRACTS (borrowed), made on first use.
inline PyObject* contracts(PyObject* module) {
  PyObject* d = PyObject_GetAttrString(module, "CONTRACTS");
  if (d != nullptr) {
    Py_DECREF(d);  // the module holds it
    return d;
  }
  PyErr_Clear();
  d = PyDict_New();
  if (d == nullptr || PyModule_AddObject(module, "CONTRACTS", d) < 0) {
    Py_XDECREF(d);
    throw std::runtime_error("_C.CONTRACTS");
  }
  return d;
}

// CONTRACTS[key] = value (a new reference, consumed).
inline void add_contract(PyObject* module, const char* key, PyObject* value) {
  if (value == nullptr || PyDict_SetItemString(contracts(module), key, value) < 0) {
    Py_XDECREF(value);
    throw std::runtime_error(std::string("_C.CONTRACTS[") + key + "]");
  }
  Py_DECREF(value);
}

// CONTRACTS[section][cls] gains `names` (kept as a sorted tuple: several files add to one
// class).
inline void add_names(PyObject* module, const char* section, const char* cls,
                      std::initializer_list<const char*> names) {
  PyObject* sec = PyDict_GetItemString(contracts(module), section);  // borrowed
  if (sec == nullptr) {
    add_contract(module, section, PyDict_New());
    sec = PyDict_GetItemString(contracts(module), section);
  }
  PyObject* old = PyDict_GetItemString(sec, cls);  // borrowed
  PyObject* set = PySet_New(old);
  bool ok = set != nullptr;
  for (const char* n : names) {
    PyObject* s = ok ? PyUnicode_FromString(n) : nullptr;
    ok = s != nullptr && PySet_Add(set, s) == 0;
    Py_XDECREF(s);
  }
  PyObject* list = ok ? PySequence_List(set) : nullptr;
  PyObject* tuple = list != nullptr && PyList_Sort(list) == 0 ? PyList_AsTuple(list) : nullptr;
  ok = tuple != nullptr && PyDict_SetItemString(sec, cls, tuple) == 0;
  Py_XDECREF(set);
  Py_XDECREF(list);
  Py_XDECREF(tuple);
  if (!ok) throw std::runtime_error(std::string("_C.CONTRACTS[") + section + "]");
}

}  // namespace torch_tpu
