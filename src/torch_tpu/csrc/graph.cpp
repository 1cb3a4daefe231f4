// DeferAndFuse's pending graph in C: the Node and Lazy types (eager/defer.py documents
// them), recording one op's node and result tensors, and the flush's first pass over the
// graph. These run once per recorded op or node; in Python they cost several
// microseconds each, more than the rest of recording an op.
//
// record(nodes, entry, bufs, dyns, vals) appends the op's Node to `nodes` and returns
// what the op returns: new tensors for its fresh results, each storage holding a Lazy
// (this node's output) as its buffer record, and Lazy records for the storages it
// mutates. The Python it replaces is DeferExecutor.execute's tail (eager/defer.py).
//
// flush_plan(nodes, donate) numbers the nodes, wires the graph and keys it (fuse.flush's
// first step).
//
// Also here: replace_buffers (the storages a compiled program or a flush wrote),
// program_results (a compiled program's output tensors) and release (flushed nodes). How
// an op's results become tensors and buffer records, for recording and for Strict's
// run_op alike, is results.h.
#include <Python.h>
#include <structmember.h>

#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "contracts.h"
#include "results.h"
#include "slots.h"

namespace torch_tpu {

PyObject* user_line(PyObject*, PyObject*);                                          // scan.cpp
void mark_realized(const c10::Storage& storage);  // memory.cpp: count the storage's bytes as allocated device memory

namespace {

struct NodeObject {
  PyObject_HEAD
  PyObject* entry;  // the op's cached Entry (its traceable body, result specs)
  PyObject* bufs;   // input buffers: jax arrays or Lazy values, in the entry's order
  PyObject* dyns;   // dynamic scalars (learning rates, RNG seed and offset)
  PyObject* outs;   // a Lazy per output
  PyObject* frame;  // (file, line) of the user code that recorded it, for errors
  Py_ssize_t pos;   // index in its graph, set at the flush
};

struct LazyObject {
  PyObject_HEAD
  PyObject* node;   // the node that will produce this flat buffer
  Py_ssize_t idx;   // which of its outputs
  PyObject* owner;  // weakref to the storage object whose buffer record holds this value
};

PyTypeObject* g_node_type = nullptr;
PyTypeObject* g_lazy_type = nullptr;
PyObject* g_names[3];  // "fresh" (an assemble tag), "dtype", "size"

enum { N_FRESH, N_DTYPE, N_SIZE };

NodeObject* new_node(PyObject* entry, PyObject* bufs, PyObject* dyns, PyObject* frame) {
  auto* n = reinterpret_cast<NodeObject*>(g_node_type->tp_alloc(g_node_type, 0));
  if (n == nullptr) return nullptr;
  n->outs = PyList_New(0);
  if (n->outs == nullptr) {
    Py_DECREF(n);
    return nullptr;
  }
  Py_INCREF(entry);
  Py_INCREF(bufs);
  Py_INCREF(dyns);
  Py_INCREF(frame);
  n->entry = entry;
  n->bufs = bufs;
  n->dyns = dyns;
  n->frame = frame;
  return n;
}

// A new Lazy for the next output of `node`, owned by storage `st`, appended to its outs.
PyObject* new_lazy(NodeObject* node, PyObject* st) {
  auto* l = reinterpret_cast<LazyObject*>(g_lazy_type->tp_alloc(g_lazy_type, 0));
  if (l == nullptr) return nullptr;
  l->owner = PyWeakref_NewRef(st, nullptr);
  if (l->owner == nullptr || PyList_Append(node->outs, reinterpret_cast<PyObject*>(l)) < 0) {
    Py_DECREF(l);
    return nullptr;
  }
  Py_INCREF(node);
  l->node = reinterpret_cast<PyObject*>(node);
  l->idx = PyList_GET_SIZE(node->outs) - 1;
  return reinterpret_cast<PyObject*>(l);
}

// ------------------------------------------------------------ the two types
PyObject* node_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  PyObject *entry, *bufs, *dyns, *frame;
  static const char* kw[] = {"entry", "bufs", "dyns", "frame", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Node", const_cast<char**>(kw), &entry, &bufs,
                                   &dyns, &frame))
    return nullptr;
  return reinterpret_cast<PyObject*>(new_node(entry, bufs, dyns, frame));
}

