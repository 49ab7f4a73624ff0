"""Compilation and the on-disk build cache (opforge.runtime.build)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import opforge
from opforge.errors import BuildError, CacheError, CompileError, CompilerNotFoundError, KernelSourceError
from opforge.runtime.build import (
    ABI_VERSION,
    BuiltLibrary,
    build,
    cache_dir,
    cache_info,
    clear_cache,
    detect_cuda_arch,
    find_compiler,
    include_dir,
    is_source,
)
from opforge.runtime import build as build_module
from opforge.runtime import cuda_arch, compilers
from opforge.runtime.cache import file_lock
from opforge.runtime.cuda_arch import detect_cuda_archs, normalize_arch
from opforge.runtime.library import load_library


ANSWER_CC = 'extern "C" int answer() { return 42; }\n'

_ENV_VARS = (
    "OPFORGE_CC", "OPFORGE_CXX", "OPFORGE_NVCC", "CC", "CXX",
    "OPFORGE_CFLAGS", "OPFORGE_CXXFLAGS", "OPFORGE_NVCC_FLAGS", "OPFORGE_INCLUDE_DIRS",
    "OPFORGE_VERBOSE", "OPFORGE_CUDA_ARCH", "XDG_CACHE_HOME",
)

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty private cache and an environment free of opforge settings."""
    for var in _ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    folder = tmp_path / "cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(folder))
    return folder


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def call_int(library_path, name: str) -> int:
    lib = load_library(library_path)
    return ctypes.CFUNCTYPE(ctypes.c_int)(lib.address(name))()


def forbid_processes(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was spawned: {args[:1]}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse, raising=False)


