"""opforge ops as PyTorch ops (opforge.torch): torch.library registration, kernels on the
tensors' own memory, fake kernels for torch.compile / torch.export, autograd from the
gradient rules, typed errors.  torch is in the test extra, so all of this runs in CI; the
CUDA cases skip without a CUDA build of torch and a device."""
import numpy as np
import pytest
import torch

import opforge
import opforge.torch as ot
from helpers import WHICH_ISA, addresses_op, declare
from opforge import ops
from opforge.errors import CheckError, DeviceError, DTypeError, GradientError, KernelError, SchemaError, ShapeError

# y = scale * x, in C++, with a gradient rule written with opforge ops.
SCALE = r"""
#include "custom_aot_extra.h"
extern "C" int Scale(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  auto *e = static_cast<AotExtra *>(extra);
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  const float scale = e->Attr<float>("scale");
  if (scale == 13) return 7;  // a kernel failure the tests provoke
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = static_cast<OPFORGE_T>(scale * x[i]);
  return 0;
}
"""


@pytest.fixture
def scale(fresh):
    op = declare(fresh, "ttorch::scale(Tensor x, *, float scale=2.0) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(code=SCALE, function="Scale", dtypes={"x": ["float32", "float64"]})

    @op.grad
    def _(saved, dy, *, scale):
        return ops.mul(dy, scale)

    return op


@pytest.fixture
def addresses(fresh):
    return addresses_op(fresh, "ttorch::addresses")


# -- registration and schemas ----------------------------------------------------------

def test_every_builtin_becomes_a_torch_op():
    builtins = [op for op in opforge.registered_ops() if "::" not in op.name]
    assert len(builtins) > 60
    ot.register_all()
    for op in builtins:
        packet = getattr(torch.ops.opforge, op.name)
        assert packet.default._schema.name == f"opforge::{op.name}"


def test_schema_translation(fresh):
    op = declare(fresh, "my.lib::probe(Tensor x, Tensor? b, float alpha, *, int k=3, bool flag=True, "
                        "str mode='fast', int[] axes=[0, 1], float[] taps=[0.5], Shape shape=[2, -1], "
                        "DType dtype='float64', float hi=1e999) -> (Tensor y, Tensor z)")
    assert ot.torch_schema(op) == (
        "probe(Tensor x, Tensor? b, float alpha, *, int k=3, bool flag=True, str mode='fast', "
        "int[] axes=[0, 1], float[] taps=[0.5], SymInt[] shape=[2, -1], ScalarType? dtype=None, "
        "float? hi=None) -> (Tensor y, Tensor z)")
    packet = ot.register(op)
    assert packet is torch.ops.my_lib.probe  # a dotted namespace: dots become underscores


def test_defaults_torch_cannot_read_become_none_and_read_back(fresh):
    # torch parses float defaults with std::stod, which refuses subnormals (an IndexError from torch's define)
    op = declare(fresh, "tsub::tiny(Tensor x, *, float eps=4e-320, float[] taps=[1.0, -2.5e-315]) -> Tensor y")
    assert ot.torch_schema(op) == "tiny(Tensor x, *, float? eps=None, float[]? taps=None) -> Tensor y"
    seen = {}

    @op.infer_shape
    def _(x, *, eps, taps):
        seen.update(eps=eps, taps=taps)
        return x

    op.kernel(lambda x, *, eps, taps: x * 2)
    torch.ops.tsub.tiny(torch.ones(2))
    assert seen == {"eps": 4e-320, "taps": (1.0, -2.5e-315)}


def test_a_schema_torch_refuses_leaves_the_op_an_opforge_op(fresh, monkeypatch):
    def refuse(self, schema, *args, **kwargs):
        raise IndexError("stod")  # what torch's define raised for a subnormal default

    monkeypatch.setattr(torch.library.Library, "define", refuse)
    op = declare(fresh, "trefuse::op(Tensor x) -> Tensor y")  # declared: the listener's define fails quietly
    assert opforge.lookup("trefuse::op") is op
    with pytest.raises(opforge.SchemaError, match="'trefuse::op': PyTorch cannot define it.*stod"):
        ot.register(op)


def test_untranslatable_attributes_and_unknown_names_are_schema_errors(fresh):
    from opforge.attrs import AttrDef
    from opforge.operator import Op

    loose = Op("ttorch::loose", ["x"], ["y"], [AttrDef("anything")])
    with pytest.raises(SchemaError, match="'ttorch::loose'.*'anything' has type any and no default"):
        ot.register(loose)
    with pytest.raises(SchemaError, match="no op and no namespace is named 'ttorch_nothing'"):
        ot.register("ttorch_nothing")


def test_register_a_namespace_and_the_defaults_read_back(scale):
    assert ot.register("ttorch") is torch.ops.ttorch.scale  # the namespace holds one op
    x = torch.arange(4, dtype=torch.float32)
    torch.testing.assert_close(torch.ops.ttorch.scale(x), 2 * x)
    torch.testing.assert_close(torch.ops.ttorch.scale(x, scale=0.5), 0.5 * x)
    clip = ot.register("clip")  # its bounds default to infinities, which torch's schemas cannot write
    y = torch.tensor([-np.inf, -1.0, 3.0, np.inf], dtype=torch.float64)
    torch.testing.assert_close(clip(y), y)
    torch.testing.assert_close(clip(y, max=1.0), torch.tensor([-np.inf, -1.0, 1.0, 1.0], dtype=torch.float64))


def test_a_replaced_op_is_defined_again(fresh):
    first = declare(fresh, "ttorch::again(Tensor x) -> Tensor y")
    first.def_infer(opforge.infer.same_as(0))
    first.kernel(lambda x: x + 1)
    ot.register(first)
    assert torch.ops.ttorch.again(torch.zeros(2)).tolist() == [1.0, 1.0]
    second = opforge.op("ttorch::again(Tensor x, *, int by=5) -> Tensor y", replace=True)
    second.def_infer(opforge.infer.same_as(0))
    second.kernel(lambda x, *, by: x + by)
    ot.register(second)
    assert torch.ops.ttorch.again(torch.zeros(2)).tolist() == [5.0, 5.0]


# -- the real kernel --------------------------------------------------------------------

def test_kernels_read_the_tensors_memory_and_write_torch_allocated_outputs(addresses):
    ot.register(addresses)
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.ones(5, dtype=torch.float64)
    seen = torch.ops.ttorch.addresses(a, b)
    assert isinstance(seen, torch.Tensor) and seen.dtype == torch.int64
    assert seen[:2].tolist() == [a.data_ptr(), b.data_ptr()]
    assert seen[2].item() == seen.data_ptr()  # the kernel wrote into the tensor torch allocated


def test_plain_calls_take_the_cpp_path_and_the_rest_python(scale, monkeypatch):
    from opforge.torch import fast

    ot.register(scale)
    assert fast.library() is not None, fast.reason()
    x = torch.arange(4, dtype=torch.float32)
    torch.testing.assert_close(torch.ops.ttorch.scale(x, scale=3.0), 3 * x)  # the signature's plan is made
    from opforge.runtime.buffer_plan import BufferPlan

    python_calls = []
    run = BufferPlan.run
    monkeypatch.setattr(BufferPlan, "run", lambda self, *a, **k: python_calls.append(self.op.name) or run(self, *a, **k))
    torch.testing.assert_close(torch.ops.ttorch.scale(x + 1, scale=3.0), 3 * (x + 1))
    assert python_calls == []  # a known signature: the call ran in C++
    with pytest.raises(KernelError):
        torch.ops.ttorch.scale(x, scale=13.0)  # the kernel fails in C++: Python runs it again and raises
    assert python_calls == ["ttorch::scale"]


def test_an_absent_optional_input_takes_the_cpp_path(monkeypatch):
    from opforge.runtime.buffer_plan import BufferPlan

    x, scale = torch.randn(8, 16), torch.rand(16) + 0.5
    expected = torch.nn.functional.layer_norm(x, (16,), scale, None, 1e-5)
    torch.testing.assert_close(torch.ops.opforge.layer_norm(x, scale, None)[0], expected)  # planned
    python_calls = []
    run = BufferPlan.run
    monkeypatch.setattr(BufferPlan, "run", lambda self, *a, **k: python_calls.append(self.op.name) or run(self, *a, **k))
    torch.testing.assert_close(torch.ops.opforge.layer_norm(x, scale, None)[0], expected)
    torch.testing.assert_close(torch.ops.opforge.layer_norm(x, scale)[0], expected)  # bias left out
    assert python_calls == []


def test_a_dtype_attribute_takes_the_cpp_path(monkeypatch):
    """A ScalarType argument is an int to torch's dispatcher: the C++ path reads it as a dtype."""
    from opforge.runtime.buffer_plan import BufferPlan

    x = torch.randn(5, 7)
    for dtype in (torch.bfloat16, torch.float64):
        assert torch.equal(torch.ops.opforge.cast(x, dtype=dtype), x.to(dtype))  # planned
    python_calls = []
    run = BufferPlan.run
    monkeypatch.setattr(BufferPlan, "run", lambda self, *a, **k: python_calls.append(self.op.name) or run(self, *a, **k))
    for dtype in (torch.bfloat16, torch.float64):
        assert torch.equal(torch.ops.opforge.cast(x + 1, dtype=dtype), (x + 1).to(dtype))
    assert python_calls == []


def test_without_the_cpp_path_calls_run_in_python(tmp_path):
    import subprocess
    import sys

    script = (
        "import torch, opforge, opforge.torch as ot\n"
        "from opforge.torch import fast\n"
        "assert fast.library() is None and fast.reason() == 'OPFORGE_TORCH_FAST=0'\n"
        "x = torch.tensor([-1.0, 2.0], requires_grad=True)\n"
        "ot.register('relu')\n"
        "y = torch.ops.opforge.relu(x)\n"
        "y.sum().backward()\n"
        "assert y.tolist() == [0.0, 2.0] and x.grad.tolist() == [0.0, 1.0]\n"
        "print('ok')\n")
    env = dict(__import__("os").environ, OPFORGE_TORCH_FAST="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_strided_inputs_are_made_contiguous_first(scale):
    ot.register(scale)
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    torch.testing.assert_close(torch.ops.ttorch.scale(x, scale=3.0), 3.0 * x)


def test_dtype_and_isa_dispatch_stay_opforges(fresh):
    op = declare(fresh, "ttorch::which_isa(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))
    for isa in ("sse41", "avx2", "avx512"):
        op.kernel(code=WHICH_ISA, function="WhichIsa", isa=isa, dtypes={"x": ["float32"]})
    ot.register(op)
    x = np.zeros(1, np.float32)
    assert torch.ops.ttorch.which_isa(torch.from_numpy(x)).item() == op(x).item() > 0
    try:
        opforge.set_isa_cap("sse41")  # the cap re-chooses kernels for the torch op too
        assert torch.ops.ttorch.which_isa(torch.from_numpy(x)).item() == 41
    finally:
        opforge.set_isa_cap(None)


def test_float64_and_float32_run_their_own_variants(scale):
    ot.register(scale)
    for dtype in (torch.float32, torch.float64):
        x = torch.linspace(-1, 1, 7, dtype=dtype)
        y = torch.ops.ttorch.scale(x, scale=1.5)
        assert y.dtype == dtype
        torch.testing.assert_close(y, 1.5 * x)


def test_several_outputs_and_optional_inputs():
    ot.register("topk")
    values, indices = torch.ops.opforge.topk(torch.tensor([[3.0, 1.0, 2.0]]), k=2)
    assert values.tolist() == [[3.0, 2.0]] and indices.tolist() == [[0, 2]] and indices.dtype == torch.int64
    ot.register("gemm")
    a, b = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.ops.opforge.gemm(a, b), a @ b)
    torch.testing.assert_close(torch.ops.opforge.gemm(a, b, torch.ones(4, dtype=torch.float64)), a @ b + 1)


def test_variadic_inputs_are_a_list():
    ot.register("concat")
    parts = [torch.ones(2, 1), torch.zeros(2, 3)]
    torch.testing.assert_close(torch.ops.opforge.concat(parts, axis=1), torch.cat(parts, dim=1))


# -- errors keep their opforge types ------------------------------------------------------

def test_a_meta_tensor_beside_a_cpu_tensor_is_a_device_error():
    with pytest.raises(DeviceError, match="input 'b' is on meta"):
        torch.ops.opforge.add(torch.ones(3), torch.ones(3, device="meta"))
    assert torch.ops.opforge.add(torch.ones(3, device="meta"), torch.ones(3, device="meta")).is_meta


def test_a_python_kernel_leaves_the_callers_tensors_resizable(fresh):
    """Its NumPy views come through DLPack (Tensor.numpy() would pin the storage's size, which
    FSDP2 changes), and its outputs are torch's own tensors."""
    op = declare(fresh, "ttorch::twice(Tensor x) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))

    @op.kernel
    def _(x):
        return x * 2

    x = torch.arange(6.0).reshape(2, 3)[:, 1]  # strided: made contiguous first
    y = torch.ops.ttorch.twice(x)
    torch.testing.assert_close(y, torch.tensor([2.0, 8.0]))
    plain = torch.arange(4.0)
    torch.ops.ttorch.twice(plain)
    plain.resize_(10)
    y.resize_(12)
    assert plain.shape == (10,) and y.shape == (12,)


def test_errors_keep_their_types_through_torch_ops(scale):
    ot.register(scale)
    ot.register("softmax")
    with pytest.raises(DTypeError, match="softmax.*int64"):
        torch.ops.opforge.softmax(torch.arange(3))
    with pytest.raises(CheckError, match="axis 5 is out of range"):
        torch.ops.opforge.softmax(torch.ones(2, 3), axis=5)
    with pytest.raises(KernelError, match=r"ttorch::scale.*Scale.*error code 7"):
        torch.ops.ttorch.scale(torch.ones(3), scale=13.0)
    with pytest.raises(DTypeError, match=r"'ttorch::scale'.*input 'x' has dtype torch.complex64"):
        torch.ops.ttorch.scale(torch.ones(3, dtype=torch.complex64))
    with pytest.raises(RuntimeError, match="scale"):  # torch checks argument types against the schema
        torch.ops.ttorch.scale(torch.ones(3), scale="big")


# -- the fake kernel: torch.compile and torch.export ---------------------------------------

def test_torch_compile_fullgraph_dynamic(scale):
    ot.register(scale)
    ot.register_all()

    def f(x, w):
        h = torch.ops.opforge.matmul(x, w)
        h = torch.ops.ttorch.scale(torch.ops.opforge.relu(h), scale=0.5)
        return torch.ops.opforge.reduce_sum(h, axes=[1], keep_dims=False)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    w = torch.randn(4, 3)
    for rows in (2, 5, 9):  # sizes the graph was not specialized for
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x, w), f(x, w))
    explained = torch._dynamo.explain(f)(torch.randn(6, 4), w)
    assert explained.graph_break_count == 0


def test_torch_export_keeps_the_op_with_a_dynamic_dim(scale):
    ot.register(scale)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.ttorch.scale(x, scale=3.0) + 1

    batch = torch.export.Dim("batch")
    program = torch.export.export(Model(), (torch.randn(4, 2),), dynamic_shapes={"x": {0: batch}})
    assert "ttorch.scale" in str(program.graph)
    x = torch.randn(7, 2)
    torch.testing.assert_close(program.module()(x), 3.0 * x + 1)


def test_a_size_only_the_data_decides_traces_as_an_unbacked_size(fresh):
    positives = declare(fresh, "ttorch::positives(Tensor x) -> Tensor y", traits=["no_side_effect"])
    positives.def_infer(lambda x: opforge.TensorSpec([-1], x.dtype))  # how many: known only from the data

    @positives.kernel
    def _(x):
        return x[x > 0]

    ot.register(positives)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.ttorch.positives(x) * 2

    program = torch.export.export(Model(), (torch.randn(8),))
    (length,) = next(node.meta["val"].shape for node in program.graph.nodes
                     if node.op == "call_function" and "positives" in str(node.target))
    assert isinstance(length, torch.SymInt)  # an unbacked size, not the example's count
    # Running it needs every output dim before the kernel runs (opforge allocates outputs first):
    with pytest.raises(ShapeError, match="every output dim known"):
        program.module()(torch.randn(8))


def test_dynamic_compile_keeps_the_batch_free_beside_a_fixed_size_parameter():
    """matmul(x, weight): x's inner dim is tied to the parameter's (pinned, with a guard), its batch
    stays a symbol, so new batch sizes reuse the graph, forward and backward."""
    from torch._dynamo.utils import counters

    weight = torch.nn.Parameter(torch.randn(16, 8, dtype=torch.float64))

    def f(x):
        return torch.ops.opforge.relu(torch.ops.opforge.matmul(x, weight))

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, dynamic=True, backend="aot_eager")
    for batch in (2, 3, 5, 7):
        x = torch.randn(batch, 16, dtype=torch.float64)
        y = compiled(x)
        torch.testing.assert_close(y, torch.relu(x @ weight))
        y.sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_fake_shapes_follow_symbols_through_sums_and_specialize_otherwise():
    from torch.fx.experimental.proxy_tensor import make_fx

    ot.register("concat")
    ot.register("conv")

    def f(a, b, x, w):
        return torch.ops.opforge.concat([a, b], axis=0), torch.ops.opforge.conv(x, w, strides=[2, 2])

    traced = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 2), torch.randn(5, 2), torch.randn(1, 1, 9, 9),
                                                 torch.randn(1, 1, 3, 3))
    shapes = [node.meta["val"].shape for node in traced.graph.nodes if node.op == "call_function"]
    joined, conv = shapes
    a_rows, b_rows = (node.meta["val"].shape[0] for node in traced.graph.nodes if node.op == "placeholder"
                      and node.meta["val"].shape[-1] == 2)
    assert isinstance(joined[0], torch.SymInt)  # a sum of the two symbols, not a specialized size
    assert str(joined[0]).replace(" ", "") in (f"{a_rows}+{b_rows}", f"{b_rows}+{a_rows}")
    assert list(conv) == [1, 1, 4, 4] or all(isinstance(d, (int, torch.SymInt)) for d in conv)