int node_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* n = reinterpret_cast<NodeObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(n->entry);
  Py_VISIT(n->bufs);
  Py_VISIT(n->dyns);
  Py_VISIT(n->outs);
  Py_VISIT(n->frame);
  return 0;
}

int node_clear(PyObject* self) {
  auto* n = reinterpret_cast<NodeObject*>(self);
  Py_CLEAR(n->entry);
  Py_CLEAR(n->bufs);
  Py_CLEAR(n->dyns);
  Py_CLEAR(n->outs);
  Py_CLEAR(n->frame);
  return 0;
}

void node_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  node_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef node_members[] = {
    {"entry", T_OBJECT, offsetof(NodeObject, entry), 0, nullptr},
    {"bufs", T_OBJECT, offsetof(NodeObject, bufs), 0, nullptr},
    {"dyns", T_OBJECT, offsetof(NodeObject, dyns), 0, nullptr},
    {"outs", T_OBJECT, offsetof(NodeObject, outs), 0, nullptr},
    {"frame", T_OBJECT, offsetof(NodeObject, frame), 0, nullptr},
    {"pos", T_PYSSIZET, offsetof(NodeObject, pos), 0, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot node_slots[] = {
    {Py_tp_doc, const_cast<char*>("Node(entry, bufs, dyns, frame): one recorded op of a pending graph")},
    {Py_tp_new, reinterpret_cast<void*>(node_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(node_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(node_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(node_clear)},
    {Py_tp_members, node_members},
    {0, nullptr}};

PyType_Spec node_spec = {"torch_tpu._C.Node", sizeof(NodeObject), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, node_slots};

PyObject* lazy_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  PyObject *node, *owner;
  Py_ssize_t idx;
  static const char* kw[] = {"node", "idx", "owner", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OnO:Lazy", const_cast<char**>(kw), &node, &idx, &owner))
    return nullptr;
  auto* l = reinterpret_cast<LazyObject*>(g_lazy_type->tp_alloc(g_lazy_type, 0));
  if (l == nullptr) return nullptr;
  Py_INCREF(node);
  Py_INCREF(owner);
  l->node = node;
  l->idx = idx;
  l->owner = owner;
  return reinterpret_cast<PyObject*>(l);
}

int lazy_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* l = reinterpret_cast<LazyObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(l->node);
  Py_VISIT(l->owner);
  return 0;
}

int lazy_clear(PyObject* self) {
  auto* l = reinterpret_cast<LazyObject*>(self);
  Py_CLEAR(l->node);
  Py_CLEAR(l->owner);
  return 0;
}

void lazy_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  lazy_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef lazy_members[] = {
    {"node", T_OBJECT, offsetof(LazyObject, node), 0, nullptr},
    {"idx", T_PYSSIZET, offsetof(LazyObject, idx), 0, nullptr},
    {"owner", T_OBJECT, offsetof(LazyObject, owner), 0, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot lazy_slots[] = {
    {Py_tp_doc, const_cast<char*>("Lazy(node, idx, owner): a flat buffer a pending node will produce")},
    {Py_tp_new, reinterpret_cast<void*>(lazy_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(lazy_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(lazy_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(lazy_clear)},
    {Py_tp_members, lazy_members},
    {0, nullptr}};

PyType_Spec lazy_spec = {"torch_tpu._C.Lazy", sizeof(LazyObject), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, lazy_slots};

// ------------------------------------------------------------ recording
PyObject* record(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if ((nargs != 5 && nargs != 6) || !PyList_Check(args[0]) || !PyList_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "record(nodes, entry, bufs, dyns, vals: list[, held])");
    return nullptr;
  }
  PyObject *nodes = args[0], *entry = args[1], *vals = args[4];
  PyObject* held = nargs == 6 ? args[5] : Py_None;
  PyObject* frame = user_line(nullptr, nullptr);
  if (frame == nullptr) return nullptr;
  NodeObject* node = new_node(entry, args[2], args[3], frame);
  Py_DECREF(frame);
  if (node == nullptr) return nullptr;
  PyObject* specs = g_fresh.get(entry);
  PyObject* recs = g_out_recs.get(entry);
  PyObject* slots = g_mut_slots.get(entry);
  PyObject* structure = g_structure.get(entry);
  PyObject* fresh = PyList_New(0);
  PyObject* result = nullptr;
  if (specs != nullptr && recs != nullptr && slots != nullptr && structure != nullptr &&
      fresh != nullptr && PyList_Check(specs) && PyList_Check(recs) && PyList_Check(slots) &&
      PyTuple_Check(structure) && PyList_Append(nodes, reinterpret_cast<PyObject*>(node)) == 0 &&
      store_fresh(specs, recs, fresh, [node](Py_ssize_t, PyObject* st) { return new_lazy(node, st); }) &&
      store_mutated(slots, vals, [node](Py_ssize_t, PyObject* st) { return new_lazy(node, st); }) &&
      hold_fresh(held, fresh)) {
    result = assemble(structure, vals, fresh);
  } else if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_TypeError, "record: malformed entry");
  }
  Py_XDECREF(specs);
  Py_XDECREF(recs);
  Py_XDECREF(slots);
  Py_XDECREF(structure);
  Py_XDECREF(fresh);
  Py_DECREF(node);
  return result;
}

// ------------------------------------------------------------ flushing
// Whether a node's scalar is an integer: a Python int, or a device scalar of an integer
// dtype (flush_plan passes those per slot).
bool integral(PyObject* d) {
  if (PyLong_CheckExact(d)) return true;
  if (PyFloat_CheckExact(d)) return false;
  PyObject* dt = PyObject_GetAttr(d, g_names[N_DTYPE]);
  PyObject* kind = dt == nullptr ? nullptr : PyObject_GetAttrString(dt, "kind");
  Py_XDECREF(dt);
  if (kind == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool whole = PyUnicode_Check(kind) && (PyUnicode_CompareWithASCIIString(kind, "i") == 0 ||
                                               PyUnicode_CompareWithASCIIString(kind, "u") == 0);
  Py_DECREF(kind);
  return whole;
}

// flush_plan(nodes, donate) -> (key, ext, dyns, storages, donated):
//   node.pos = its index; each node's inputs wired to an external buffer (an index into
//   `ext`, the distinct external buffers) or to an earlier node's output; node.bufs
//   dropped, so that from here on only `ext` holds the inputs; the values a live storage
//   still holds become the graph's outputs, in the order of `storages`.
//   dyns: the distinct scalar objects the nodes take (a cached device scalar is one object
//   per value: AdamW's per-parameter lists repeat one bias correction), each passed once;
//   an integer (a Python int, or a device scalar of an integer dtype: a view's offset
//   passed as data, a length, a seed) is passed per slot instead. Equal integers coincide
//   by chance (nanoGPT's sampling loop: its window's start meets the attention's
//   q/k/v offsets at 64 once), and a key that followed them compiled a graph per pattern.
//   donated: indices of external buffers the graph overwrote and nothing else holds
//   (their only reference left is `ext`), at most one per output of the same length and
//   dtype (XLA reuses a donated buffer only for such an output).
//   key: the graph's identity as bytes of int64 (hashed and compared at memcmp speed;
//   fuse.py decodes it when the graph is new):
//     n_nodes, per node (entry id, n_inputs, input...), n_outputs, output...,
//     n_slots, the index in dyns of each node's scalars in order..., n_dyns,
//     dyn type id..., n_donated, donated...
//   where an input is an ext index (>= 0) or ~(node << 20 | output), an output is
//   (node << 20 | output), and a dyn type is the id of the scalar's dtype (or Python
//   type: seeds and offsets). Entries stay alive in their plan's cache, dtypes and types
//   are interned: their ids are stable keys.
//   This layout is exported as _C.CONTRACTS["key_layout"] (add_graph_functions).
constexpr int kOutBits = 20;

PyObject* flush_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "flush_plan(nodes: list, donate: bool)");
    return nullptr;
  }
  PyObject* nodes = args[0];
  const bool donate = PyObject_IsTrue(args[1]) == 1;
  const Py_ssize_t n = PyList_GET_SIZE(nodes);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PyList_GET_ITEM(nodes, i);
    if (Py_TYPE(o) != g_node_type) {
      PyErr_SetString(PyExc_TypeError, "flush_plan: not a Node");
      return nullptr;
    }
    reinterpret_cast<NodeObject*>(o)->pos = i;
  }
  std::vector<int64_t> key;
  key.reserve(8 * n + 64);
  key.push_back(n);
  std::unordered_map<PyObject*, int64_t> ext_index;
  // the distinct scalar objects -> their index in dyns, or -1: an integer, passed per slot
  std::unordered_map<PyObject*, int64_t> dyn_index;
  std::vector<int64_t> dyn_slots;                     // each node's scalars, in order
  // outputs no donated buffer took yet, by (length, dtype): numpy's dtypes are singletons
  std::map<std::pair<int64_t, PyObject*>, int64_t> free_slots;
  PyObject* ext = PyList_New(0);
  PyObject* dyns = PyList_New(0);
  PyObject* storages = PyList_New(0);
  PyObject* donated = PyList_New(0);
  PyObject* result = nullptr;
  std::vector<int64_t> outs;
  if (!ext || !dyns || !storages || !donated) goto done;
  for (Py_ssize_t i = 0; i < n; ++i) {
    auto* node = reinterpret_cast<NodeObject*>(PyList_GET_ITEM(nodes, i));
    if (!PyList_Check(node->bufs) || !PyList_Check(node->dyns)) {
      PyErr_SetString(PyExc_TypeError, "flush_plan: node flushed twice");
      goto done;
    }
    const Py_ssize_t nb = PyList_GET_SIZE(node->bufs);
    key.push_back(reinterpret_cast<int64_t>(node->entry));
    key.push_back(nb);
    for (Py_ssize_t k = 0; k < nb; ++k) {
      PyObject* b = PyList_GET_ITEM(node->bufs, k);
      if (Py_TYPE(b) == g_lazy_type) {
        auto* l = reinterpret_cast<LazyObject*>(b);
        key.push_back(~((reinterpret_cast<NodeObject*>(l->node)->pos << kOutBits) | l->idx));
        continue;
      }
      auto it = ext_index.find(b);
      if (it == ext_index.end()) {
        it = ext_index.emplace(b, PyList_GET_SIZE(ext)).first;
        if (PyList_Append(ext, b) < 0) goto done;
      }
      key.push_back(it->second);
    }
    const Py_ssize_t nd = PyList_GET_SIZE(node->dyns);
    for (Py_ssize_t k = 0; k < nd; ++k) {
      PyObject* d = PyList_GET_ITEM(node->dyns, k);
      auto it = dyn_index.find(d);
      if (it == dyn_index.end()) {
        const bool shared = !integral(d);
        it = dyn_index.emplace(d, shared ? PyList_GET_SIZE(dyns) : -1).first;
        if (shared && PyList_Append(dyns, d) < 0) goto done;
      }
      if (it->second < 0) {  // an integer: never shared (see the top)
        dyn_slots.push_back(PyList_GET_SIZE(dyns));
        if (PyList_Append(dyns, d) < 0) goto done;
      } else {
        dyn_slots.push_back(it->second);
      }
    }
    Py_INCREF(Py_None);
    Py_SETREF(node->bufs, Py_None);
  }
  // outputs: values a live storage still holds
  for (Py_ssize_t i = 0; i < n; ++i) {
    auto* node = reinterpret_cast<NodeObject*>(PyList_GET_ITEM(nodes, i));
    const Py_ssize_t no = PyList_GET_SIZE(node->outs);
    for (Py_ssize_t k = 0; k < no; ++k) {
      auto* l = reinterpret_cast<LazyObject*>(PyList_GET_ITEM(node->outs, k));
      PyObject* st = PyWeakref_GetObject(l->owner);  // borrowed
      if (st == nullptr) goto done;
      if (st == Py_None) continue;
      PyObject* rec = PyObject_GetAttr(st, g_record_attr);
      if (rec == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto done;
        PyErr_Clear();
        continue;
      }
      const bool live = PyTuple_Check(rec) && PyTuple_GET_SIZE(rec) == 3 &&
                        PyTuple_GET_ITEM(rec, 0) == reinterpret_cast<PyObject*>(l);
      if (live && donate)
        ++free_slots[{PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1)), PyTuple_GET_ITEM(rec, 2)}];
      Py_DECREF(rec);
      if (!live) continue;
      outs.push_back((i << kOutBits) | l->idx);
      if (PyList_Append(storages, st) < 0) goto done;
    }
  }
  key.push_back(static_cast<int64_t>(outs.size()));
  key.insert(key.end(), outs.begin(), outs.end());
  key.push_back(static_cast<int64_t>(dyn_slots.size()));
  key.insert(key.end(), dyn_slots.begin(), dyn_slots.end());
  {
    const Py_ssize_t nd = PyList_GET_SIZE(dyns);
    key.push_back(nd);
    for (Py_ssize_t k = 0; k < nd; ++k) {
      PyObject* d = PyList_GET_ITEM(dyns, k);
      PyObject* t = reinterpret_cast<PyObject*>(Py_TYPE(d));
      if (!PyLong_CheckExact(d) && !PyFloat_CheckExact(d)) {  // not a seed or offset
        PyObject* dt = PyObject_GetAttr(d, g_names[N_DTYPE]);
        if (dt == nullptr) {
          PyErr_Clear();
        } else {
          t = dt;
          Py_DECREF(dt);  // numpy's dtypes are singletons: the id outlives this reference
        }
      }
      key.push_back(reinterpret_cast<int64_t>(t));
    }
  }
  {
    // donations: external buffers only `ext` references, matched to free outputs
    const size_t at = key.size();
    key.push_back(0);
    const Py_ssize_t ne = donate ? PyList_GET_SIZE(ext) : 0;
    for (Py_ssize_t j = 0; j < ne && !free_slots.empty(); ++j) {
      PyObject* b = PyList_GET_ITEM(ext, j);
      if (Py_REFCNT(b) != 1) continue;
      PyObject* size = PyObject_GetAttr(b, g_names[N_SIZE]);
      PyObject* dt = size ? PyObject_GetAttr(b, g_names[N_DTYPE]) : nullptr;
      if (dt == nullptr) {
        Py_XDECREF(size);
        goto done;
      }
      auto it = free_slots.find({PyLong_AsLongLong(size), dt});
      Py_DECREF(size);
      Py_DECREF(dt);  // a singleton: the pointer stays valid as a key
      if (it == free_slots.end()) continue;
      if (--it->second == 0) free_slots.erase(it);
      key.push_back(j);
      PyObject* jj = PyLong_FromSsize_t(j);
      const int rc = jj ? PyList_Append(donated, jj) : -1;
      Py_XDECREF(jj);
      if (rc < 0) goto done;
    }
    key[at] = static_cast<int64_t>(key.size() - at - 1);
  }
  {
    PyObject* kb = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(key.data()),
                                             static_cast<Py_ssize_t>(key.size() * sizeof(int64_t)));
    PyObject* don = kb ? PyList_AsTuple(donated) : nullptr;
    if (don != nullptr) result = PyTuple_Pack(5, kb, ext, dyns, storages, don);
    Py_XDECREF(kb);
    Py_XDECREF(don);
  }
done:
  Py_XDECREF(ext);
  Py_XDECREF(dyns);
  Py_XDECREF(storages);
  Py_XDECREF(donated);
  return result;
}

