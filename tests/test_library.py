"""Loading kernel libraries and finding their symbols (opforge.runtime.library)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from opforge.errors import OpforgeError, SymbolNotFoundError
from opforge.runtime.build import build, include_dir
from opforge.runtime.library import Library, detect_cxx11_abi, load_library

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

KERNELS_CC = """\
#include "custom_aot_extra.h"
extern "C" int answer() { return 42; }
extern "C" int CustomKernel(int nparam, void **params, int *ndims, int64_t **shapes,
                            const char **dtypes, void *stream, void *extra) { return 0; }
int MangledKernel(int x) { return x + 1; }  // forgot extern "C"
"""

# Calls libstdc++'s out-of-line string members, so the library's dynamic
# symbols show which string ABI it was built with.
STRINGS_CC = """\
#include <string>
extern "C" int joined_length(const char *a, const char *b) {
  std::string s(a);
  s.append(b);
  s.reserve(1000);
  return static_cast<int>(s.size());
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    for var in ("OPFORGE_CXX", "CXX", "OPFORGE_CXXFLAGS", "OPFORGE_INCLUDE_DIRS", "OPFORGE_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def compile_source(folder: Path, name: str, text: str, **options) -> Path:
    source = folder / name
    source.write_text(textwrap.dedent(text))
    return build(source, optimization="-O0", **options).path


@pytest.fixture
def kernels(cache, tmp_path) -> Path:
    return compile_source(tmp_path, "kernels.cc", KERNELS_CC)


def call_int(address: int) -> int:
    return ctypes.CFUNCTYPE(ctypes.c_int)(address)()


def test_address_of_a_function(kernels):
    lib = load_library(kernels)
    assert isinstance(lib, Library) and lib.path == kernels.resolve()
    address = lib.address("answer")
    assert isinstance(address, int) and address != 0
    assert call_int(address) == 42
    assert lib.address("answer") == address
    assert lib.address("CustomKernel") not in (None, address)


def test_missing_symbol_names_close_matches(kernels):
    lib = load_library(kernels)
    assert lib.address("CustomKernal", required=False) is None
    with pytest.raises(SymbolNotFoundError) as caught:
        lib.address("CustomKernal")
    error = caught.value
    assert isinstance(error, AttributeError)  # keeps working for `except AttributeError`
    assert error.symbol == "CustomKernal"
    assert error.library == str(kernels.resolve())
    assert error.close_matches == ["CustomKernel"]
    assert "'CustomKernal'" in str(error) and str(kernels.resolve()) in str(error)
    assert "CustomKernel?" in str(error)


def test_missing_extern_c_is_pointed_out(kernels):
    with pytest.raises(SymbolNotFoundError, match='extern "C"'):
        load_library(kernels).address("MangledKernel")


def test_exported_symbols(kernels, monkeypatch):
    names = load_library(kernels).exported_symbols()
    assert {"answer", "CustomKernel"} <= set(names)
    assert any(n.startswith("_Z") and "MangledKernel" in n for n in names)
    assert "__gxx_personality_v0" not in names  # undefined (imported) symbols are not listed
    # Without nm there is nothing to list, and a missing symbol still raises cleanly.
    monkeypatch.setenv("PATH", "")
    fresh = Library(kernels, ctypes.CDLL(str(kernels)), False)
    assert fresh.exported_symbols() == []
    with pytest.raises(SymbolNotFoundError) as caught:
        fresh.address("CustomKernal")
    assert caught.value.close_matches == []


def test_library_is_loaded_once(kernels):
    first = load_library(kernels)
    assert load_library(str(kernels)) is first
    other_abi = load_library(kernels, cxx11_abi=True)
    assert other_abi is not first and other_abi.cxx11_abi is True
    assert other_abi.handle is first.handle  # one dlopen per file version


def test_replaced_file_is_loaded_anew(cache, tmp_path):
    one = compile_source(tmp_path, "one.cc", 'extern "C" int answer() { return 1; }\n')
    two = compile_source(tmp_path, "two.cc", 'extern "C" int answer() { return 2; }\n')
    target = tmp_path / "live.so"
    shutil.copyfile(one, target)
    assert call_int(load_library(target).address("answer")) == 1
    staged = tmp_path / "staged.so"
    shutil.copyfile(two, staged)
    stat = target.stat()
    os.utime(staged, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    os.replace(staged, target)  # the way the build cache swaps a library in
    # The dynamic loader alone would hand back the old code for the same path.
    assert call_int(load_library(target).address("answer")) == 2


def test_load_failure_carries_the_loader_message(tmp_path):
    bad = tmp_path / "garbage.so"
    bad.write_bytes(b"this is not an ELF file" * 10)
    with pytest.raises(OSError) as raw:
        ctypes.CDLL(str(bad))
    with pytest.raises(OpforgeError) as caught:
        load_library(bad)
    assert str(raw.value) in str(caught.value)
    with pytest.raises(OpforgeError, match="nothing-here.so"):
        load_library(tmp_path / "nothing-here.so")


def test_unresolved_symbol_fails_at_load_time(cache, tmp_path):
    path = compile_source(tmp_path, "unresolved.cc", """\
        extern "C" int defined_nowhere_at_all();
        extern "C" int uses_it() { return defined_nowhere_at_all(); }
        """)
    with pytest.raises(OpforgeError, match="defined_nowhere_at_all"):
        load_library(path)  # RTLD_NOW: the loader refuses it now, not at the first call


def test_detect_cxx11_abi(cache, tmp_path):
    new = compile_source(tmp_path, "strings.cc", STRINGS_CC, cxx11_abi=True)
    old = compile_source(tmp_path, "strings.cc", STRINGS_CC, cxx11_abi=False)
    assert new != old
    assert detect_cxx11_abi(new) is True
    assert detect_cxx11_abi(old) is False
    assert load_library(new).cxx11_abi is True  # detected when not given
    assert load_library(old).cxx11_abi is False
    lib = load_library(new)
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)(lib.address("joined_length"))
    assert fn(b"abc", b"de") == 5


def test_detect_cxx11_abi_evidence_rules(tmp_path):
    blob = tmp_path / "blob.so"
    blob.write_bytes(b"\0" * 64 + b"_ZNSt7__cxx1112basic_string" + b"\0")
    assert detect_cxx11_abi(blob) is True
    blob.write_bytes(b"\0" * 64 + b"_ZNSs4_Rep9_S_createEmmRKSaIcE" + b"\0")
    assert detect_cxx11_abi(blob) is False
    blob.write_bytes(b"\0" * 64)  # no std::string evidence either way
    assert detect_cxx11_abi(blob) is True


@pytest.mark.parametrize("abi", [0, 1])
def test_detect_cxx11_abi_of_attr_only_kernel(tmp_path, abi):
    # At -O3 the new ABI inlines everything Attr<std::string> needs; the old one never does.
    source = tmp_path / "attr_only.cc"
    source.write_text(
        '#include "custom_aot_extra.h"\n'
        'extern "C" int K(int n, void **p, int *nd, int64_t **s, const char **d, void *st, void *extra) {\n'
        '  auto *e = static_cast<AotExtra *>(extra);\n'
        '  return static_cast<int>(e->Attr<int64_t>("axis") + e->Attr<std::string>("mode").size());\n'
        '}\n')
    library = tmp_path / f"attr_only{abi}.so"
    subprocess.run(["g++", "-std=c++17", "-O3", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                    "-I", str(include_dir()), str(source), "-o", str(library)], check=True)
    assert detect_cxx11_abi(library) is bool(abi)
