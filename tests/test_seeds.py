"""The seed programs: MindSpore's aot examples, run on opforge with only their imports changed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SEED = Path(__file__).resolve().parent / "seeds" / "seed_custom_aot.py"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def run_python(args, cwd=ROOT):
    """Run a Python program in a fresh interpreter sharing this session's kernel cache."""
    env = dict(os.environ)
    assert env.get("OPFORGE_CACHE_DIR")  # set by conftest.py
    done = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_gxx
@pytest.mark.parametrize("script, expected", [
    ("seed_add_reduce.py", "[10. 10. 10. 10.]\n"),
    ("seed_add_mul_div.py", "[3. 3. 3.]\n"),
])
def test_example_seed_programs(script, expected):
    assert run_python([EXAMPLES / script]) == expected


@needs_gxx
def test_tutorial_program_with_only_its_imports_changed():
    # The tutorial's test_custom_aot.py refers to "./kernel.cc": run it where kernel.cc is.
    text = SEED.read_text()
    assert '"./kernel.cc:CustomKernel"' in text and "import mindspore" not in text
    assert run_python([SEED], cwd=EXAMPLES / "aot") == "[10. 10. 10. 10.]\n"


@needs_gxx
def test_cell_set_inputs_with_a_dynamic_spec():
    from opforge.compat.mindspore import Tensor
    from opforge.compat.mindspore import dtype as mstype
    from opforge.compat.mindspore.nn import Cell
    import opforge.compat.mindspore.ops as ops
    from opforge.compat.mindspore.ops import CustomRegOp, DataType

    class ReduceNet(Cell):
        def __init__(self, axis, keep_dim):
            super().__init__()
            info = CustomRegOp("reduce_kernel_cpu").input(0, "x1").input(0, "x2").output(0, "y") \
                .dtype_format(DataType.None_None, DataType.None_None, DataType.None_None) \
                .attr("axis", "required", "all", value=axis) \
                .attr("keep_dim", "required", "all", value=keep_dim).target("CPU").get_op_info()
            self.program = ops.Custom(f"{EXAMPLES / 'aot' / 'kernel.cc'}:CustomKernel", None, mstype.float32, "aot",
                                      reg_info=info)

        def construct(self, x, y):
            return self.program(x, y)

    net = ReduceNet(axis=1, keep_dim=False)
    dynamic = Tensor(shape=[4, None], dtype=mstype.float32)
    net.set_inputs(dynamic, dynamic)
    rng = np.random.default_rng(0)
    for columns in (5, 2, 9):  # any number of columns matches [4, None]
        x = rng.standard_normal((4, columns)).astype(np.float32)
        y = rng.standard_normal((4, columns)).astype(np.float32)
        out = net(Tensor(x), Tensor(y))
        assert isinstance(out, Tensor)
        np.testing.assert_allclose(out.asnumpy(), (x + y).sum(axis=1), rtol=1e-5, atol=1e-6)
    bad = np.ones((3, 5), np.float32)  # 3 rows contradict the declared 4
    with pytest.raises(opforge.ShapeError):
        net(Tensor(bad), Tensor(bad))
    with pytest.raises(opforge.ShapeError):
        net(Tensor(np.ones((4, 5, 1), np.float32)), Tensor(np.ones((4, 5, 1), np.float32)))  # wrong rank


@pytest.fixture(scope="module")
def cuda_seed_library():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    return opforge.build(EXAMPLES / "aot" / "add_mul_div.cu")


def test_cuda_seed_compiles(cuda_seed_library):
    assert cuda_seed_library.path.is_file()
    assert cuda_seed_library.path.name == "add_mul_div.cu.so"  # MindSpore's naming: <file name>.so
    assert cuda_seed_library.cxx11_abi is False  # MindSpore's flags: -D_GLIBCXX_USE_CXX11_ABI=0
    if shutil.which("nm"):
        symbols = subprocess.run(["nm", "-D", "--defined-only", str(cuda_seed_library.path)], capture_output=True,
                                 text=True, check=True).stdout.split()
        assert "CustomAddMulDiv" in symbols


def test_cuda_seed_runs_on_the_gpu(cuda_seed_library):
    from opforge.runtime import cuda

    if cuda.device_count() == 0:
        pytest.skip("no CUDA device")
    assert run_python([EXAMPLES / "seed_add_mul_div.py", "--gpu"]) == "[3. 3. 3.]\n"


def test_cuda_op_without_a_device_is_a_cuda_error(cuda_seed_library):
    from opforge.compat.mindspore.ops import CustomRegOp
    from opforge.runtime import cuda

    if cuda.device_count() > 0:
        pytest.skip("a CUDA device is present")
    info = CustomRegOp().input(0, "x1").input(1, "x2").output(0, "y1").output(1, "y2").output(2, "y3") \
        .target("GPU").get_op_info()
    op = opforge.Custom(f"{EXAMPLES / 'aot' / 'add_mul_div.cu'}:CustomAddMulDiv", ([3], [3], [3]),
                        ("float32",) * 3, "aot", reg_info=info)
    assert op.aot_kernel.device == "gpu"
    x = np.ones(3, np.float32)
    with pytest.raises(opforge.CudaError):
        op(x, x)
