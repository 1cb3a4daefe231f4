"""Builds torch_tpu's C++ piece (allocator, generator, hooks, view kernels) at install time."""
import os

# Building imports torch; torch's device-backend autoload would import an installed
# torch_tpu whose extension may be the one being rebuilt.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

setup(
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            ["src/torch_tpu/csrc/tpu_ext.cpp", "src/torch_tpu/csrc/scan.cpp",
             "src/torch_tpu/csrc/graph.cpp", "src/torch_tpu/csrc/kernel.cpp",
             "src/torch_tpu/csrc/frames.cpp"],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
