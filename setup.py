"""Builds opforge's one C++ extension, opforge._native (the kernel-call fast path)."""
import numpy
from setuptools import Extension, setup

native = Extension(
    "opforge._native",
    sources=[
        "src/opforge/csrc/native.cc",
        "src/opforge/csrc/buffers.cc",
        "src/opforge/csrc/extra_abi0.cc",
        "src/opforge/csrc/extra_abi1.cc",
    ],
    include_dirs=[numpy.get_include()],
    # 1.22: arrays carry their memory handler (buffers.cc gives outputs one)
    define_macros=[("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden"],
    language="c++",
)

setup(ext_modules=[native])
