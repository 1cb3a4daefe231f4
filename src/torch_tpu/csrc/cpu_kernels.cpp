// ATen's CPU kernels inside XLA:CPU programs, as XLA FFI custom calls.
//
// When the PJRT platform is the host's CPU, XLA:CPU runs every op with its own kernels. Its
// bfloat16 dot is far behind ATen's (oneDNN, which uses the CPU's AMX / AVX512-BF16 units):
// a 1024x256 @ 256x768 bf16 product took 2.0 ms in XLA:CPU and 0.20 ms in torch (2 cores,
// Sapphire Rapids, 2026-12-06), and bf16 autocast training (torchtitan) is mostly such
// products. _cpu_kernels.py lowers the dots that qualify to the handler below; on TPU and
// GPU nothing here is used. The handler reads and writes XLA's buffers in place: no copy,
// no host transfer, and it runs wherever the program runs it (a fused graph, a captured
// step, a compiled graph).
//
// Which ops qualify, and when, is _cpu_kernels.py's decision.
//
// A dot_general's operands, given its batch and contracting dimensions, are viewed as
// [B, M, K] and [B, K, N] (permutations are free views; a reshape copies only when the
// permuted dimensions cannot merge) and the result, in dot_general's order (batch, lhs
// free, rhs free), as [B, M, N]; ATen's mm/bmm writes it. Same dtype in and out: ATen's
// bf16 product accumulates in float32 and rounds once, as XLA's does.
#include <torch/extension.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "xla/ffi/api/ffi.h"

namespace torch_tpu {
namespace {

namespace ffi = xla::ffi;
using Dims = ffi::Span<const int64_t>;

at::ScalarType aten_type(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return at::kBFloat16;
    case ffi::DataType::F16: return at::kHalf;
    case ffi::DataType::F32: return at::kFloat;
    case ffi::DataType::F64: return at::kDouble;
    default: return at::ScalarType::Undefined;
  }
}

at::Tensor view_of(const ffi::AnyBuffer& buffer) {
  auto dims = buffer.dimensions();
  return at::from_blob(buffer.untyped_data(), std::vector<int64_t>(dims.begin(), dims.end()),
                       at::TensorOptions().dtype(aten_type(buffer.element_type())));
}

// `t` as [batch, free, contracting] (contracting_last) or [batch, contracting, free].
at::Tensor as_3d(const at::Tensor& t, Dims batch, Dims contracting, bool contracting_last) {
  std::vector<bool> named(t.dim(), false);
  for (int64_t d : batch) named[d] = true;
  for (int64_t d : contracting) named[d] = true;
  std::vector<int64_t> free;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (!named[d]) free.push_back(d);
  auto product = [&](const std::vector<int64_t>& ds) {
    int64_t n = 1;
    for (int64_t d : ds) n *= t.size(d);
    return n;
  };
  std::vector<int64_t> b(batch.begin(), batch.end()), k(contracting.begin(), contracting.end());
  std::vector<int64_t> order = b;
  const auto& second = contracting_last ? free : k;
  const auto& third = contracting_last ? k : free;
  order.insert(order.end(), second.begin(), second.end());
  order.insert(order.end(), third.begin(), third.end());
  return t.permute(order).reshape({product(b), product(second), product(third)});
}

// Plain CPU kernels only, never autograd or a Python mode: XLA may run the program on the
// thread that called it, inside torch_tpu's dispatch (and the GIL is not held here).
struct PlainCpu {
  at::AutoDispatchBelowAutograd below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_python{
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot})};
};

ffi::Error failed(const char* what, const std::exception& e) {
  auto* error = dynamic_cast<const c10::Error*>(&e);
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("torch_tpu ") + what + ": " +
                                                   (error ? error->what_without_backtrace() : e.what()));
}

ffi::Error dot_impl(ffi::AnyBuffer lhs, ffi::AnyBuffer rhs, ffi::Result<ffi::AnyBuffer> out,
                    Dims lhs_batch, Dims lhs_contracting, Dims rhs_batch, Dims rhs_contracting) {
  PlainCpu plain;
  try {
    at::Tensor a = as_3d(view_of(lhs), lhs_batch, lhs_contracting, true);
    at::Tensor b = as_3d(view_of(rhs), rhs_batch, rhs_contracting, false);
    at::Tensor result = view_of(*out).view({a.size(0), a.size(1), b.size(2)});
    if (a.size(0) == 1) {
      at::Tensor result_2d = result.select(0, 0);
      at::mm_out(result_2d, a.select(0, 0), b.select(0, 0));
    } else {
      at::bmm_out(result, a, b);
    }
  } catch (const std::exception& e) {
    return failed("cpu dot", e);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(dot_handler, dot_impl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<Dims>("lhs_batch")
                           .Attr<Dims>("lhs_contracting")
                           .Attr<Dims>("rhs_batch")
                           .Attr<Dims>("rhs_contracting"));

// Scaled dot-product attention, [B, H, L, E] x [B, H, S, E] x [B, H, S, Ev], no mask, no
// dropout: ATen's CPU flash-attention kernels, forward (output, float32 logsumexp [B, H, L])
// and backward. They return tensors in their own layouts; the copies write XLA's buffers.
ffi::Error attention_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                          bool is_causal, double scale) {
  PlainCpu plain;
  try {
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
        view_of(q), view_of(k), view_of(v), 0.0, is_causal, std::nullopt, scale);
    view_of(*out).copy_(o);
    view_of(*lse).copy_(l);
  } catch (const std::exception& e) {
    return failed("cpu attention", e);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(attention_handler, attention_impl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<bool>("is_causal")
                           .Attr<double>("scale"));

ffi::Error attention_backward_impl(ffi::AnyBuffer grad_out, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                   ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                                   ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                   ffi::Result<ffi::AnyBuffer> dv, bool is_causal, double scale) {
  PlainCpu plain;
  try {
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        view_of(grad_out), view_of(q), view_of(k), view_of(v), view_of(out), view_of(lse), 0.0,
        is_causal, std::nullopt, scale);
    view_of(*dq).copy_(gq);
    view_of(*dk).copy_(gk);
    view_of(*dv).copy_(gv);
  } catch (const std::exception& e) {
    return failed("cpu attention backward", e);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(attention_backward_handler, attention_backward_impl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<bool>("is_causal")
                           .Attr<double>("scale"));

py::capsule capsule(XLA_FFI_Handler* handler) {
  return py::capsule(reinterpret_cast<void*>(handler));
}

}  // namespace

void add_cpu_kernel_functions(py::module_& m) {
  // The handlers as jax.ffi.register_ffi_target takes them (capsules of function pointers).
  m.def("cpu_kernel_handlers", []() {
    py::dict handlers;
    handlers["dot"] = capsule(dot_handler);
    handlers["attention"] = capsule(attention_handler);
    handlers["attention_backward"] = capsule(attention_backward_handler);
    return handlers;
  });
}

}  // namespace torch_tpu
