// DeferAndFuse's loop detector (eager/defer.py): the entry ids recorded since the last
// flush; push(h) reports when the newest 2P ids are one block of P ids repeated and make up
// (nearly) all that was recorded, or the graph reached its size cap. OpKernel (kernel.cpp)
// pushes every op it records in C; Python pushes the others (LoopDetector.push).
//
// It also keeps, beside the ids, how many of them compile apart (an op that is not
// pointwise), as prefix counts, for the compile-cost guard's block search
// (repeated_block). In Python, appending each node's id and flag at the guard's
// checkpoints cost ~0.45 us a node: 2.6 ms of a 79 ms hand-written KV-cache decode loop
// of 5,825 ops (issue 52); here it is one store per push.
#pragma once

#include <Python.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace torch_tpu {

struct LoopObject {
  PyObject_HEAD
  std::vector<uintptr_t>* hist;
  std::vector<int32_t>* apart;  // apart[i]: how many of the first i ids compile apart
  std::unordered_map<uintptr_t, Py_ssize_t>* last;
  Py_ssize_t period, run, min_period, max_nodes;
};

enum Verdict { NONE = 0, LOOP = 1, SIZE_CAP = 2 };

Verdict loop_push(LoopObject* self, uintptr_t h, bool in_backward, bool apart);
void loop_reset(LoopObject* self);
bool is_loop_detector(PyObject* o);
bool add_loop_type(PyObject* module);  // _C.LoopDetector; false with an error set

}  // namespace torch_tpu
