"""Benchmark opforge's build cache.

    python benchmarks/build_cache.py

1. Cold build of a small aot kernel through opforge versus plain
   ``g++ -std=c++17 -O3 -shared -fPIC`` of the same file (ratio printed).
2. Warm load in a fresh process: a child process times ``import opforge``
   alone, another ``import opforge`` + ``build(source)`` + ``load_library``
   on the warm cache; the difference of the medians is the cost of a warm
   load (target <= 20 ms).

Everything runs in a temporary cache folder.  The last line is
``warm_load_ms: <value>``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import opforge  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from opforge.runtime.build import build, clear_cache, include_dir  # noqa: E402

KERNEL = r"""
#include "custom_aot_extra.h"
#include <cstdint>

extern "C" int CustomScaleAdd(int nparam, void **params, int *ndims, int64_t **shapes,
                              const char **dtypes, void *stream, void *extra) {
  auto *aot = static_cast<AotExtra *>(extra);
  const float scale = aot->Attr<float>("scale");
  const float *x = static_cast<const float *>(params[0]);
  const float *y = static_cast<const float *>(params[1]);
  float *out = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; ++i) n *= shapes[0][i];
  for (int64_t i = 0; i < n; ++i) out[i] = scale * x[i] + y[i];
  return 0;
}
"""

CHILD_IMPORT = """
import time
t0 = time.perf_counter()
import opforge
print(time.perf_counter() - t0)
"""

CHILD_WARM = """
import sys, time
t0 = time.perf_counter()
import opforge
from opforge.runtime.build import build
from opforge.runtime.library import load_library
built = build(sys.argv[1])
lib = load_library(built.path, cxx11_abi=built.cxx11_abi)
lib.address("CustomScaleAdd")
elapsed = time.perf_counter() - t0
assert built.from_cache, "expected a warm cache"
print(elapsed)
"""

COLD_RUNS = 3
WARM_RUNS = 11


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child_seconds(script: str, *args: str, env: dict) -> float:
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, check=True,
                          capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    gxx = shutil.which("g++")
    if gxx is None:
        print("g++ is not installed; nothing to measure", file=sys.stderr)
        return 1
    package_root = str(Path(sys.modules["opforge.runtime.build"].__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="opforge-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["OPFORGE_CACHE_DIR"] = str(tmp / "cache")
        for var in ("OPFORGE_CXX", "CXX", "OPFORGE_CXXFLAGS", "OPFORGE_INCLUDE_DIRS", "OPFORGE_VERBOSE"):
            os.environ.pop(var, None)
        source = tmp / "scale_add.cc"
        source.write_text(KERNEL)

        # 1. cold build: opforge (empty cache every time) vs plain g++
        plain_cmd = [gxx, "-std=c++17", "-O3", "-shared", "-fPIC", "-I", str(include_dir()),
                     str(source), "-o", str(tmp / "plain.so")]
        plain, ours = [], []
        for _ in range(COLD_RUNS):
            plain.append(timed(lambda: subprocess.run(plain_cmd, check=True)))
            clear_cache()
            ours.append(timed(lambda: build(source)))
        plain_s, ours_s = statistics.median(plain), statistics.median(ours)
        print(f"cold build, plain g++:        {plain_s * 1e3:8.1f} ms (median of {COLD_RUNS})")
        print(f"cold build, opforge.build:    {ours_s * 1e3:8.1f} ms (median of {COLD_RUNS})")
        print(f"cold ratio opforge/g++:       {ours_s / plain_s:8.3f}")

        # in-process warm hit, for reference
        hits = [timed(lambda: build(source)) for _ in range(200)]
        print(f"warm build() in-process:      {statistics.median(hits) * 1e3:8.3f} ms (median of 200)")

        # 2. warm load in a fresh process
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        child_seconds(CHILD_WARM, str(source), env=env)  # warm the OS file cache
        imports, warms = [], []
        for _ in range(WARM_RUNS):  # interleaved, so drift hits both alike
            imports.append(child_seconds(CHILD_IMPORT, env=env))
            warms.append(child_seconds(CHILD_WARM, str(source), env=env))
        import_ms = statistics.median(imports) * 1e3
        warm_ms = statistics.median(warms) * 1e3
        print(f"fresh process, import opforge:            {import_ms:8.2f} ms (median of {WARM_RUNS})")
        print(f"fresh process, import + build + load:     {warm_ms:8.2f} ms (median of {WARM_RUNS})")
        print(f"warm_load_ms: {warm_ms - import_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
