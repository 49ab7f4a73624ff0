"""Custom-domain ONNX nodes bound to opforge ops, and the PPLNN custom-op port (examples/onnx_custom_op.py)."""
import os
import pathlib
import runpy
import subprocess
import sys

import numpy as np
import pytest
from helpers import declare
from onnx import TensorProto, helper

import opforge
import opforge.onnx as ox
from opforge.graph.passes import select_layouts
from opforge.runtime.dispatch import select_kernel

DOMAIN = "com.example"
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "onnx_custom_op.py"


def model(nodes, inputs, outputs, version=1, initializers=()):
    graph = helper.make_graph(nodes, "custom", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, version)])


def tensor(name, shape=(2, 3), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def one_node(op_type, inputs=("x",), outputs=("y",), version=1, **attrs):
    node = helper.make_node(op_type, list(inputs), list(outputs), domain=DOMAIN, name="n0", **attrs)
    return model([node], [tensor(n) for n in inputs if n], [tensor(n, None) for n in outputs if n], version)


@pytest.fixture
def scale(fresh):
    """com.example::Scale(x, *, alpha): a NumPy-only op (no compiler needed)."""
    op = declare(fresh, f"{DOMAIN}::Scale(Tensor x, Tensor? bias=None, *, float alpha=0.1, bool negate=False, "
                        "int[] unused=[]) -> Tensor y", traits=["no_side_effect"])
    op.def_infer(opforge.infer.same_as(0))

    @op.reference(fallback=True)
    def _(x, bias=None, alpha=0.1, negate=False, unused=()):
        y = x * np.float32(alpha) + (0 if bias is None else bias)
        return (-y if negate else y).astype(x.dtype)
    return op


X = np.array([[1, -2, 3], [4, 5, -6]], np.float32)


def test_dotted_namespace_schema():
    parsed = opforge.schema.parse_schema("com.example.v2::MyOp(Tensor x, *, float alpha=.5) -> Tensor y")
    assert parsed.namespace == "com.example.v2" and parsed.qualified_name == "com.example.v2::MyOp"
    assert parsed.attrs[0].default == 0.5
    assert str(parsed) == "com.example.v2::MyOp(Tensor x, *, float alpha=0.5) -> Tensor y"
    for bad, where in (("com.example(Tensor x) -> Tensor y", "expected '::'"),
                       ("com..example::f(Tensor x) -> Tensor y", "expected a name after '.'"),
                       ("ns::f.g(Tensor x) -> Tensor y", "expected '\\('")):
        with pytest.raises(opforge.SchemaError, match=where):
            opforge.schema.parse_schema(bad)


def test_a_node_binds_to_the_op_named_domain_type(scale):
    graph = ox.load(one_node("Scale", alpha=2.0))
    assert [n.op for n in graph.nodes] == [scale]
    np.testing.assert_allclose(graph(X), X * 2)
    # Defaults apply when the node omits an attribute; an INT fills a float; an INT 0/1 fills a bool.
    np.testing.assert_allclose(ox.load(one_node("Scale"))(X), X * np.float32(0.1))
    np.testing.assert_allclose(ox.load(one_node("Scale", alpha=3, negate=1))(X), -X * 3)
    np.testing.assert_allclose(ox.load(one_node("Scale", unused=[1, 2]))(X), X * np.float32(0.1))


def test_optional_inputs(scale):
    m = model([helper.make_node("Scale", ["x", "b"], ["y"], domain=DOMAIN, alpha=1.0)], [tensor("x"), tensor("b")],
              [tensor("y", None)])
    np.testing.assert_allclose(ox.load(m)(X, X), 2 * X)
    m = model([helper.make_node("Scale", ["x", ""], ["y"], domain=DOMAIN, alpha=1.0)], [tensor("x")],
              [tensor("y", None)])
    np.testing.assert_allclose(ox.load(m)(X), X)


def test_attribute_type_errors_name_node_attribute_and_types(scale):
    with pytest.raises(ox.ModelError, match=r"^model '\w+': node 'n0' \(Scale\): attribute 'alpha' is ONNX STRING; op "
                                            r"'com.example::Scale' declares 'alpha' as float"):
        ox.load(one_node("Scale", alpha="big"))
    with pytest.raises(ox.ModelError, match=r"attribute 'gamma' \(ONNX FLOAT\) is not an attribute of op "
                                            r"'com.example::Scale' \(its attributes: alpha \(float\)"):
        ox.load(one_node("Scale", gamma=1.0))
    with pytest.raises(ox.ModelError, match="attribute 'negate' is ONNX INT.*bool.*must be 0 or 1, got 2"):
        ox.load(one_node("Scale", negate=2))
    with pytest.raises(ox.ModelError, match="attribute 'unused' is ONNX FLOATS; .* declares 'unused' as int\\[\\]"):
        ox.load(one_node("Scale", unused=[1.5]))


def test_input_count_errors(scale, fresh):
    m = model([helper.make_node("Scale", ["x", "x", "x"], ["y"], domain=DOMAIN, name="n0")], [tensor("x")],
              [tensor("y", None)])
    with pytest.raises(ox.ModelError, match="the node has 3 inputs; op 'com.example::Scale' takes at most 2"):
        ox.load(m)
    m = model([helper.make_node("Scale", [""], ["y"], domain=DOMAIN, name="n0")], [], [tensor("y", None)])
    with pytest.raises(ox.ModelError, match="needs input 0 \\('x'\\), which the node omits"):
        ox.load(m)
    needs = declare(fresh, f"{DOMAIN}::Needs(Tensor x, *, int k) -> Tensor y")
    needs.def_infer(opforge.infer.same_as(0))
    with pytest.raises(ox.ModelError, match="requires attribute 'k' \\(int\\); the node has no attribute 'k'"):
        ox.load(one_node("Needs"))


def test_variadic_inputs(fresh):
    total = declare(fresh, f"{DOMAIN}::Total(Tensor[] xs) -> Tensor y")
    total.def_infer(opforge.infer.same_as(0))
    total.reference(fallback=True)(lambda *xs: np.sum(xs, axis=0).astype(xs[0].dtype))
    m = model([helper.make_node("Total", ["a", "b", "c"], ["y"], domain=DOMAIN)], [tensor(n) for n in "abc"],
              [tensor("y", None)])
    np.testing.assert_allclose(ox.load(m)(X, X, 2 * X), 4 * X)
    m = model([helper.make_node("Total", ["a", "", "c"], ["y"], domain=DOMAIN)], [tensor("a"), tensor("c")],
              [tensor("y", None)])
    with pytest.raises(ox.ModelError, match="takes a list of tensors \\(xs\\); the node omits input 1"):
        ox.load(m)


def test_several_outputs_map_positionally(fresh):
    split = declare(fresh, f"{DOMAIN}::Bounds(Tensor x) -> (Tensor lo, Tensor hi)")

    @split.def_infer
    def _(x):
        return x, x

    split.reference(fallback=True)(lambda x: (np.minimum(x, 0), np.maximum(x, 0)))
    lo, hi = ox.load(one_node("Bounds", outputs=("lo", "hi")))(X)
    np.testing.assert_array_equal(lo, np.minimum(X, 0))
    np.testing.assert_array_equal(hi, np.maximum(X, 0))
    np.testing.assert_array_equal(ox.load(one_node("Bounds", outputs=("", "hi")))(X), np.maximum(X, 0))
    with pytest.raises(ox.ModelError, match="declares 3 outputs; op 'com.example::Bounds' has 2 \\(lo, hi\\)"):
        ox.load(one_node("Bounds", outputs=("a", "b", "c")))


def test_register_binds_another_op_with_renamed_attributes(fresh, scale):
    twice = declare(fresh, "mylib::twice_scaled(Tensor x, *, float factor=1.0) -> Tensor y")
    twice.def_infer(opforge.infer.same_as(0))
    twice.reference(fallback=True)(lambda x, factor=1.0: (2 * factor * x).astype(x.dtype))
    try:
        ox.register(DOMAIN, "Twice", twice, attributes={"k": "factor"})
        ox.register(DOMAIN, "Twice", "com.example::Scale", since_version=3)  # from opset 3 on: another op
        np.testing.assert_allclose(ox.load(one_node("Twice", k=3.0, version=2))(X), 6 * X)
        np.testing.assert_allclose(ox.load(one_node("Twice", alpha=3.0, version=3))(X), 3 * X)
        with pytest.raises(ox.ModelError, match="attribute 'factor' \\(ONNX FLOAT\\) is not an attribute"):
            ox.load(one_node("Twice", factor=3.0, version=1))  # only the ONNX name is known to the node
        # A registration wins over the op named domain::op_type.
        ox.register(DOMAIN, "Scale", twice)
        np.testing.assert_allclose(ox.load(one_node("Scale", factor=1.0))(X), 2 * X)
    finally:
        from opforge.onnx import registry

        for op_type in ("Twice", "Scale"):
            registry._CONVERTERS.pop((DOMAIN, op_type), None)


def test_register_argument_errors(scale):
    with pytest.raises(opforge.SchemaError, match="no op 'nope::nothing' is registered"):
        ox.register(DOMAIN, "X", "nope::nothing")
    with pytest.raises(opforge.SchemaError, match="op is an opforge Op or the name of one"):
        ox.register(DOMAIN, "X", 42)
    with pytest.raises(opforge.SchemaError, match="since_version is an int >= 1"):
        ox.register(DOMAIN, "X", scale, since_version=0)
    with pytest.raises(opforge.SchemaError, match="maps to \\['gamma'\\], which op 'com.example::Scale' does not"):
        ox.register(DOMAIN, "X", scale, attributes={"g": "gamma"})
    assert ox.find_converter(DOMAIN, "X", 1) is None


def test_a_custom_node_without_an_op_is_unsupported():
    with pytest.raises(ox.UnsupportedOpError) as info:
        ox.load(one_node("NoSuchOp", version=4))
    assert info.value.unsupported == [(DOMAIN, "NoSuchOp", 4)]


# -- the PPLNN custom-op port ---------------------------------------------------------------
@pytest.fixture(scope="module")
def ppl():
    """The example's globals: the ppl::LeakyReLU op, build_model and expected."""
    found = runpy.run_path(str(EXAMPLE))
    yield found
    opforge.registry.unregister("ppl::LeakyReLU")


@pytest.fixture
def isa_cap():
    yield opforge.set_isa_cap
    opforge.set_isa_cap(None)


def leaky_node(graph, op):
    return next(n for n in graph.nodes if not n.is_constant and n.op is op)


def test_ppl_leaky_relu_runs_blocked_between_reorders(ppl):
    op = ppl["leaky"]
    graph = ox.load(ppl["build_model"]())
    assert select_layouts(graph, prefer="nchw16c") == 2  # into nchw16c once, back once
    names = [n.op.name for n in graph.nodes if not n.is_constant]
    assert names == ["reorder", "relu", "ppl::LeakyReLU", "add", "reorder"]
    node = leaky_node(graph, op)
    assert node.kernel.layout == "nchw16c" and node.outputs[0].spec.layout == "nchw16c"
    assert node.kernel.name == "LeakyReluFma[avx2]<float32>@nchw16c"  # the best ISA this CPU has (no AVX-512)
    rng = np.random.default_rng(1)
    for batch in (1, 3):  # N is a dim_param
        x = rng.standard_normal((batch, 20, 4, 4)).astype(np.float32)
        np.testing.assert_allclose(graph(x), ppl["expected"](x), rtol=1e-6, atol=1e-6)


def test_ppl_leaky_relu_isa_cap_selects_the_sse_kernel(ppl, isa_cap):
    op = ppl["leaky"]
    isa_cap("sse41")
    graph = ox.load(ppl["build_model"]())
    select_layouts(graph, prefer="nchw16c")
    assert leaky_node(graph, op).kernel.name == "LeakyReluSse[sse41]<float32>@nchw16c"
    assert select_kernel(op, [opforge.TensorSpec([2, 20, 4, 4])]).name == "LeakyReluSse[sse41]<float32>"
    x = np.random.default_rng(2).standard_normal((2, 20, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(graph(x), ppl["expected"](x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ox.load(ppl["build_model"]())(x), ppl["expected"](x), rtol=1e-6, atol=1e-6)


def test_ppl_leaky_relu_without_layout_selection_runs_ndarray(ppl):
    graph = ox.load(ppl["build_model"](channels=3, alpha=0.5))
    x = np.linspace(-3, 3, 2 * 3 * 16, dtype=np.float32).reshape(2, 3, 4, 4)
    np.testing.assert_allclose(graph(x), ppl["expected"](x, alpha=0.5), rtol=1e-6, atol=1e-6)
    assert all(v.spec.layout == "ndarray" for n in graph.nodes for v in n.outputs)


def test_the_example_runs_as_a_script():
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300,
                         env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert "2 reorder node(s); ppl::LeakyReLU runs LeakyReluFma[avx2]<float32>@nchw16c" in out.stdout
    assert "results match NumPy" in out.stdout
