// What the dispatcher and the executors call for each lowered op, beside the device
// itself (tpu_ext.cpp):
// - the boxed kernel through which the dispatcher calls a lowered op's OpKernel;
// - the scaled-dot-product-attention backend choice for tpu tensors;
// - the autocast rules for AutocastPrivateUse1, mirroring CUDA's lists;
// - empty_with_storage, the executors' fast path for a new result tensor.
#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/transformers/attention.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <map>
#include <memory>
#include <string>

namespace torch_tpu {

c10::Allocator* device_allocator();  // memory.cpp

// ---------------------------------------------------------------- attention backend
// F.scaled_dot_product_attention asks a per-device stub (not an op) which kernel to run.
// Without one a tpu tensor gets the math path: ~12 small ops forward and ~20 backward
// per call, each recorded or dispatched on its own. The "overrideable" backend is torch's
// slot for out-of-tree devices: one op forward, one backward (lowering/attention.py),
// with torch's autograd formula between them. Dropout (random), nested tensors, 3-D
// inputs, a mask together with is_causal (torch's error), heads that do not divide, and a
// user who left every fused backend out (torch.nn.attention.sdpa_kernel([MATH])) keep the
// math path. The overrideable op is tpu's flash attention, so a script that names CUDA's
// fused kernels (torchtitan: sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH])) gets
// it too, as it gets flash on CUDA; with the math path there, torchtitan's attention took
// ~550 ms of a 1.0 s step (2 x 512 tokens) against ~80 ms for CPU's flash kernel.
int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> /*scale*/, bool enable_gqa) {
  const auto math = static_cast<int64_t>(at::SDPBackend::math);
  const auto& ctx = at::globalContext();
  if (!(ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
        ctx.userEnabledMemEfficientSDP() || ctx.userEnabledCuDNNSDP()))
    return math;
  if (dropout_p > 0.0 || query.is_nested() || key.is_nested() || value.is_nested()) return math;
  // 4-D only: torch's meta kernel of the fused op breaks on 3-D (H, L, E) inputs
  if (query.dim() != 4 || key.dim() != 4 || value.dim() != 4) return math;
  if (attn_mask.has_value() && attn_mask->defined() && is_causal) return math;
  const int64_t hq = query.size(-3), hk = key.size(-3);
  if (value.size(-3) != hk || (hq != hk && (!enable_gqa || hq % hk != 0))) return math;
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

const bool g_sdp_choice_set = [] {
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice);
  return true;
}();

// ---------------------------------------------------------------- op kernels
// A lowered op's PrivateUse1 kernel is its OpKernel (kernel.cpp), a Python callable. Given
// to torch.library, torch's Python-kernel holder would build an args tuple and a kwargs
// dict from the dispatcher's argument stack, which OpKernel then normalizes back into
// the values in schema order with defaults filled in. The stack already is exactly that,
// so this boxed kernel converts it in place: no tuple, dict or normalize pass. (With the
// allocator (memory.cpp) and csrc/slots.h, recording an op in DeferAndFuse went from ~4.1 to
// ~3.1 us.) Ops with an argument or return type outside the plain set below keep the
// Python holder (register_op_kernel says no).
PyObject* run_op_kernel(PyObject* kernel, PyObject* vals);  // kernel.cpp
bool is_op_kernel(PyObject* o);                             // kernel.cpp

namespace {

c10::TypePtr unwrap_optional(const c10::TypePtr& t) {
  if (auto* o = t->castRaw<c10::OptionalType>()) return o->getElementType();
  return t;
}

// Kinds that may also be list elements.
bool plain_element(c10::TypeKind k) {
  return k == c10::TypeKind::TensorType || k == c10::TypeKind::IntType ||
         k == c10::TypeKind::SymIntType || k == c10::TypeKind::FloatType ||
         k == c10::TypeKind::BoolType || k == c10::TypeKind::NumberType;
}

bool plain_argument(const c10::TypePtr& type) {
  const c10::TypePtr t = unwrap_optional(type);
  switch (t->kind()) {
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
    case c10::TypeKind::DeviceObjType:
    case c10::TypeKind::GeneratorType:
    case c10::TypeKind::StringType:
      return true;
    case c10::TypeKind::ListType:
      return plain_element(unwrap_optional(t->castRaw<c10::ListType>()->getElementType())->kind());
    default:
      return plain_element(t->kind());
  }
}

bool plain_return(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  auto* l = t->castRaw<c10::ListType>();
  return l != nullptr && l->getElementType()->kind() == c10::TypeKind::TensorType;
}

// One argument as the Python kernel would have received it (a new reference).
PyObject* argument_to_py(const c10::Argument& a, c10::IValue&& v) {
  if (v.isNone()) Py_RETURN_NONE;
  PyObject* r;
  switch (unwrap_optional(a.real_type())->kind()) {
    case c10::TypeKind::ScalarTypeType:
      r = reinterpret_cast<PyObject*>(torch::getTHPDtype(v.toScalarType()));
      break;
    case c10::TypeKind::LayoutType:
      r = reinterpret_cast<PyObject*>(torch::getTHPLayout(v.toLayout()));
      break;
    case c10::TypeKind::MemoryFormatType:
      r = torch::utils::getTHPMemoryFormat(v.toMemoryFormat());
      break;
    default:
      return torch::jit::toPyObject(std::move(v)).release().ptr();
  }
  Py_INCREF(r);  // the dtype, layout and memory-format objects are borrowed singletons
  return r;
}

struct OpKernelBoxed final : c10::OperatorKernel {
  explicit OpKernelBoxed(PyObject* k) : kernel(k) { Py_INCREF(k); }  // kept for the process's life

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const c10::FunctionSchema& schema = op.schema();
    const auto& args = schema.arguments();
    const size_t n = args.size();
    py::gil_scoped_acquire gil;
    py::list vals(n);
    auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* v = argument_to_py(args[i], std::move(first[i]));
      if (v == nullptr) throw py::error_already_set();
      PyList_SET_ITEM(vals.ptr(), static_cast<Py_ssize_t>(i), v);
    }
    torch::jit::drop(*stack, n);
    PyObject* out = run_op_kernel(kernel, vals.ptr());
    if (out == nullptr) throw py::error_already_set();
    py::object result = py::reinterpret_steal<py::object>(out);
    const auto& rets = schema.returns();
    if (rets.size() == 1) {
      stack->push_back(torch::jit::toIValue(result, rets[0].real_type()));
    } else {
      for (size_t i = 0; i < rets.size(); ++i)
        stack->push_back(torch::jit::toIValue(result[py::int_(i)], rets[i].real_type()));
    }
  }

  PyObject* kernel;
};

