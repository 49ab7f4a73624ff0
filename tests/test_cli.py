"""The ``opforge`` command line, run as ``python -m opforge`` in subprocesses."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opforge import cli


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


@pytest.fixture
def env(tmp_path):
    environment = dict(os.environ)
    for var in ("OPFORGE_CXX", "CXX", "OPFORGE_CXXFLAGS", "OPFORGE_INCLUDE_DIRS", "OPFORGE_VERBOSE"):
        environment.pop(var, None)
    environment["OPFORGE_CACHE_DIR"] = str(tmp_path / "cache")
    return environment


def opforge(env, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opforge", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@needs_gxx
def test_build_then_cached_then_cache_commands(env, tmp_path):
    src = tmp_path / "add.cc"
    src.write_text('extern "C" int answer() { return 42; }\n')

    first = opforge(env, "build", src)
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.split()[0])
    assert path.name == "add.cc.so" and path.is_file()
    assert path.is_relative_to(tmp_path / "cache")
    status = first.stdout[len(str(path)):]
    assert "(built in" in status and "cached" not in status

    second = opforge(env, "build", src)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[0] == str(path)
    assert second.stdout[len(str(path)):].strip() == "(cached)"

    info = opforge(env, "cache", "info")
    assert info.returncode == 0
    assert str(tmp_path / "cache") in info.stdout
    assert "entries: 1" in info.stdout
    assert f"({sum(p.stat().st_size for p in (tmp_path / 'cache').rglob('*') if p.is_file())} bytes)" \
        in info.stdout

    cleared = opforge(env, "cache", "clear")
    assert cleared.returncode == 0 and "removed 1 cache entry" in cleared.stdout
    assert not path.exists()
    assert "entries: 0" in opforge(env, "cache", "info").stdout


@needs_gxx
def test_build_with_cflags_and_include_dirs(env, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "base.h").write_text("#define BASE 40\n")
    src = tmp_path / "k.cc"
    src.write_text('#include "base.h"\nextern "C" int answer() { return BASE + EXTRA; }\n')
    done = opforge(env, "build", src, "--cflags", "-DEXTRA=2 -O1", "-I", inc, "--verbose")
    assert done.returncode == 0, done.stderr
    assert "-DEXTRA=2" in done.stderr and str(inc) in done.stderr  # --verbose shows the command
    lib = ctypes.CDLL(done.stdout.split()[0])
    assert lib.answer() == 42


@needs_gxx
def test_compile_error_exits_1_with_file_and_line(env, tmp_path):
    src = tmp_path / "broken.cc"
    src.write_text('extern "C" int answer() {\n  return missing_thing;\n}\n')
    done = opforge(env, "build", src)
    assert done.returncode == 1
    assert f"{src.resolve()}:2:" in done.stderr
    assert "missing_thing" in done.stderr
    assert done.stdout == ""


def test_missing_compiler_exits_1(env, tmp_path):
    src = tmp_path / "k.cc"
    src.write_text("int x;\n")
    env["OPFORGE_CXX"] = "/nonexistent/g++"
    done = opforge(env, "build", src)
    assert done.returncode == 1 and "OPFORGE_CXX" in done.stderr


def test_non_source_and_usage_errors(env, tmp_path):
    prebuilt = tmp_path / "libk.so"
    prebuilt.write_bytes(b"")
    done = opforge(env, "build", prebuilt)
    assert done.returncode == 2 and "not a kernel source" in done.stderr
    missing = opforge(env, "build", tmp_path / "absent.cc")
    assert missing.returncode == 1 and "absent.cc" in missing.stderr
    bare = opforge(env)
    assert bare.returncode == 2 and "build" in bare.stderr and "cache" in bare.stderr
    assert opforge(env, "cache").returncode == 2


def test_include_prints_header_folder(env):
    done = opforge(env, "include")
    assert done.returncode == 0
    folder = Path(done.stdout.strip())
    assert (folder / "custom_aot_extra.h").is_file()


def test_main_returns_exit_status(capsys):
    assert cli.main(["include"]) == 0
    assert (Path(capsys.readouterr().out.strip()) / "custom_aot_extra.h").is_file()
    assert {"build", "cache", "include"} <= set(
        cli.make_parser()._subparsers._group_actions[0].choices)
