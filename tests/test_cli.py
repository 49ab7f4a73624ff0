"""The ``opforge`` command line, run as ``python -m opforge`` in subprocesses."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import opforge as opforge_package
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
    version = opforge(env, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"opforge {opforge_package.__version__}"


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


# --------------------------------------------------------------------------
# opforge build: the variant options


VARIANT_CC = """\
#include <cstdint>
extern "C" int elem_size() { return sizeof(OPFORGE_T); }
extern "C" int x_size() { return sizeof(OPFORGE_T_x); }
extern "C" int is_float64() { return OPFORGE_DTYPE_FLOAT64; }
extern "C" int answer() { return ANSWER + EXTRA; }
#ifdef OPFORGE_LAYOUT_NCHW16C
extern "C" int blocked() { return 1; }
#endif
#ifdef __AVX2__
extern "C" int has_avx2() { return 1; }
#endif
"""


def build_in_process(monkeypatch, capsys, env, *args):
    """``opforge build ARGS`` through cli.main: (exit status, stdout, stderr)."""
    for var in ("OPFORGE_CXX", "CXX", "OPFORGE_CXXFLAGS", "OPFORGE_INCLUDE_DIRS", "OPFORGE_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", env["OPFORGE_CACHE_DIR"])
    status = cli.main(["build", *map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@needs_gxx
def test_build_with_dtype_isa_layout_and_defines(env, tmp_path, monkeypatch, capsys):
    src = tmp_path / "variant.cc"
    src.write_text(VARIANT_CC)
    status, out, err = build_in_process(monkeypatch, capsys, env, src, "--dtype", "float64", "--dtype", "x=int16",
                                        "--isa", "avx2", "--layout", "nchw16c", "-D", "ANSWER=40", "-DEXTRA=2")
    assert status == 0, err
    lib = ctypes.CDLL(out.split()[0])
    assert (lib.elem_size(), lib.x_size(), lib.is_float64(), lib.answer()) == (8, 2, 1, 42)
    assert lib.blocked() == 1 and lib.has_avx2() == 1


@needs_gxx
@pytest.mark.parametrize("form", [["--cflags", "-DEXTRA=2"], ["--cflags=-DEXTRA=2"], ["--cflags", "-DEXTRA=2 -O1"],
                                  ["--cflags=-DEXTRA=1", "--cflags", "-UEXTRA -DEXTRA=2"]])
def test_build_cflags_forms(env, tmp_path, monkeypatch, capsys, form):
    src = tmp_path / "k.cc"
    src.write_text('extern "C" int answer() { return 40 + EXTRA; }\n')
    status, out, err = build_in_process(monkeypatch, capsys, env, src, *form)
    assert status == 0, err
    assert ctypes.CDLL(out.split()[0]).answer() == 42


@needs_gxx
def test_build_prebuilds_what_op_kernel_loads(env, tmp_path, monkeypatch, capsys, fresh):
    """The same options make the same flags, so `opforge build` fills the cache entry op.kernel uses."""
    import opforge

    src = tmp_path / "copy.cc"
    src.write_text('#include <cstdint>\n'
                   'extern "C" int Copy(int n, void **p, int *nd, int64_t **s, const char **t, void *st, void *e) {\n'
                   '  return sizeof(OPFORGE_T_x) == sizeof(float) ? 0 : 1;\n'
                   '}\n')
    status, out, err = build_in_process(monkeypatch, capsys, env, src, "--dtype", "x=float32", "--isa", "avx2")
    assert status == 0, err
    prebuilt = Path(out.split()[0])
    op = opforge.op("cli_test::copy(Tensor x) -> Tensor y")
    fresh.append(op.name)
    kernel = op.kernel(source=f"{src}:Copy", dtypes={"x": ["float32"]}, isa="avx2")
    assert kernel.load().library.path == prebuilt


def test_build_usage_errors_are_one_line(env, tmp_path, monkeypatch, capsys):
    src = tmp_path / "k.cc"
    src.write_text("int x;\n")
    for args, words in (((src, "--dtype", "complex7"), ["--dtype complex7"]),
                        ((src, "--dtype", "x-y=float32"), ["'x-y'", "not a C identifier"]),
                        ((src, "--layout", "nchw-16c"), ["--layout", "'nchw-16c'"]),
                        ((src, "-D", "1X=2"), ["macro '1X'"]),
                        ((src, "--cflags", "-DX='unclosed"), ["--cflags", "No closing quotation"]),
                        ((tmp_path / "k.cu", "--isa", "avx2"), ["--isa", ".cu"]),
                        ((tmp_path / "libk.so",), ["libk.so", "not a kernel source"])):
        status, out, err = build_in_process(monkeypatch, capsys, env, *args)
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("opforge build: "), err
        assert all(word in err for word in words), err


def test_unusable_cache_is_one_line(env, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    env["OPFORGE_CACHE_DIR"] = str(blocker)
    src = tmp_path / "k.cc"
    src.write_text("int x;\n")
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    done = opforge(env, "build", src)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and str(blocker) in done.stderr and "OPFORGE_CACHE_DIR" in done.stderr


# --------------------------------------------------------------------------
# opforge ops: users' ops


OPS_YAML = """\
ops:
  - schema: "cli_test::twice(Tensor x) -> Tensor y"
    infer: helpers_next_to_yaml:infer_twice
    kernels:
      - python: helpers_next_to_yaml:twice
        reference: true
"""

HELPERS = """\
import opforge

def infer_twice(x):
    return x

def twice(x):
    return x * 2
