// Reading an attribute that a Python class declares in __slots__ at its fixed offset.
//
// The recording path reads about eight such attributes per op (an Entry's fn, fresh,
// out_recs, mut_slots and structure; the DeferExecutor's nodes and in_backward). A
// generic getattr costs ~40 ns each (type lookup, descriptor call); this is a type check
// and a load. The offset is looked up once per type, from the class's member descriptor;
// any other object, or a slot not set, takes the generic path.
//
// Each SlotAttr names the Python class whose slot it reads, and every one declared in
// any file is exported as _C.CONTRACTS["slots"] (export_slots), so that a renamed slot
// fails tests/unit/test_c_contracts.py instead of silently taking the slow path.
#pragma once

#include <Python.h>
#include <descrobject.h>
#include <structmember.h>

#include <vector>

#include "contracts.h"

namespace torch_tpu {

class SlotAttr;

// Every SlotAttr of the extension (they are globals: constructed before the module
// initializes).
inline std::vector<const SlotAttr*>& slot_registry() {
  static std::vector<const SlotAttr*> all;
  return all;
}

class SlotAttr {
 public:
  // `cls`: the Python class that declares `name` in its __slots__ (for the contract)
  SlotAttr(const char* cls, const char* name) : cls_(cls), name_(name) {
    slot_registry().push_back(this);
  }

  const char* cls() const { return cls_; }
  const char* name() const { return name_; }

  // A new reference to o.<name>, or nullptr with a Python error set.
  PyObject* get(PyObject* o) {
    PyTypeObject* type = Py_TYPE(o);
    if (type != type_) bind(type);
    if (type == type_) {
      PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset_);
      if (v != nullptr) {
        Py_INCREF(v);
        return v;
      }
    }
    if (key_ == nullptr && (key_ = PyUnicode_InternFromString(name_)) == nullptr) return nullptr;
    return PyObject_GetAttr(o, key_);
  }

 private:
  void bind(PyTypeObject* type) {
    if (key_ == nullptr && (key_ = PyUnicode_InternFromString(name_)) == nullptr) {
      PyErr_Clear();
      return;
    }
    PyObject* d = _PyType_Lookup(type, key_);  // borrowed
    if (d == nullptr || Py_TYPE(d) != &PyMemberDescr_Type) return;
    PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
    if (m->type != T_OBJECT_EX && m->type != T_OBJECT) return;
    Py_INCREF(type);  // held: the cached offset must not outlive the type it belongs to
    Py_XDECREF(reinterpret_cast<PyObject*>(type_));
    type_ = type;
    offset_ = m->offset;
  }

  const char* cls_;
  const char* name_;
  PyObject* key_ = nullptr;
  PyTypeObject* type_ = nullptr;
  Py_ssize_t offset_ = 0;
};

// _C.CONTRACTS["slots"]: class -> the slot names C reads.
inline void export_slots(PyObject* module) {
  for (const SlotAttr* a : slot_registry()) add_names(module, "slots", a->cls(), {a->name()});
}

}  // namespace torch_tpu
