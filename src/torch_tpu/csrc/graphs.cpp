// torch.accelerator.Graph on tpu: torch's device-generic graph class finds a backend's
// implementation in at::GraphImplRegistry under the device type's name ("TPU" for the
// renamed PrivateUse1). Capture and replay are Python's (torch_tpu/eager/capture.py,
// TPUGraph); this class holds one TPUGraph, made by the factory Python sets at import
// (set_graph_factory), and forwards each call to it with the GIL held.
#include <torch/extension.h>
#include <ATen/core/GraphImplInterface.h>

namespace torch_tpu {
namespace {

py::object* g_graph_factory = nullptr;  // leaked: outlives interpreter teardown

struct TpuGraphImpl final : at::GraphImplInterface {
  explicit TpuGraphImpl(const at::GraphImplArgs& args) {
    py::gil_scoped_acquire gil;
    TORCH_CHECK(g_graph_factory != nullptr, "torch.accelerator.Graph: torch_tpu is not initialized");
    graph_ = new py::object((*g_graph_factory)(args.keep_graph));
  }
  ~TpuGraphImpl() override {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete graph_;
  }
  void capture_begin(at::MempoolId_t, at::GraphCaptureMode) override { call("capture_begin"); }
  void capture_end() override { call("capture_end"); }
  void instantiate() override { call("instantiate"); }
  void replay() override { call("replay"); }
  void reset() override { call("reset"); }
  at::MempoolId_t pool() const override {
    return {0, static_cast<at::CaptureId_t>(reinterpret_cast<uintptr_t>(graph_))};
  }
  void enable_debug_mode() override {}
  void debug_dump(const std::string& path) override {
    py::gil_scoped_acquire gil;
    graph_->attr("debug_dump")(path);
  }

 private:
  void call(const char* name) {
    py::gil_scoped_acquire gil;
    graph_->attr(name)();
  }
  py::object* graph_;
};

}  // namespace

void add_graph_impl(py::module_& m) {
  m.def("set_graph_factory", [](py::object fn) {
    if (!g_graph_factory) g_graph_factory = new py::object();
    *g_graph_factory = std::move(fn);
  });
}

}  // namespace torch_tpu

namespace at {  // (the registry's registerer types live there)
C10_REGISTER_CLASS(GraphImplRegistry, TPU, torch_tpu::TpuGraphImpl)
}
