"""Builds torch_tpu's C++ piece (every src/torch_tpu/csrc/*.cpp, one extension) at install time."""
import glob
import os

# Building imports torch; torch's device-backend autoload would import an installed
# torch_tpu whose extension may be the one being rebuilt.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402
import jax.ffi  # noqa: E402  (XLA's FFI headers, for csrc/cpu_kernels.cpp; jax is installed first)

setup(
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            sorted(glob.glob("src/torch_tpu/csrc/*.cpp")),  # (scripts/setup.sh rebuilds on any csrc change)
            include_dirs=[jax.ffi.include_dir()],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