# -- autograd ---------------------------------------------------------------------------

def test_backward_follows_the_gradient_rule(scale):
    ot.register(scale)
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.ops.ttorch.scale(x, scale=3.0)
    (y * y).sum().backward()
    torch.testing.assert_close(x.grad, 2 * (3.0 * x.detach()) * 3.0)


def test_backward_agrees_with_opforge_grad():
    w = np.random.default_rng(1).standard_normal((4, 3))

    def loss(x):
        return ops.reduce_sum(ops.softmax(ops.tanh(ops.matmul(x, w)), axis=1) * ops.exp(x[:, :3]))

    x = np.random.default_rng(2).standard_normal((2, 4))
    expected = opforge.grad(loss)(x)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w)

    def torch_loss(x):
        return ops.reduce_sum(ops.mul(ops.softmax(ops.tanh(ops.matmul(x, wt)), axis=1), ops.exp(x[:, :3])))

    torch_loss(xt).backward()
    np.testing.assert_allclose(xt.grad.numpy(), expected, rtol=1e-12)


def test_double_backward():
    ot.register("softmax")
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: torch.ops.opforge.softmax(t, axis=0), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.tanh(ops.mul(t, 0.5)), (x,))


def test_no_grad_ops_and_ops_without_rules_raise_at_backward(fresh):
    frozen = declare(fresh, "ttorch::frozen(Tensor x) -> Tensor y", traits=["no_grad"])
    frozen.def_infer(opforge.infer.same_as(0))
    frozen.kernel(lambda x: x * 2)
    ruleless = declare(fresh, "ttorch::ruleless(Tensor x) -> Tensor y")
    ruleless.def_infer(opforge.infer.same_as(0))
    ruleless.kernel(lambda x: x * 3)
    x = torch.ones(2, requires_grad=True)
    ot.register(frozen)
    y = torch.ops.ttorch.frozen(x)
    with pytest.raises(GradientError, match="'ttorch::frozen' has trait no_grad"):
        y.sum().backward()
    with pytest.raises(GradientError, match="'ttorch::ruleless' has no gradient rule"):
        ops.ttorch.ruleless(x).sum().backward()
    with torch.no_grad():  # the forward itself is fine
        assert ops.ttorch.frozen(x).tolist() == [2.0, 2.0]