// release(nodes): after a flush, drop each node's frame and outputs, breaking the
// node <-> Lazy cycles so that refcounting frees them now.
PyObject* release(PyObject*, PyObject* nodes) {
  if (!PyList_Check(nodes)) {
    PyErr_SetString(PyExc_TypeError, "release(nodes: list)");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); ++i) {
    PyObject* o = PyList_GET_ITEM(nodes, i);
    if (Py_TYPE(o) != g_node_type) continue;
    auto* node = reinterpret_cast<NodeObject*>(o);
    Py_INCREF(Py_None);
    Py_SETREF(node->frame, Py_None);
    Py_INCREF(Py_None);
    Py_SETREF(node->outs, Py_None);
  }
  Py_RETURN_NONE;
}

// ------------------------------------------------------------ after a compiled program
// replace_buffers(storages, indices, bufs): storages[indices[k]] now holds bufs[k] (same
// length and dtype): the storages a compiled graph wrote (compile/program.py); indices
// None: storages[k] holds bufs[k] (a DeferAndFuse flush's outputs). A storage whose buffer
// was still pending becomes real memory (_storage.set_buffer does the same).
PyObject* replace_buffers(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  const bool all = nargs == 3 && args[1] == Py_None;
  if (nargs != 3 || !PyList_Check(args[0]) || !(all || PyList_Check(args[1])) || !PyList_Check(args[2]) ||
      PyList_GET_SIZE(args[2]) < PyList_GET_SIZE(all ? args[0] : args[1])) {
    PyErr_SetString(PyExc_TypeError, "replace_buffers(storages, indices or None, bufs: lists)");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(all ? args[0] : args[1]);
  for (Py_ssize_t k = 0; k < n; ++k) {
    const Py_ssize_t j = all ? k : PyLong_AsSsize_t(PyList_GET_ITEM(args[1], k));
    if (j < 0 || j >= PyList_GET_SIZE(args[0])) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "replace_buffers: storage index");
      return nullptr;
    }
    PyObject* st = PyList_GET_ITEM(args[0], j);
    PyObject* old = PyObject_GetAttr(st, g_record_attr);
    if (old == nullptr) return nullptr;
    const bool pending = Py_TYPE(PyTuple_GET_ITEM(old, 0)) == g_lazy_type;
    const bool ok = set_record(st, PyList_GET_ITEM(args[2], k), PyTuple_GET_ITEM(old, 1), PyTuple_GET_ITEM(old, 2));
    Py_DECREF(old);
    if (!ok) return nullptr;
    if (pending && THPStorage_Check(st))
      mark_realized(THPStorage_Unpack(st));
  }
  Py_RETURN_NONE;
}

