"""Single calls on bfloat16 and float16 CPU tensors (torch's) compute in the ops' float32 kernels between
casts (runtime.widen): the results are torch's own float32 computation rounded to the narrow dtype, to
one rounding of the narrow dtype, and nothing compiles."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opforge
import opforge.torch as ot
from helpers import declare, run_without_compiler
from opforge import TensorSpec
from opforge.errors import DTypeError
from opforge.runtime.buffer_plan import BufferPlan
from opforge.runtime.widen import WidenedPlan, plan_buffers

ot.register_all()
ops = torch.ops.opforge
NARROW = [torch.bfloat16, torch.float16]
# the float32 results may round to neighbouring narrow values: one unit in the last place, relative
TOLERANCE = {torch.bfloat16: dict(rtol=2**-7, atol=1e-5), torch.float16: dict(rtol=2**-10, atol=1e-6)}


def narrow(*shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_rounded(got, want32, dtype):
    """``got`` is ``want32`` (float32) rounded to ``dtype``, to one rounding."""
    assert got.dtype == dtype and got.shape == want32.shape
    torch.testing.assert_close(got.float(), want32.to(dtype).float(), **TOLERANCE[dtype])


CASES = {
    "add_broadcast": (lambda a, b: ops.add(a, b), lambda a, b: a + b, [(4, 1, 8), (3, 8)]),
    "mul": (lambda a, b: ops.mul(a, b), lambda a, b: a * b, [(5, 7), (5, 7)]),
    "sub_scalar_like": (lambda a, b: ops.sub(a, b), lambda a, b: a - b, [(6, 9), ()]),
    "matmul": (lambda a, b: ops.matmul(a, b), lambda a, b: a @ b, [(2, 17, 33), (2, 33, 9)]),
    "softmax": (lambda x: ops.softmax(x, axis=1), lambda x: torch.softmax(x, 1), [(3, 40, 2)]),
    "relu": (lambda x: ops.relu(x), torch.relu, [(100,)]),
    "gelu": (lambda x: ops.gelu(x), torch.nn.functional.gelu, [(10, 10)]),
    "tanh": (lambda x: ops.tanh(x), torch.tanh, [(64,)]),
    "add_empty": (lambda a, b: ops.add(a, b), lambda a, b: a + b, [(0, 8), (8,)]),
    "matmul_empty": (lambda a, b: ops.matmul(a, b), lambda a, b: a @ b, [(3, 0), (0, 4)]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", NARROW, ids=str)
def test_narrow_calls_match_torch_in_float32(case, dtype):
    call, reference, shapes = CASES[case]
    args = [narrow(*shape, dtype=dtype, seed=k) for k, shape in enumerate(shapes)]
    assert_rounded(call(*args), reference(*(a.float() for a in args)), dtype)


@pytest.mark.parametrize("dtype", NARROW, ids=str)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_on_narrow_tensors(dtype, with_bias):
    x, scale, bias = narrow(4, 6, 32, dtype=dtype), narrow(32, dtype=dtype, seed=1), narrow(32, dtype=dtype, seed=2)
    y, mean, inv = ops.layer_norm(x, scale, bias if with_bias else None, axis=-1, epsilon=1e-5)
    x32 = x.float()
    want = torch.nn.functional.layer_norm(x32, (32,), scale.float(), bias.float() if with_bias else None, 1e-5)
    assert_rounded(y, want, dtype)
    assert_rounded(mean, x32.mean(-1, keepdim=True), dtype)
    assert_rounded(inv, torch.rsqrt(x32.var(-1, unbiased=False, keepdim=True) + 1e-5), dtype)


def test_a_narrow_call_plans_its_float32_kernel_between_casts():
    from opforge.runtime.aot import AotKernel

    add = opforge.lookup("add")
    plan = plan_buffers(add, {}, [TensorSpec((4, 8), "bfloat16"), TensorSpec((8,), "bfloat16")], "cpu")
    assert isinstance(plan, WidenedPlan) and plan.native and plan.function is None and plan.extra is None
    assert isinstance(plan.kernel, AotKernel) and plan.inner.dtypes == ("float32",) * 3
    assert [s.dtype for s in plan.out_specs] == ["bfloat16"]
    assert plan.workspace_bytes % 64 == 0 and all(size % 64 == 0 for size in plan.workspace)
    # float32 calls, and calls on the GPU, are planned as before
    assert type(plan_buffers(add, {}, [TensorSpec((4, 8), "float32")] * 2, "cpu")) is BufferPlan


def test_a_narrow_op_without_a_float32_native_kernel_raises_a_dtype_error(fresh):
    op = declare(fresh, "tbf16::halve(Tensor x) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x / 2, dtypes={"x": ["float32"]})  # a Python kernel only
    ot.register(op)
    with pytest.raises(DTypeError, match="tbf16::halve.*bfloat16"):
        torch.ops.tbf16.halve(torch.ones(3, dtype=torch.bfloat16))


def test_mixed_float32_and_bfloat16_inputs_raise_a_dtype_error():
    with pytest.raises(DTypeError, match="'add'"):
        ops.add(torch.ones(3), torch.ones(3, dtype=torch.bfloat16))


NARROW_CHILD = """
    import torch, opforge.torch as ot
    ot.register('add', 'matmul', 'layer_norm')
    a = torch.randn(4, 8).to(torch.bfloat16)
    w = torch.randn(8, 3).to(torch.bfloat16)
    y = torch.ops.opforge.add(a, a)
    z = torch.ops.opforge.matmul(a, w)
    n = torch.ops.opforge.layer_norm(a, a[0], None)[0]
    assert y.dtype == z.dtype == n.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), (a.float() + a.float()).to(torch.bfloat16).float())
    torch.testing.assert_close(z.float(), (a.float() @ w.float()).to(torch.bfloat16).float(), rtol=2**-7, atol=1e-5)
    print(json.dumps(BUILDS))