@pytest.fixture
def unruled(fresh):
    """The scale kernel (C++) as an op with no gradient rule, and one with the no_grad trait."""
    ops_ = []
    for name, traits in (("unruled", []), ("frozen", ["no_grad"])):
        op = declare(fresh, f"ttorch::{name}(Tensor x, *, float scale=2.0) -> Tensor y", traits=traits)
        op.def_infer(opforge.infer.same_as(0))
        op.kernel(code=SCALE, function="Scale", dtypes={"x": ["float32", "float64"]})
        ot.register(op)
        ops_.append(op)
    return ops_


def _linear_then(name):
    """(loss of a Linear layer followed by torch.ops.ttorch.<name>, the layer, an input)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)
    packet = getattr(torch.ops.ttorch, name)
    return (lambda x: packet(layer(x), scale=2.0).sum()), layer, torch.randn(2, 3)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("name, problem", [("unruled", "has no gradient rule"),
                                           ("frozen", "has trait no_grad")])
def test_a_gradient_an_op_cannot_give_is_refused_at_backward_not_in_the_forward(unruled, backend, name, problem):
    """torch.compile traces the backward with the forward (AOTAutograd's joint graph): an op with no
    gradient (no rule, or no_grad) compiles and runs forward with inputs that require grad, and the
    GradientError, naming the op, comes when its backward runs, as in eager."""
    loss, layer, x = _linear_then(name)
    with torch.no_grad():
        expected = 2.0 * layer(x).sum()
    call = loss if backend == "eager" else torch.compile(loss, backend=backend)
    y = call(x)
    torch.testing.assert_close(y, expected)
    assert y.requires_grad  # as torch's own ops with no derivative (torch.special.zeta's first input)
    torch.testing.assert_close(call(x + 1), 2.0 * layer(x + 1).sum())  # the compiled graph runs again
    with pytest.raises(GradientError, match=f"'ttorch::{name}' {problem}"):
        y.backward()
    assert layer.weight.grad is None


def test_a_gradient_needed_only_elsewhere_is_no_error(unruled):
    x = torch.randn(4, requires_grad=True)
    y = torch.ops.ttorch.unruled(x, scale=3.0)
    (x * x).sum().backward()  # the gradient does not pass through the op
    torch.testing.assert_close(x.grad, 2 * x.detach())
    torch.testing.assert_close(y, 3.0 * x.detach())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_op_with_a_rule_differentiates_under_compile(scale, backend):
    ot.register(scale)
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)

    def loss(x):
        return (torch.ops.ttorch.scale(layer(x), scale=3.0) ** 2).sum()

    loss(x).backward()
    expected = layer.weight.grad.clone()
    layer.zero_grad()
    torch.compile(loss, backend=backend)(x).backward()
    torch.testing.assert_close(layer.weight.grad, expected)


# -- opforge ops called on torch tensors ------------------------------------------------------

def test_opforge_ops_on_torch_tensors_record_autograd():
    x = torch.tensor([-1.0, 0.5, 2.0], requires_grad=True)
    y = ops.relu(x)
    assert y.grad_fn is not None and "opforge_relu" in type(y.grad_fn).__name__
    (y * 2.0).sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 2.0]


def test_python_scalars_join_and_numpy_arrays_do_not():
    x = torch.arange(3, dtype=torch.float32)
    out = ops.mul(x, 2.0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(opforge.DeviceError, match="one kind"):
        ops.add(x, np.ones(3, np.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA build of torch with a device: the CUDA "
                                                            "dispatch key runs the same code on device pointers")
def test_cuda_tensors_run_the_gpu_kernel_on_the_current_stream():
    x = torch.linspace(-1, 1, 1000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ot.register("relu")
    with torch.cuda.stream(side):
        y = torch.ops.opforge.relu(x)
    torch.cuda.current_stream().wait_stream(side)
    assert y.device == x.device
    torch.testing.assert_close(y, torch.relu(x))


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not found: the CUDA kernel is not "
                                                                       "compiled here")
def test_the_training_examples_cuda_kernel_compiles(tmp_path):
    """The training examples' GPU kernel (examples/softplus.cu, float32 and float64), compiled for sm_80 without
    a GPU (it runs where there is one)."""
    import runpy
    from pathlib import Path

    from opforge.runtime.build import build

    runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "torch_train.py"))
    kernels = [k for k in opforge.lookup("torchmlp::softplus").kernels if k.device == "gpu"]
    assert len(kernels) == 2 and all(k.path.name == "softplus.cu" for k in kernels)
    for kernel in kernels:
        assert build(kernel.path, extra_cflags=kernel.cflags, cuda_arch="80").path.is_file()


# -- MindSpore-style Custom ops ----------------------------------------------------------

OPS_CC = __import__("pathlib").Path(__file__).resolve().parent / "kernels" / "ops.cc"


def test_custom_ops_pass_opcheck_and_their_bprop_differentiates():
    from opforge import Custom, CustomRegOp

    a, b = 2.0, -0.5
    info = (CustomRegOp("ttorch_lin").input(0, "x").input(1, "w").output(0, "y")
            .attr("a", "required", "float", value=a).attr("b", "required", "float", value=b).target("CPU")
            .get_op_info())

    def bprop(x, w, out, dout):
        return dout * np.float32(a), dout * np.float32(b)

    lin = Custom(f"{OPS_CC}:Lin", lambda x, w: x, "float32", "aot", bprop=bprop, reg_info=info)
    packet = ot.register(lin)
    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    y = packet(x, w)
    torch.testing.assert_close(y, a * x + b * w)
    (y * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3), 3 * a))
    torch.testing.assert_close(w.grad, torch.full((2, 3), 3 * b))
    result = torch.library.opcheck(packet.default, (torch.randn(2, 3, requires_grad=True),
                                                    torch.randn(2, 3, requires_grad=True)))
    assert set(result.values()) == {"SUCCESS"}, result


def test_an_unregistered_op_cannot_take_a_registered_ops_torch_name():
    from opforge.operator import Op

    impostor = Op("add", ["a", "b"], ["y"])
    with pytest.raises(SchemaError, match="torch.ops.opforge.add, which is op 'add' already"):
        ot.register(impostor)
    x = torch.ones(2)
    torch.testing.assert_close(torch.ops.opforge.add(x, x), x + x)  # the built-in is untouched


def test_a_name_torch_cannot_take_is_a_schema_error_and_the_op_still_declares(fresh):
    op = declare(fresh, "ttorch::elif(Tensor x) -> Tensor y")  # a Python keyword: fine for opforge, not for torch
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x: x + 1)
    assert op(np.zeros(2)).tolist() == [1.0, 1.0]
    with pytest.raises(SchemaError, match=r"'ttorch::elif': PyTorch cannot define it as ttorch::elif\("):
        ot.register(op)


def test_a_kernel_runs_for_an_empty_input_with_outputs_to_write_and_not_when_all_are_empty(fresh):
    calls = []

    def joined(a, b):
        calls.append((a.shape, b.shape))
        return np.concatenate([a, b])

    op = declare(fresh, "tempty::joined(Tensor a, Tensor b) -> Tensor y")
    op.def_infer(lambda a, b: opforge.TensorSpec([a.shape[0] + b.shape[0]], a.dtype))
    op.kernel(joined)
    ot.register(op)
    two = torch.tensor([1.0, 2.0])
    torch.testing.assert_close(torch.ops.tempty.joined(torch.ones(0), two), two)
    assert calls == [((0,), (2,))]
    assert torch.ops.tempty.joined(torch.ones(0), torch.ones(0)).shape == (0,)  # nothing to write: not called
    assert calls == [((0,), (2,))]