// program_results(specs, flat, args) -> a compiled graph's outputs (Program.__call__'s loop,
// compile/program.py, is the reference): per spec, (0, shape, strides or None, dtype, length,
// jax dtype) a new tensor whose storage holds the next of `flat`; (3, i) args[i]; (2, v) v.
// ~1 us an output, against ~5 us in Python (the small Llama's forward returns 47).
PyObject* program_results(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !PyList_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "program_results(specs: tuple, flat, args: list)");
    return nullptr;
  }
  PyObject* flat = PySequence_Fast(args[1], "program_results: flat is a sequence");
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  PyObject* outs = flat == nullptr ? nullptr : PyList_New(n);
  for (Py_ssize_t k = 0, next = 0; outs != nullptr && k < n; ++k) {
    PyObject* spec = PyTuple_GET_ITEM(args[0], k);
    PyObject* r = nullptr;
    const long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (kind == 0 && next < PySequence_Fast_GET_SIZE(flat)) {
      PyObject* pair = empty_with_storage(nullptr, &PySequence_Fast_ITEMS(spec)[1], 3);
      PyObject* st = pair == nullptr ? nullptr : PyTuple_GET_ITEM(pair, 1);
      if (st != nullptr && set_record(st, PySequence_Fast_GET_ITEM(flat, next++), PyTuple_GET_ITEM(spec, 4),
                                      PyTuple_GET_ITEM(spec, 5))) {
        mark_realized(THPStorage_Unpack(st));  // (as _storage.set_buffer)
        r = PyTuple_GET_ITEM(pair, 0);
        Py_INCREF(r);
      }
      Py_XDECREF(pair);
    } else if (kind == 3) {
      r = PyList_GetItem(args[2], PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1)));
      Py_XINCREF(r);
    } else if (kind == 2) {
      r = PyTuple_GET_ITEM(spec, 1);
      Py_INCREF(r);
    } else if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_ValueError, "program_results: a spec of another kind, or too few outputs");
    }
    if (r == nullptr) Py_CLEAR(outs);
    else PyList_SET_ITEM(outs, k, r);
  }
  Py_XDECREF(flat);
  return outs;
}

