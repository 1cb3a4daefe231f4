// What the two scans share: the eager executors' per-op scan (scan.cpp) and a compiled
// graph's (scan_graph.cpp) read a tensor argument alike (its storage's buffer record, its
// view spec, an offset passed as data) and put a Python number's cached device scalar
// into the call's dynamic arguments alike, so one key means one layout in both.
#pragma once

#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

namespace torch_tpu {

extern PyObject* g_record_attr;  // the storage attribute holding (buffer, length, dtype)

// The outcome of reading one argument: a new reference to its key part, or BAIL (leave
// the call to Python), or nullptr with a Python error set.
inline PyObject* const BAIL = reinterpret_cast<PyObject*>(1);

// The buffer record (buffer, length, dtype) of a tensor's storage, a new reference, with
// the storage object in *st (new reference); BAIL when the storage has none (no buffer
// yet, or not a tpu storage).
PyObject* storage_record(const at::Tensor& t, PyObject** st);

// _storage.offset_is_data: 1 when the view's offset goes to the program as data, 0 when
// it is part of the key, -1 with a Python error set.
int offset_is_data(const at::Tensor& t, PyObject* rec);

// A tensor's key part: (shape, strides, offset, dtype, buffer length, buffer dtype[, extra]).
// With dynamic_offset, the offset is _storage.DYNAMIC and the caller passes it as data.
PyObject* view_part(const at::Tensor& t, PyObject* rec, PyObject* extra, bool dynamic_offset = false);

// A Python number's key part (its type, a new reference); its cached device scalar
// (made through opcall.device_scalar when new) is appended to `dyns`.
PyObject* number_part(PyObject* v, PyObject* dyns);

// Several devices per process: the device an op's values are on (the first tpu tensor's,
// else a factory's `device=` index), -1 when nothing names one; -2 with torch's
// device-mismatch error set when two tpu tensors are on different devices.
int op_device(PyObject* vals, PyObject* name);

}  // namespace torch_tpu
