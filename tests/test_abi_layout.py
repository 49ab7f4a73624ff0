"""Binary compatibility of opforge's AotExtra with a user's own copy of the header.

tests/kernels/own_header/custom_aot_extra.h re-declares AotExtra and
AotKernelData from the layout facts alone (vtable order, members), with its own
inline Attr/SetWorkSpace/SetKernelData.  A kernel next to it compiles against
it, as a MindSpore user's kernel compiles against MindSpore's header, and must
then work through opforge under both libstdc++ string ABIs, auto-compiled or
prebuilt and loaded by path.
"""
from __future__ import annotations

import ctypes
import gc
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import encode_probe

from opforge import Custom, CustomRegOp
from opforge.runtime.library import detect_cxx11_abi

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")

OWN = Path(__file__).resolve().parent / "kernels" / "own_header"
SOURCE = OWN / "attr_probe_own.cc"

VALUES = [
    dict(flag=True, width=80, ratio=2.5, label="a string attribute, longer than fifteen bytes",
         ints=(-1, 0, 2**33), floats=(0.125, -8.0), grid=((5,), (6, 7)), table=((0.5,), (1.5, -2.5))),
    dict(flag=False, width=32, ratio=7, label="short", ints=(9,), floats=(), grid=(), table=((2, 3),)),
]


def reg(name, attrs):
    info = CustomRegOp(name).input(0, "x").output(0, "y")
    for key, value in attrs.items():
        info = info.attr(key, "required", "all", value=value)
    return info.target("CPU").get_op_info()


def own_custom(function, abi, out_shape, out_dtype, attrs, monkeypatch):
    """Custom on the own-header source, auto-compiled with string ABI ``abi``."""
    with monkeypatch.context() as patch:
        if abi:  # Custom builds with -D_GLIBCXX_USE_CXX11_ABI=0 unless the flags say otherwise
            patch.setenv("OPFORGE_CXXFLAGS", "-D_GLIBCXX_USE_CXX11_ABI=1")
        else:
            patch.delenv("OPFORGE_CXXFLAGS", raising=False)
        return Custom(f"{SOURCE}:{function}", out_shape, out_dtype, "aot", reg_info=reg(f"own_{function}", attrs))


@pytest.mark.parametrize("abi", [0, 1], ids=["abi0", "abi1"])
def test_the_header_next_to_the_source_wins(abi, monkeypatch):
    op = own_custom("Ramp", abi, lambda x: x, "float32", {"width": 4}, monkeypatch)
    assert op.aot_kernel.library.cxx11_abi is bool(abi)
    lib = ctypes.CDLL(str(op.aot_kernel.library.path))
    assert lib.ProbeHeader() == 2  # TEST_OWN_AOT_HEADER was defined
    assert lib.ProbeStringAbi() == abi


@pytest.mark.parametrize("values", VALUES, ids=["set-a", "set-b"])
@pytest.mark.parametrize("abi", [0, 1], ids=["abi0", "abi1"])
def test_attributes_through_own_header(abi, values, monkeypatch):
    op = own_custom("AttrProbe", abi, None, "float64", values, monkeypatch)  # shape from AttrProbeInferShape
    out = op(np.zeros(3, np.float32))
    # row 0: read in Init, kept as kernel data; row 1: read in the kernel, through its workspace
    np.testing.assert_array_equal(out, encode_probe(values))


@pytest.mark.parametrize("abi", [0, 1], ids=["abi0", "abi1"])
def test_workspace_and_kernel_data_through_own_header(abi, monkeypatch):
    gc.collect()
    probe = own_custom("Ramp", abi, lambda x: x, "float32", {"width": 1}, monkeypatch)
    lib = ctypes.CDLL(str(probe.aot_kernel.library.path))
    deleted = lib.OwnDeleted()
    ops = {width: own_custom("Ramp", abi, lambda x: x, "float32", {"width": width}, monkeypatch)
           for width in (10, 300)}
    for width, op in ops.items():
        for seed in range(2):
            x = np.random.default_rng(seed).standard_normal(width).astype(np.float32)
            # Ramp checks nparam == 3 and finds its kernel data by dynamic_cast.
            np.testing.assert_array_equal(op(x), x + np.arange(width, dtype=np.float32))
    assert lib.OwnDeleted() == deleted  # one Init per op, its data still in use
    del op, ops
    gc.collect()
    assert lib.OwnDeleted() - deleted == 2  # deleted through this header's AotKernelData, once each
    gc.collect()
    assert lib.OwnDeleted() - deleted == 2


# --------------------------------------------------------------------------
# prebuilt libraries, loaded by path: the string ABI is read from the file


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prebuilt-abi")
    built = {}

    def get(abi, opt):
        if (abi, opt) not in built:
            so = folder / f"libprobe-abi{abi}{opt}.so"
            # As a user would, with the downloaded header's folder on the include path.
            subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", opt, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                            "-I", str(OWN), str(SOURCE), "-o", str(so)], check=True, cwd=folder)
            built[abi, opt] = so
        return built[abi, opt]

    return get


def dynamic_symbols(path):
    return subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not found")
@pytest.mark.parametrize("abi", [0, 1], ids=["abi0", "abi1"])
def test_nm_shows_the_string_abi_of_a_prebuilt_library(prebuilt, abi):
    symbols = dynamic_symbols(prebuilt(abi, "-O2"))
    assert ("__cxx11" in symbols) is bool(abi)


@pytest.mark.parametrize("abi, opt", [(0, "-O2"), (1, "-O2"), (1, "-O3")])
def test_prebuilt_library_string_abi_is_detected(prebuilt, abi, opt):
    assert detect_cxx11_abi(prebuilt(abi, opt)) is bool(abi)


@pytest.mark.parametrize("abi, opt", [(0, "-O2"), (1, "-O2"), (1, "-O3")])
def test_prebuilt_library_by_path_reads_every_attribute(prebuilt, abi, opt):
    values = VALUES[0]
    op = Custom(f"{prebuilt(abi, opt)}:AttrProbe", None, "float64", "aot",
                reg_info=reg(f"prebuilt_probe_{abi}{opt}", values))
    assert op.aot_kernel.library.cxx11_abi is bool(abi)
    assert ctypes.CDLL(str(op.aot_kernel.library.path)).ProbeStringAbi() == abi
    np.testing.assert_array_equal(op(np.zeros(1, np.float32)), encode_probe(values))