// assemble(structure, vals, fresh) -> what an op returns (Strict's results too)
PyObject* assemble_py(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "assemble(structure: tuple, vals: list, fresh: list)");
    return nullptr;
  }
  return assemble(args[0], args[1], args[2]);
}

PyMethodDef g_methods[] = {
    {"assemble", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(assemble_py)), METH_FASTCALL,
     "assemble(structure, vals, fresh) -> the op's return value, per its schema's structure"},
    {"replace_buffers", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(replace_buffers)), METH_FASTCALL,
     "replace_buffers(storages, indices or None, bufs): storages[indices[k]] (or storages[k]) now holds bufs[k]"},
    {"program_results", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(program_results)), METH_FASTCALL,
     "program_results(specs, flat, args) -> a compiled graph's outputs: new tensors, inputs, constants"},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(record)), METH_FASTCALL,
     "record(nodes, entry, bufs, dyns, vals[, held]) -> the op's result: appends its pending Node"},
    {"flush_plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(flush_plan)), METH_FASTCALL,
     "flush_plan(nodes, donate) -> (key, ext, dyns, storages, donated)"},
    {"release", release, METH_O, "release(nodes): drop flushed nodes' frames and outputs"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// record, for OpKernel (kernel.cpp)
PyObject* record_op(PyObject* nodes, PyObject* entry, PyObject* bufs, PyObject* dyns, PyObject* vals,
                    PyObject* held) {
  PyObject* args[] = {nodes, entry, bufs, dyns, vals, held};
  return record(nullptr, args, 6);
}

void add_graph_functions(PyObject* module) {
  g_node_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&node_spec));
  g_lazy_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&lazy_spec));
  const char* names[] = {"fresh", "dtype", "size"};
  for (int i = 0; i < 3; ++i) g_names[i] = PyUnicode_InternFromString(names[i]);
  if (g_node_type == nullptr || g_lazy_type == nullptr ||
      PyModule_AddObject(module, "Node", reinterpret_cast<PyObject*>(g_node_type)) < 0 ||
      PyModule_AddObject(module, "Lazy", reinterpret_cast<PyObject*>(g_lazy_type)) < 0 ||
      PyModule_AddFunctions(module, g_methods) < 0)
    throw std::runtime_error("graph types");
  Py_INCREF(g_node_type);  // PyModule_AddObject stole one; these globals keep theirs
  Py_INCREF(g_lazy_type);
  // flush_plan's key, as fuse._decode reads it: int64 words; the node records, then the
  // counted sections in this order
  add_contract(module, "key_layout",
               Py_BuildValue("{s:i,s:i,s:(sss),s:(sssss)}", "word_bytes", static_cast<int>(sizeof(int64_t)),
                             "out_bits", kOutBits, "node", "entry", "n_inputs", "inputs", "sections",
                             "nodes", "outputs", "dyn_slots", "dyn_types", "donated"));
}

}  // namespace torch_tpu