def make_wrapper(folder: Path, real: str = "g++") -> tuple[Path, Path]:
    """A compiler wrapper that logs each run to a counter file, then runs ``real``.

    With OPFORGE_TEST_STALL set, its first run stalls (a hung compiler).
    """
    counter = folder / "compiler-runs.txt"
    wrapper = folder / "wrapped-cxx"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo run >> "{counter}"
        if [ -n "$OPFORGE_TEST_STALL" ] && [ "$(wc -l < "{counter}")" -eq 1 ]; then
            sleep 60
        fi
        if [ -n "$OPFORGE_TEST_SLOW" ]; then sleep 0.5; fi
        exec {shutil.which(real)} "$@"
        """))
    wrapper.chmod(0o755)
    return wrapper, counter


def runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def child_env(**extra) -> dict:
    env = dict(os.environ)  # children import the installed opforge, like this process
    env.update(extra)
    return env


BUILD_IN_CHILD = (
    "import sys; from opforge.runtime.build import build; "
    "b = build(sys.argv[1]); print('CACHED' if b.from_cache else 'BUILT', b.path)"
)


# --------------------------------------------------------------------------


def test_is_source_and_include_dir():
    assert all(is_source(f"k{s}") for s in (".c", ".cc", ".cpp", ".cxx", ".cu"))
    assert not is_source("k.so") and not is_source("k.h") and not is_source("k")
    assert (include_dir() / "custom_aot_extra.h").is_file()


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("OPFORGE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "opforge"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"
    monkeypatch.delenv("OPFORGE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "opforge"


def test_non_source_is_rejected(cache, tmp_path):
    prebuilt = tmp_path / "libk.so"
    prebuilt.write_bytes(b"\x7fELF")
    with pytest.raises(BuildError, match="not a kernel source"):
        build(prebuilt)


@needs_gxx
def test_cold_then_warm_build_spawns_nothing(cache, tmp_path, monkeypatch):
    src = write(tmp_path / "add.cc", ANSWER_CC)
    cold = build(src)
    assert isinstance(cold, BuiltLibrary) and not cold.from_cache
    assert cold.path.name == "add.cc.so"
    assert cold.path.parent.parent == cache
    assert cold.path.parent.name.startswith("add-")
    assert cold.source == src.resolve()

    manifest = json.loads((cold.path.parent / "manifest.json").read_text())
    assert manifest["size"] == cold.path.stat().st_size
    assert manifest["command"][0].endswith("g++")
    assert {"key", "source", "command", "sha256", "size", "cxx11_abi", "created"} <= set(manifest)

    forbid_processes(monkeypatch)
    start = time.perf_counter()
    warm = build(src)
    elapsed = time.perf_counter() - start
    assert warm.from_cache and warm.path == cold.path
    assert elapsed < 0.5  # the target is a few ms; generous for a loaded CI machine
    assert not any(p.name.startswith(".tmp-") for p in cold.path.parent.iterdir())
    monkeypatch.undo()
    assert call_int(warm.path, "answer") == 42


@needs_gxx
def test_source_edit_and_flags_change_the_entry(cache, tmp_path):
    src = write(tmp_path / "k.cc", 'extern "C" int answer() { return 1; }\n')
    first = build(src, optimization="-O0")
    write(src, 'extern "C" int answer() { return 2; }\n')
    edited = build(src, optimization="-O0")
    assert not edited.from_cache and edited.path != first.path
    assert call_int(edited.path, "answer") == 2

    flagged = build(src, optimization="-O0", extra_cflags=["-DUNUSED=1"])
    assert not flagged.from_cache and flagged.path != edited.path
    other = build(src, optimization="-O0", extra_cflags="-DUNUSED=2")
    assert not other.from_cache and other.path not in (flagged.path, edited.path)
    # Each flag set keeps its own entry.
    assert build(src, optimization="-O0", extra_cflags=["-DUNUSED=1"]).from_cache
    assert build(src, optimization="-O0").from_cache
    assert cache_info()["entries"] == 4


@needs_gxx
def test_env_flags_and_include_dirs_enter_the_key(cache, tmp_path, monkeypatch):
    inc = write(tmp_path / "inc" / "value.h", "#define VALUE 5\n").parent
    src = write(tmp_path / "k.cc", '#include "value.h"\nextern "C" int answer() { return VALUE; }\n')
    monkeypatch.setenv("OPFORGE_INCLUDE_DIRS", str(inc))
    plain = build(src, optimization="-O0")
    assert call_int(plain.path, "answer") == 5
    monkeypatch.setenv("OPFORGE_CXXFLAGS", "-DUNUSED=3")
    flagged = build(src, optimization="-O0")
    assert not flagged.from_cache and flagged.path != plain.path
    assert "-DUNUSED=3" in json.loads((flagged.path.parent / "manifest.json").read_text())["command"]


@needs_gxx
def test_local_headers_are_hashed_and_source_folder_comes_first(cache, tmp_path):
    # A user's own custom_aot_extra.h next to the source must win over opforge's.
    local = write(tmp_path / "custom_aot_extra.h", '#include "nested.h"\n#define FROM_LOCAL_HEADER 1\n')
    nested = write(tmp_path / "nested.h", "#define NESTED 10\n")
    # A missing header is ignored by the key (the compiler would report it).
    # Included with <...>, so only the -I order decides which copy is used.
    src = write(tmp_path / "k.cc", """\
        #include <custom_aot_extra.h>
        #include <cstdio>
        #if 0
        #include "missing_but_guarded.h"
        #endif
        extern "C" int answer() { return FROM_LOCAL_HEADER + NESTED; }
        """)
    first = build(src, optimization="-O0")
    assert call_int(first.path, "answer") == 11
    assert build(src, optimization="-O0").from_cache

    write(nested, "#define NESTED 20\n")  # two includes deep
    second = build(src, optimization="-O0")
    assert not second.from_cache and second.path != first.path
    assert call_int(second.path, "answer") == 21

    write(local, '#include "nested.h"\n#define FROM_LOCAL_HEADER 2\n')  # the <...> header itself
    third = build(src, optimization="-O0")
    assert not third.from_cache and third.path not in (first.path, second.path)
    assert call_int(third.path, "answer") == 22


@needs_gxx
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage-manifest", "wrong-key", "no-library"])
def test_corrupt_entry_is_rebuilt(cache, tmp_path, damage):
    src = write(tmp_path / "add.cc", ANSWER_CC)
    good = build(src, optimization="-O0")
    manifest = good.path.parent / "manifest.json"
    if damage == "truncate":
        data = good.path.read_bytes()
        good.path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size, different bytes
        data = bytearray(good.path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        good.path.write_bytes(bytes(data))
    elif damage == "garbage-manifest":
        manifest.write_bytes(b"{not json")
    elif damage == "wrong-key":
        record = json.loads(manifest.read_text())
        record["key"] = "0" * 64
        manifest.write_text(json.dumps(record))
    else:
        good.path.unlink()
    again = build(src, optimization="-O0")
    assert not again.from_cache
    assert again.path == good.path
    assert call_int(again.path, "answer") == 42
    assert build(src, optimization="-O0").from_cache


@needs_gxx
def test_force_rebuilds(cache, tmp_path):
    src = write(tmp_path / "add.cc", ANSWER_CC)
    build(src, optimization="-O0")
    forced = build(src, optimization="-O0", force=True)
    assert not forced.from_cache and forced.path.is_file()


@needs_gxx
def test_concurrent_builds_compile_once(cache, tmp_path):
    wrapper, counter = make_wrapper(tmp_path)
    src = write(tmp_path / "shared.cc", ANSWER_CC)
    env = child_env(OPFORGE_CXX=str(wrapper), OPFORGE_TEST_SLOW="1")
    children = [subprocess.Popen([sys.executable, "-c", BUILD_IN_CHILD, str(src)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    results = [child.communicate(timeout=60) for child in children]
    for child, (out, err) in zip(children, results):
        assert child.returncode == 0, err
    words = sorted(out.split()[0] for out, _ in results)
    assert words == ["BUILT", "CACHED"]
    assert runs(counter) == 1
    paths = {out.split()[1] for out, _ in results}
    assert len(paths) == 1
    assert call_int(paths.pop(), "answer") == 42


@needs_gxx
@pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
def test_killed_builder_does_not_block_the_next(cache, tmp_path):
    wrapper, counter = make_wrapper(tmp_path)
    src = write(tmp_path / "victim.cc", ANSWER_CC)
    env = child_env(OPFORGE_CXX=str(wrapper), OPFORGE_TEST_STALL="1")
    victim = subprocess.Popen([sys.executable, "-c", BUILD_IN_CHILD, str(src)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while runs(counter) < 1:  # the victim holds the lock and its compiler hangs
            assert victim.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)  # the builder only; the wrapper's `sleep` lives on
        victim.wait(timeout=10)

        done = subprocess.run([sys.executable, "-c", BUILD_IN_CHILD, str(src)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("BUILT")
        assert runs(counter) == 2
        library = Path(done.stdout.split()[1])
        assert call_int(library, "answer") == 42
        # The dead build's temporary file was cleaned up, not left behind.
        assert sorted(p.name for p in library.parent.iterdir()) == ["manifest.json", "victim.cc.so"]
    finally:
        kill_group(victim.pid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@needs_gxx
def test_compile_error_reports_file_and_line(cache, tmp_path):
    src = write(tmp_path / "broken.cc", 'extern "C" int answer() {\n  return undefined_name;\n}\n')
    with pytest.raises(CompileError) as caught:
        build(src)
    error = caught.value
    first_line = str(error).splitlines()[0]
    assert "broken.cc" in first_line
    assert f"{src.resolve()}:2:" in str(error)
    assert f"{src.resolve()}:2:" in error.output and "undefined_name" in error.output
    assert isinstance(error.command, list) and error.command[0].endswith("g++")
    assert str(src.resolve()) in error.command
    assert cache_info()["entries"] == 0  # no half-made entry left behind


def test_missing_compiler(cache, tmp_path, monkeypatch):
    src = write(tmp_path / "k.cc", ANSWER_CC)
    monkeypatch.setenv("OPFORGE_CXX", "/nonexistent/g++")
    with pytest.raises(CompilerNotFoundError, match="OPFORGE_CXX"):
        build(src)
    monkeypatch.delenv("OPFORGE_CXX")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CompilerNotFoundError) as caught:
        find_compiler("c")
    assert "gcc" in str(caught.value) and "OPFORGE_CC" in str(caught.value)
    with pytest.raises(BuildError, match="'fortran'"):
        find_compiler("fortran")


@needs_gcc
def test_c_source_uses_gcc(cache, tmp_path):
    src = write(tmp_path / "plain.c", "int answer(void) { return 42; }\n")
    built = build(src)
    command = json.loads((built.path.parent / "manifest.json").read_text())["command"]
    assert "-std=c11" in command and "-std=c++17" not in command
    assert os.path.basename(command[0]) in {"gcc", "cc"} or "gcc" in command[0]
    assert built.path.name == "plain.c.so"
    assert call_int(built.path, "answer") == 42


@needs_gxx
def test_cxx11_abi_setting(cache, tmp_path):
    src = write(tmp_path / "abi.cc", ANSWER_CC)

    def command_of(built):
        return json.loads((built.path.parent / "manifest.json").read_text())["command"]

    default = build(src, optimization="-O0")
    assert default.cxx11_abi is False
    assert "-D_GLIBCXX_USE_CXX11_ABI=0" in command_of(default)

    new = build(src, optimization="-O0", cxx11_abi=True)
    assert new.cxx11_abi is True and new.path != default.path
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in command_of(new)

    # A user's own -D wins over the argument, and ours is not added beside it.
    user = build(src, optimization="-O0", cxx11_abi=False, extra_cflags=["-D_GLIBCXX_USE_CXX11_ABI=1"])
    assert user.cxx11_abi is True
    assert "-D_GLIBCXX_USE_CXX11_ABI=0" not in command_of(user)
    assert build(src, optimization="-O0", cxx11_abi=False,
                 extra_cflags=["-D_GLIBCXX_USE_CXX11_ABI=1"]).cxx11_abi is True  # cached answer too


def test_cuda_arch_override_and_normalisation(monkeypatch):
    monkeypatch.setenv("OPFORGE_CUDA_ARCH", "9.0")
    assert detect_cuda_arch() == "sm_90"
    monkeypatch.setenv("OPFORGE_CUDA_ARCH", "sm_90a")
    assert detect_cuda_arch() == "sm_90a"
    monkeypatch.setenv("OPFORGE_CUDA_ARCH", "sm_90, 8.0,80,sm_90a")  # several: each once, in order
    assert detect_cuda_archs() == ("sm_80", "sm_90", "sm_90a") and detect_cuda_arch() == "sm_80"
    monkeypatch.delenv("OPFORGE_CUDA_ARCH")
    assert detect_cuda_arch().startswith("sm_")
    with pytest.raises(BuildError, match="'hopper'"):
        normalize_arch("hopper")


def test_every_visible_gpu_s_arch_is_detected_and_remembered(cache, monkeypatch, tmp_path):
    smi = write(tmp_path / "bin" / "nvidia-smi", "#!/bin/sh\nprintf '9.0\\n8.0\\n9.0\\n'\n")  # three GPUs
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(cuda_arch, "_arch_memo", {})
    monkeypatch.setattr(cuda_arch, "_gpu_fingerprint",  # the driver's view, as the real one keys it
                        lambda: "fake:" + os.environ.get("CUDA_VISIBLE_DEVICES", "<all>")
                        + os.environ.get("CUDA_DEVICE_ORDER", ""))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    # CUDA's default order (fastest first) need not be nvidia-smi's: index 0 may be any GPU, so every arch
    assert detect_cuda_archs() == ("sm_80", "sm_90")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's order: the visible ones only
    assert detect_cuda_archs() == ("sm_90",)
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")  # not by index: every GPU's, to be safe
    assert detect_cuda_archs() == ("sm_80", "sm_90")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert detect_cuda_archs() == ("sm_80", "sm_90")
    monkeypatch.setattr(cuda_arch, "_arch_memo", {})  # a new process: the answer comes from the cache folder
    forbid_processes(monkeypatch)
    assert detect_cuda_archs() == ("sm_80", "sm_90")


def test_a_cuda_build_targets_each_arch_with_its_ptx_and_is_keyed_by_the_set(cache, monkeypatch, tmp_path):
    source = write(tmp_path / "k.cu", "extern \"C\" int answer() { return 42; }\n")

    def nvcc_plan(cuda_arch):  # (a stand-in compiler: the plan runs nothing)
        return compilers.plan(source, extra_cflags=(), include_dirs=(), compiler=sys.executable, cuda_arch=cuda_arch,
                              cxx11_abi=False, optimization="-O3")

    both = nvcc_plan(["sm_90", "80"])
    targets = [both.flags[k + 1] for k, flag in enumerate(both.flags) if flag == "-gencode"]
    assert targets == ["arch=compute_80,code=[sm_80,compute_80]", "arch=compute_90,code=[sm_90,compute_90]"]
    monkeypatch.setenv("OPFORGE_CUDA_ARCH", "sm_90,sm_80")  # what detection answers: the same command
    detected = nvcc_plan(None)
    assert detected.flags == both.flags
    key = build_module._cache_key
    assert key(detected, b"") == key(nvcc_plan("sm_80,sm_90"), b"") != key(nvcc_plan("sm_80"), b"")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_source_compiles(cache, tmp_path):
    src = write(tmp_path / "scale.cu", """\
        #include "custom_aot_extra.h"
        __global__ void scale(float *x, int n) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) x[i] *= 2.0f;
        }
        extern "C" int CustomScale(int nparam, void **params, int *ndims, int64_t **shapes,
                                   const char **dtypes, void *stream, void *extra) {
          int n = static_cast<int>(shapes[0][0]);
          scale<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
              static_cast<float *>(params[0]), n);
          return 0;
        }
        """)
    built = build(src, cuda_arch="sm_80")
    assert built.path.is_file() and built.path.name == "scale.cu.so"
    command = json.loads((built.path.parent / "manifest.json").read_text())["command"]
    assert "arch=compute_80,code=[sm_80,compute_80]" in command and "--expt-relaxed-constexpr" in command
    # The shared CUDA runtime, so opforge's cudaGetLastError sees this library's launches.
    assert "-cudart shared" in " ".join(command)
    if shutil.which("ldd"):
        needed = subprocess.run(["ldd", str(built.path)], capture_output=True, text=True).stdout
        assert "libcudart.so" in needed and "not found" not in needed.split("libcudart")[1].split("\n")[0]
    assert build(src, cuda_arch="80").from_cache  # same arch, spelled differently
    both = build(src, cuda_arch="sm_90,sm_80")  # two GPUs' archs: one library, a new entry
    assert not both.from_cache and both.path.is_file()


@needs_gxx
def test_clear_cache_and_info(cache, tmp_path):
    assert cache_info() == {"path": str(cache), "entries": 0, "bytes": 0}
    a = build(write(tmp_path / "a.cc", ANSWER_CC), optimization="-O0")
    build(write(tmp_path / "b.cc", ANSWER_CC), optimization="-O0")
    info = cache_info()
    assert info["entries"] == 2 and info["bytes"] >= 2 * a.path.stat().st_size
    assert clear_cache() == 2
    assert cache_info()["entries"] == 0
    assert not any(cache.glob("*.lock"))
    assert not build(tmp_path / "a.cc", optimization="-O0").from_cache


@needs_gxx
def test_clear_cache_skips_entry_being_built(cache, tmp_path):
    src = write(tmp_path / "busy.cc", ANSWER_CC)
    built = build(src, optimization="-O0")
    lock = built.path.parent.with_name(built.path.parent.name + ".lock")
    with file_lock(lock) as held:  # as a concurrent builder would
        assert held
        assert clear_cache() == 0
        assert built.path.is_file()
    assert clear_cache() == 1


def test_abi_version_is_exposed():
    assert ABI_VERSION == 1



# --------------------------------------------------------------------------
# an unusable cache folder, long names, missing sources


def build_in_unusable_cache(monkeypatch, tmp_path, folder) -> str:
    """Build with the cache at ``folder``; returns the CacheError's message."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(folder))
    with pytest.raises(CacheError) as caught:
        build(write(tmp_path / "src" / "k.cc", ANSWER_CC))
    assert isinstance(caught.value, OSError)
    message = str(caught.value)
    assert f"cache folder {folder}" in message and "OPFORGE_CACHE_DIR" in message
    return message