// register_op_kernel(qualified name, overload, kernel) -> whether the boxed kernel took
// the op (False: its types are not all plain; register it through torch.library).
bool register_op_kernel(const std::string& name, const std::string& overload, py::handle kernel) {
  TORCH_CHECK(is_op_kernel(kernel.ptr()), "register_op_kernel: not an OpKernel");
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(handle.has_value(), "register_op_kernel: no operator ", name, ".", overload);
  const c10::FunctionSchema& schema = handle->schema();
  if (schema.is_vararg() || schema.is_varret()) return false;
  for (const auto& a : schema.arguments())
    if (!plain_argument(a.real_type())) return false;
  for (const auto& r : schema.returns())
    if (!plain_return(r.real_type())) return false;
  const auto sep = name.find("::");
  const std::string ns = name.substr(0, sep);
  static std::map<std::string, std::unique_ptr<torch::Library>> libs;  // per namespace, kept
  auto& lib = libs[ns];
  if (!lib)
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                           __FILE__, __LINE__);
  const std::string op_name = name.substr(sep + 2) + (overload.empty() ? "" : "." + overload);
  lib->impl(op_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernelBoxed>(kernel.ptr())));
  return true;
}

}  // namespace

// ---------------------------------------------------------------- autocast
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define _KERNEL_PRIVATEUSEONE_LOW_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(_KERNEL_PRIVATEUSEONE_LOW_PRECISION_FP)
#define _KERNEL_PRIVATEUSEONE_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(_KERNEL_PRIVATEUSEONE_FP32)
#define _KERNEL_PRIVATEUSEONE_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(_KERNEL_PRIVATEUSEONE_FP32_SET_OPT_DTYPE)
#define _KERNEL_PRIVATEUSEONE_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(_KERNEL_PRIVATEUSEONE_PROMOTE)
}

// A new tpu tensor and its storage's Python object, for the executors to attach an XLA
// buffer to: the torch.empty + untyped_storage() pair of every op result, without the
// Python argument parsing and the dispatcher (~3 us -> <1 us per result). A plain
// CPython function: pybind11's argument casting cost as much again.
bool int_vector(PyObject* seq, c10::SmallVector<int64_t, 6>& out) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

PyObject* empty_with_storage(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  c10::SmallVector<int64_t, 6> size, strides;
  if (nargs != 3 || !THPDtype_Check(args[2]) || !int_vector(args[0], size) ||
      (args[1] != Py_None && !int_vector(args[1], strides))) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "empty_with_storage(shape, strides or None, dtype)");
    return nullptr;
  }
  const auto dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  const auto keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  PyObject* storage = nullptr;
  PyObject* tensor = nullptr;
  try {
    at::Tensor t = args[1] == Py_None
        ? at::detail::empty_generic(size, device_allocator(), keys, dtype, std::nullopt)
        : at::detail::empty_strided_generic(size, strides, device_allocator(), keys, dtype);
    storage = THPStorage_Wrap(t.storage());
    if (storage == nullptr) return nullptr;
    tensor = THPVariable_Wrap(std::move(t));
  } catch (...) {  // torch's exception classes (the allocator's torch.OutOfMemoryError)
    Py_XDECREF(storage);
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
  if (tensor == nullptr) {
    Py_DECREF(storage);
    return nullptr;
  }
  PyObject* out = PyTuple_New(2);
  if (out == nullptr) {
    Py_DECREF(tensor);
    Py_DECREF(storage);
    return nullptr;
  }
  PyTuple_SET_ITEM(out, 0, tensor);
  PyTuple_SET_ITEM(out, 1, storage);
  return out;
}

PyMethodDef g_tensor_methods[] = {
    {"empty_with_storage", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(empty_with_storage)),
     METH_FASTCALL, "empty_with_storage(shape, strides or None, dtype) -> (tensor, its storage)"},
    {nullptr, nullptr, 0, nullptr}};

void add_dispatch_functions(PyObject* module) {
  if (PyModule_AddFunctions(module, g_tensor_methods) < 0) throw py::error_already_set();
  py::module_ m = py::reinterpret_borrow<py::module_>(module);
  m.def("register_op_kernel", &register_op_kernel,
        "register_op_kernel(name, overload, kernel) -> bool: the dispatcher calls the OpKernel "
        "directly (False: the op keeps torch.library's Python holder)");
}

}  // namespace torch_tpu