"""


def test_ops_load_finds_modules_next_to_the_file(env, tmp_path):
    folder = tmp_path / "decl"
    folder.mkdir()
    (folder / "ops.yaml").write_text(OPS_YAML)
    (folder / "helpers_next_to_yaml.py").write_text(HELPERS)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "opforge", "ops", "--load", str(folder / "ops.yaml")],
                          env=env, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("cli_test::twice(Tensor x) -> Tensor y\n", 1)[1].splitlines()[:2]
    assert listed == [f"    defined at: {folder / 'ops.yaml'} (op #1)",
                      "    kernel twice (cpu, reference)  helpers_next_to_yaml:twice"]
    assert "add(Tensor a, Tensor b)" in done.stdout  # the built-ins too


def test_ops_load_with_a_missing_module_is_one_line(env, tmp_path):
    (tmp_path / "ops.yaml").write_text(OPS_YAML.replace("helpers_next_to_yaml", "no_such_module_here"))
    done = opforge(env, "ops", "--load", tmp_path / "ops.yaml")
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    for word in (str(tmp_path / "ops.yaml"), "cli_test::twice", "no_such_module_here"):
        assert word in done.stderr


def test_ops_import_lists_a_modules_ops(env, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_cli_ops.py").write_text(
        "import opforge\n"
        "op = opforge.op('cli_test::halve(Tensor x) -> Tensor y')\n"
        "op.def_infer(opforge.infer.same_as(0))\n"
        "@op.kernel(device='cpu')\n"
        "def halve(x):\n"
        "    return x / 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the current folder first
    assert cli.main(["ops", "--import", "nope_mod"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import module 'nope_mod'" in err
    done = subprocess.run([sys.executable, "-m", "opforge", "ops", "--import", "my_cli_ops"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (f"cli_test::halve(Tensor x) -> Tensor y\n    defined at: {tmp_path / 'my_cli_ops.py'}:2\n"
            "    kernel halve (cpu)  my_cli_ops:halve\n") in done.stdout
    assert "    defined at: " + str(Path(opforge_package.__file__).parent / "builtins" / "relu.py") in done.stdout


TWO_VARIANTS = """\
import opforge
op = opforge.op("cli_test::triple(Tensor x) -> Tensor y")
op.def_infer(opforge.infer.same_as(0))
op.kernel(function="Triple", dtypes={"x": ["float32", "float64"]}, code=r'''
#include "custom_aot_extra.h"
extern "C" int Triple(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                      void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  for (int64_t i = 0; i < shapes[0][0]; i++) y[i] = 3 * x[i];
  return 0;
}
''')
"""


@needs_gxx
def test_build_op_compiles_every_variant_once(env, tmp_path):
    (tmp_path / "triple_ops.py").write_text(TWO_VARIANTS)
    env = {**env, "OPFORGE_QUIET": "0"}

    def build(*args):
        return subprocess.run([sys.executable, "-m", "opforge", "build", *args, "--import", "triple_ops"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    cold = build("--op", "cli_test::triple", "-j", "2")
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.strip().startswith("2 kernel variant(s) of 1 op(s): 2 compiled, 0 already built, 0 failed")
    warm = build("--all")  # --all: the ops --import declared; all built now
    assert warm.returncode == 0, warm.stderr
    assert "2 kernel variant(s) of 1 op(s): 0 compiled, 2 already built, 0 failed" in warm.stdout
    assert "compiled op" not in warm.stderr and "building" not in warm.stderr
    # the first call in a fresh process finds the variant built: no compile line
    run = subprocess.run([sys.executable, "-c", "import numpy as np, triple_ops; "
                          "print(triple_ops.op(np.ones(2, np.float32)).tolist())"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[3.0, 3.0]" and "compiled" not in run.stderr, run.stderr

    for args, message in ((["--op", "cli_test::nope"], "no op named 'cli_test::nope'"),
                          ([str(tmp_path / "triple_ops.py"), "--op", "cli_test::triple"], "not both")):
        done = build(*args)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_progress_draws_a_bar_on_a_terminal_and_logs_above_it(monkeypatch):
    import io
    import logging

    from opforge.runtime.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.delenv("OPFORGE_QUIET", raising=False)
    progress = Progress("building 4 kernel variant(s)", 4, after=0.0)
    progress.step(2)
    logging.getLogger("opforge.build").info("compiled op 'x', kernel X in 1.0 s")
    progress.close()
    text = screen.getvalue()
    bar = "opforge: building 4 kernel variant(s) [" + "#" * 15 + "." * 15 + "] 2/4 "
    assert text.startswith("\r\033[K" + bar)
    # the log line wipes the bar, prints, and draws the bar again below it
    assert "\r\033[Kopforge: compiled op 'x', kernel X in 1.0 s\n" + bar in text
    assert text.endswith("opforge: building 4 kernel variant(s): 4/4 done in " + text.rsplit(" in ", 1)[1])
    assert text.rstrip("\n").rsplit("\r\033[K", 1)[1].startswith("opforge: building 4 kernel variant(s): 4/4")

    monkeypatch.setenv("OPFORGE_QUIET", "1")  # silenced: nothing drawn
    screen.seek(0), screen.truncate()
    quiet = Progress("quiet", 2, after=0.0)
    quiet.step(1), quiet.close()
    assert screen.getvalue() == ""


def test_doctor_reports_the_frameworks_and_their_bridges(env):
    done = opforge(env, "doctor", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = {line.split(":")[0].strip(): line for line in done.stdout.splitlines()}
    for name in ("torch", "onnx", "jax"):  # installed by the test extra: each bridge runs a relu
        assert lines[name].endswith("bridge works"), done.stdout
    assert "onnxruntime" in lines and "cupy" in lines
    assert lines["threads"].startswith("threads: ")
