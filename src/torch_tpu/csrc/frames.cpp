// Which Python code is the user's: the one rule of torch_tpu/_frames.py, which Debug's
// messages and DeferAndFuse's flush errors both use.
//
// is_internal_code(code): the code object's file lies under one of the directories given
// to frames_setup (torch's and torch_tpu's), or is frozen importlib code.
//
// user_line() -> (file, line) of the innermost calling Python frame that is not internal,
// or ("<autograd>", 0) when there is none (an op the autograd engine runs from C++).
// DeferAndFuse keeps it per recorded node, to name the user's line in an error raised at
// the flush. It runs once per recorded op, so it must be cheap:
//   - whether a code object is internal is cached per code object (held, so that its
//     address is not reused while cached);
//   - on CPython 3.11 the walk reads the interpreter's own frame records, and the line
//     number is cached per (code object, instruction); the public API instead makes a
//     frame object for every frame it passes (~0.5 us per op). Other versions use it.
#include <Python.h>
#include <frameobject.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define TPU_INTERPRETER_FRAMES 1
#endif

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_tpu {
namespace {

std::unordered_map<PyObject*, bool> g_internal;  // code object -> internal
std::vector<std::string> g_prefixes;             // from frames_setup

bool internal_file(const char* name) {
  if (std::strncmp(name, "<frozen", 7) == 0) return true;  // importlib's bootstrap
  for (const std::string& p : g_prefixes)
    if (std::strncmp(name, p.data(), p.size()) == 0) return true;
  return false;
}

bool internal(PyCodeObject* code) {
  auto it = g_internal.find(reinterpret_cast<PyObject*>(code));
  if (it != g_internal.end()) return it->second;
  const char* name = PyUnicode_AsUTF8(code->co_filename);
  const bool in = name != nullptr && internal_file(name);
  if (name == nullptr) PyErr_Clear();
  Py_INCREF(code);
  g_internal.emplace(reinterpret_cast<PyObject*>(code), in);
  return in;
}

#ifdef TPU_INTERPRETER_FRAMES
struct PairHash {
  size_t operator()(const std::pair<PyObject*, int>& k) const {
    return std::hash<void*>()(k.first) ^ (static_cast<size_t>(k.second) * 0x9E3779B97F4A7C15ull);
  }
};
// (code object, instruction index) -> (file, line); the code objects are held by g_internal
std::unordered_map<std::pair<PyObject*, int>, PyObject*, PairHash> g_lines;
#endif

// generated code (fx, exec) makes new code objects: bound what the caches hold (the line
// cache goes with the code objects it is keyed by)
void clear_caches(bool lines, bool codes) {
#ifdef TPU_INTERPRETER_FRAMES
  if (lines || codes) {
    for (auto& kv : g_lines) Py_DECREF(kv.second);
    g_lines.clear();
  }
#endif
  if (codes) {
    for (auto& kv : g_internal) Py_DECREF(kv.first);
    g_internal.clear();
  }
}

void bound_caches() {
#ifdef TPU_INTERPRETER_FRAMES
  clear_caches(g_lines.size() > 100000, g_internal.size() > 10000);
#else
  clear_caches(false, g_internal.size() > 10000);
#endif
}

}  // namespace

// frames_setup(prefixes): the directories whose code is internal (torch's, torch_tpu's),
// each ending in the path separator.
PyObject* frames_setup(PyObject*, PyObject* prefixes) {
  PyObject* seq = PySequence_Fast(prefixes, "frames_setup(prefixes: a sequence of str)");
  if (seq == nullptr) return nullptr;
  std::vector<std::string> out;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* p = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    if (p == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    out.emplace_back(p);
  }
  Py_DECREF(seq);
  g_prefixes = std::move(out);
  clear_caches(true, true);  // what was cached followed the old rule
  Py_RETURN_NONE;
}

// is_internal_code(code) -> bool
PyObject* is_internal_code(PyObject*, PyObject* code) {
  if (!PyCode_Check(code)) {
    PyErr_SetString(PyExc_TypeError, "is_internal_code(code: a code object)");
    return nullptr;
  }
  bound_caches();
  return PyBool_FromLong(internal(reinterpret_cast<PyCodeObject*>(code)));
}

PyObject* user_line(PyObject*, PyObject*) {
  bound_caches();
#ifdef TPU_INTERPRETER_FRAMES
  for (_PyInterpreterFrame* f = PyThreadState_Get()->cframe->current_frame; f != nullptr; f = f->previous) {
    if (_PyFrame_IsIncomplete(f) || internal(f->f_code)) continue;
    const std::pair<PyObject*, int> key(reinterpret_cast<PyObject*>(f->f_code), _PyInterpreterFrame_LASTI(f));
    auto it = g_lines.find(key);
    if (it == g_lines.end()) {
      const int line = PyCode_Addr2Line(f->f_code, key.second * static_cast<int>(sizeof(_Py_CODEUNIT)));
      PyObject* where = Py_BuildValue("(Oi)", f->f_code->co_filename, line);
      if (where == nullptr) return nullptr;
      it = g_lines.emplace(key, where).first;
    }
    Py_INCREF(it->second);
    return it->second;
  }
#else
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);
    if (!internal(code)) {
      PyObject* out = Py_BuildValue("(Oi)", code->co_filename, PyFrame_GetLineNumber(f));
      Py_DECREF(code);
      Py_DECREF(f);
      return out;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
#endif
  return Py_BuildValue("(si)", "<autograd>", 0);
}

}  // namespace torch_tpu
