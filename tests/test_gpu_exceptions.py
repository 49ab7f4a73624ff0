"""Other libraries' C++ errors still reach Python as their own exceptions after opforge's GPU work.

On an H100/H200 machine (torch 2.11+cu130, jaxlib 0.11.2 with its CUDA plugin), error paths of torch and JAX
came back as ``SystemError: ... returned NULL without setting an exception`` (and torch's autograd reported
"translate_exception_to_python called with invalid exception pointer") in processes that had imported opforge
*before* torch; with torch imported first they kept their types.  opforge then loaded its extension into the
global symbol scope.  This test runs one fresh process through the stages below, with opforge imported first
and, separately, last, and checks after each stage that torch's and JAX's C++ errors arrive with their types,
so the first stage that breaks them is named in its output.  It needs a CUDA device (CI has none).
"""
import subprocess
import sys
import textwrap

import pytest

from opforge.runtime import cuda

pytestmark = pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA device (opforge.cuda.device_count() == 0)")

STAGES = textwrap.dedent(r'''
    import numpy as np, torch, jax, jax.numpy as jnp
    from torch.library import Library

    library = Library("tgpuexc", "DEF")

    def errors_arrive():
        for name, call in [("torch", lambda: torch.ops.aten.add.Tensor(torch.ones(2), "not a tensor")),
                           ("torch.library", lambda: library.define("not a name!(Tensor x) -> Tensor"))]:
            try:
                call()
                return f"{name} raised nothing"
            except SystemError as error:
                return f"{name}: SystemError {error}"
            except (RuntimeError, TypeError):
                pass
        try:  # a callback's error comes back through XLA's C++ runtime
            np.asarray(jax.jit(lambda v: jax.pure_callback(fail, jax.ShapeDtypeStruct(v.shape, v.dtype), v))(
                jnp.ones(3)))
            return "jax raised nothing"
        except SystemError as error:
            return f"jax: SystemError {error}"
        except jax.errors.JaxRuntimeError as error:
            return "ok" if "planned" in str(error) else f"jax: {error}"

    def fail(v):
        raise ValueError("planned")

    def stage(name, work):
        work()
        print(f"{name}: {errors_arrive()}", flush=True)

    stage("torch and jax imported", lambda: None)
    try:
        import cupy
        stage("cupy imported", lambda: cupy.ones(3).sum().item())
    except ImportError:
        print("cupy imported: ok (no cupy here)")
    import opforge
    from opforge import ops
    stage("opforge imported", lambda: None)
    x = torch.linspace(-1, 1, 64, device="cuda")
    stage("an elementwise GPU call on torch", lambda: ops.relu(x).sum().item())
    stage("a cuBLAS matmul", lambda: ops.matmul(x.reshape(8, 8), x.reshape(8, 8)).sum().item())
    g = jax.device_put(np.ones(16, np.float32), jax.devices("gpu")[0])
    stage("a GPU call on JAX arrays", lambda: np.asarray(ops.relu(g)))
    import opforge.jax
    stage("a jitted opforge op on the GPU", lambda: np.asarray(jax.jit(ops.relu)(g)))
    import opforge.torch
    stage("opforge.torch imported, relu a torch op", lambda: torch.ops.opforge.relu(x).sum().item())

    # Which C++ runtimes and unwinders the process holds, for a failure's message: two copies bound at once
    # would break C++ exceptions process-wide.
    import sys
    with open("/proc/self/maps") as maps:
        names = sorted({line.split()[-1] for line in maps if any(
            key in line for key in ("libstdc++", "libgcc_s", "libunwind", "libc++", "libcudart"))})
    print("\n".join(names), file=sys.stderr)
''')


@pytest.mark.parametrize("first", ["opforge", "torch"])
def test_torch_and_jax_errors_keep_their_types_after_opforge_gpu_work(first):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = ("import opforge\n" if first == "opforge" else "") + STAGES
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    stages = done.stdout.strip().splitlines()
    assert len(stages) == 8 and all(line.endswith(": ok") for line in stages), done.stdout
