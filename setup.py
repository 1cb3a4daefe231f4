"""Builds torch_tpu's C++ piece (allocator, generator, hooks, view kernels) at install time."""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            "torch_tpu._C",
            ["src/torch_tpu/csrc/tpu_ext.cpp"],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