@needs_gxx
def test_cache_folder_that_is_a_file(cache, tmp_path, monkeypatch):
    blocker = write(tmp_path / "blocker", "not a folder\n")
    assert f"{blocker} is a file, not a folder" in build_in_unusable_cache(monkeypatch, tmp_path, blocker)
    under = blocker / "cache"  # a path under a regular file: no one, root included, can make it
    assert f"{blocker} is a file, so no folder" in build_in_unusable_cache(monkeypatch, tmp_path, under)


@needs_gxx
@pytest.mark.skipif(not os.path.isdir("/sys"), reason="needs Linux's /sys, a folder no one may add files to")
def test_cache_folder_that_refuses_new_files(cache, tmp_path, monkeypatch):
    probe = Path("/sys/opforge-probe.lock")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_RDWR))
    except OSError:
        pass
    else:
        probe.unlink()
        pytest.skip("/sys accepts new files here")
    assert "no permission to write" in build_in_unusable_cache(monkeypatch, tmp_path, Path("/sys"))


def build_as_nobody(folder, source) -> str:
    """As root, folder permissions bind no one: build in a forked child that has dropped to
    the unprivileged user 'nobody' and return its CacheError's message."""
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        message = "no CacheError"
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.environ["OPFORGE_CACHE_DIR"] = str(folder)
            build(source)
        except CacheError as exc:
            message = str(exc)
        except BaseException as exc:  # noqa: BLE001 - anything else is reported to the parent
            message = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, message.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