"""


def test_narrow_calls_need_no_compiler(tmp_path):
    done, cache = run_without_compiler(tmp_path, NARROW_CHILD, OPFORGE_CXX="/nonexistent", OPFORGE_TORCH_FAST="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout  # every kernel came from the prebuilt set


def test_narrow_calls_without_the_cpp_path():
    script = "import json\nBUILDS = []\n" + textwrap.dedent(NARROW_CHILD)
    env = dict(os.environ, OPFORGE_TORCH_FAST="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("[]"), done.stderr[-2000:]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_bfloat16_activations_meet_float32_weights_and_train(compiled):
    """In torch.autocast, a Linear's bfloat16 output meets layer_norm's float32 scale and bias: the op
    promotes its floating inputs to one dtype (the widest) instead of refusing the mix, and the
    float32 parameters get float32 gradients."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    scale = torch.nn.Parameter(torch.rand(8) + 0.5)
    bias = torch.nn.Parameter(torch.rand(8))

    def forward(x, layer_norm):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = linear(x)
            assert compiled or h.dtype == torch.bfloat16
            return ops.relu(layer_norm(h, scale, bias)).sum()

    def ours(h, s, b):
        return ops.layer_norm(h, s, b, axis=-1, epsilon=1e-5)[0]

    def torchs(h, s, b):
        return torch.nn.functional.layer_norm(h.float(), (8,), s, b, 1e-5)

    x = torch.randn(4, 8)
    run = torch.compile(forward, backend="aot_eager") if compiled else forward
    loss = run(x, ours)
    loss.backward()
    grads = [p.grad.clone() for p in (scale, bias)]
    for p in (scale, bias):
        p.grad = None
    expected = forward(x, torchs)
    expected.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for got, p in zip(grads, (scale, bias)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-5)



def test_float32_to_bfloat16_rounds_as_torch_does():
    """The vectorized narrowing: ties to even, infinities, subnormals, overflow to infinity, NaN kept,
    over a length that leaves a tail after the vector loop."""
    special = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -2.5e-39, 3.4e38, 3.3961e38,
                            1.00390625, 1.01171875, 1.0078125, -1.0078125, 65504.0, 1e-45])
    values = torch.cat([special, torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 1e4])
    got = ops.cast(values, dtype=torch.bfloat16)
    assert torch.equal(got.view(torch.int16), values.bfloat16().view(torch.int16))
    nan = ops.cast(torch.tensor([float("nan")] * 9), dtype=torch.bfloat16)
    assert torch.isnan(nan.float()).all()