@needs_gxx
@pytest.mark.skipif(os.name != "posix", reason="needs POSIX permissions")
@pytest.mark.parametrize("mode", [0o000, 0o555])
def test_cache_folder_without_permissions(cache, tmp_path, monkeypatch, mode):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=mode)
        try:
            assert "no permission to write" in build_in_unusable_cache(monkeypatch, tmp_path, locked)
        finally:
            locked.chmod(0o755)
        return
    # Root: a world-readable folder (pytest's tmp_path is root's alone) and a child that is not root.
    base = Path(tempfile.mkdtemp())
    try:
        base.chmod(0o755)
        source = write(base / "src" / "k.cc", ANSWER_CC)
        for path in (source.parent, source):
            path.chmod(0o755 if path.is_dir() else 0o644)
        locked = base / "locked"
        locked.mkdir(mode=mode)
        locked.chmod(mode)
        message = build_as_nobody(locked, source)
        assert "no permission to write" in message and f"cache folder {locked}" in message, message
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_gxx
def test_long_source_stems_give_short_unique_entries(cache, tmp_path):
    stem = "k" * 250  # with ".cc", a name at the file system's limit
    one = build(write(tmp_path / "a" / f"{stem}.cc", 'extern "C" int answer() { return 1; }\n'),
                optimization="-O0")
    two = build(write(tmp_path / "b" / f"{stem[:-1]}j.cc", 'extern "C" int answer() { return 2; }\n'),
                optimization="-O0")
    assert one.path.parent != two.path.parent
    for built, value in ((one, 1), (two, 2)):
        assert len(built.path.parent.name) < 100 and len(built.path.name) < 100
        assert built.path.name.endswith(".cc.so")
        assert call_int(built.path, "answer") == value
    assert build(tmp_path / "a" / f"{stem}.cc", optimization="-O0").from_cache
    # Multi-byte characters are cut whole.
    wide = build(write(tmp_path / "c" / ("é" * 120 + ".cc"), ANSWER_CC), optimization="-O0")
    assert wide.path.parent.name.startswith("é") and len(os.fsencode(wide.path.parent.name)) < 100
    assert call_int(wide.path, "answer") == 42


def test_missing_source_is_a_kernel_source_error(cache, tmp_path):
    missing = tmp_path / "missing.cc"
    with pytest.raises(KernelSourceError, match=str(missing)) as caught:
        opforge.build(missing)
    assert isinstance(caught.value, FileNotFoundError)
    with pytest.raises(KernelSourceError, match="libmissing.so"):
        load_library(tmp_path / "libmissing.so")


@needs_gxx
def test_inline_kernel_with_an_unusable_cache(cache, tmp_path, monkeypatch, fresh):
    """Sources given as code= are written into the cache folder: the same CacheError."""
    op = opforge.op("build_test::inline(Tensor x) -> Tensor y")
    fresh.append(op.name)
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code="#include <cstdint>\n"
                   'extern "C" int Same(int, void **, int *, int64_t **, const char **, void *, void *) {return 0;}\n',
                   function="Same")
    blocker = write(tmp_path / "blocker", "")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(CacheError, match=f"{blocker} is a file"):
        op(np.ones(2, np.float32))


# --------------------------------------------------------------------------
# a killed build leaves no compiler behind


def make_slow_compiler(folder: Path) -> Path:
    """A compiler that records its pid; with OPFORGE_TEST_STALL it sleeps, then writes
    its output as a real compiler would (late); otherwise it runs g++."""
    script = folder / "slow-cxx"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys, time
        with open({str(folder / "compiler.pid")!r}, "w") as handle:
            handle.write(str(os.getpid()))
        if os.environ.get("OPFORGE_TEST_STALL"):
            time.sleep(float(os.environ["OPFORGE_TEST_STALL"]))
            with open(sys.argv[sys.argv.index("-o") + 1], "w") as out:
                out.write("a late compiler's output")
            sys.exit(0)
        os.execv({shutil.which("g++")!r}, ["g++", *sys.argv[1:]])
        """))
    script.chmod(0o755)
    return script


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@needs_gxx
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compilers die with their parent on Linux")
def test_killed_build_leaves_no_compiler_and_no_stray_file(cache, tmp_path, monkeypatch):
    compiler = make_slow_compiler(tmp_path)
    src = write(tmp_path / "slow.cc", ANSWER_CC)
    stall = 2.0
    env = child_env(OPFORGE_CXX=str(compiler), OPFORGE_TEST_STALL=str(stall))
    builder = subprocess.Popen([sys.executable, "-c", BUILD_IN_CHILD, str(src)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "compiler.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert builder.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    compiler_pid = int(pid_file.read_text())
    started = time.monotonic()
    builder.kill()
    builder.wait(timeout=10)
    while alive(compiler_pid) and time.monotonic() < started + 1.0:
        time.sleep(0.02)
    try:
        assert not alive(compiler_pid), "the compiler outlived the build that started it"
    finally:
        if alive(compiler_pid):
            os.kill(compiler_pid, signal.SIGKILL)
    time.sleep(max(0.0, started + stall + 0.5 - time.monotonic()))  # past the compiler's late write
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    assert not any(p.name.startswith(".tmp-") for p in entry.iterdir())

    monkeypatch.setenv("OPFORGE_CXX", str(compiler))  # the same entry, now with a compiler that finishes
    later = build(src)
    assert not later.from_cache and later.path.parent == entry
    assert call_int(later.path, "answer") == 42


@needs_gxx
def test_stray_temporaries_are_removed_when_the_entry_is_loaded(cache, tmp_path):
    src = write(tmp_path / "tidy.cc", ANSWER_CC)
    built = build(src, optimization="-O0")
    stray = built.path.parent / ".tmp-abc123.so"
    stray.write_bytes(b"left by a build that died")
    again = build(src, optimization="-O0")
    assert again.from_cache and not stray.exists()
    with file_lock(built.path.parent.with_name(built.path.parent.name + ".lock")):  # a build in progress
        stray.write_bytes(b"maybe that build's own file")
        assert build(src, optimization="-O0").from_cache and stray.exists()


_FORKS_SEEN: list[int] = []
_WATCHING_FORKS: list[bool] = []
os.register_at_fork(before=lambda: _FORKS_SEEN.append(1) if _WATCHING_FORKS else None)


def test_the_compiler_starts_without_running_python_in_a_forked_child():
    # Python code between fork and exec may deadlock in a threaded process (and makes JAX warn):
    # the compiler is spawned without a preexec function, so no at-fork hook runs.
    from opforge.runtime.compilers import run_compiler

    _WATCHING_FORKS.append(True)
    try:
        done = run_compiler([sys.executable, "-c", "print('ran')"])
    finally:
        _WATCHING_FORKS.clear()
    assert done.returncode == 0 and done.stdout.strip() == "ran"
    assert _FORKS_SEEN == []
