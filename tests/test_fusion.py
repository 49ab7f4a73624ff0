"""Fusion of elementwise chains in planned graphs (opforge.graph.fusion)."""
import numpy as np
import pytest

import opforge
from opforge import TensorSpec
from opforge.graph.fusion import fuse_steps


def unary(name, expression, formula, attrs=""):
    op = opforge.op(f"fusetest::{name}(Tensor x{attrs}) -> Tensor y", traits=["no_side_effect", "elementwise"],
                    replace=True)
    op.def_infer(opforge.infer.same_as(0))
    op.kernel(lambda x, **a: formula(x, **a).astype(x.dtype))  # a Python kernel: cannot fuse
    op.kernel(function="K", dtypes={"x": ["float32", "float64"]}, code=f"""
#include <cmath>
#include "custom_aot_extra.h"
extern "C" int K(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *s, void *e) {{
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  AotExtra *attrs = static_cast<AotExtra *>(e);
  (void)attrs;
  for (int64_t i = 0; i < n; i++) {{ OPFORGE_T v = x[i]; y[i] = {expression.format(x="v", scale="OPFORGE_T(3.0)")}; }}
  return 0;
}}""")
    op.fuse_as(expression)
    return op


@pytest.fixture(scope="module")
def ops():
    square = unary("square", "{x} * {x}", lambda x: x * x)
    # the kernel bakes in the default scale; the graphs below pass scale=3.0 so both agree
    scaled = unary("scaled", "{x} * {scale}", lambda x, scale=3.0: x * scale, attrs=", *, float scale=3.0")
    yield {"square": square, "scaled": scaled}
    for name in ("square", "scaled"):
        opforge.registry.unregister(f"fusetest::{name}")


def plan_of(graph):
    (plan,) = graph._executor.plans.values()
    return plan


def test_a_chain_runs_as_one_generated_kernel(ops, monkeypatch):
    def f(x, b):
        y = opforge.ops.exp(ops["square"](x))
        return opforge.ops.add(ops["scaled"](y, scale=3.0), b)

    x = np.linspace(-1, 1, 100_003).astype(np.float32)
    b = np.float32(0.5).reshape(())  # one element: read once, broadcast
    graph = opforge.trace(f, x, b)
    got = graph(x, b)
    plan = plan_of(graph)
    assert plan.program is not None
    assert plan.memory_report()["nodes"] == 1
    assert plan.memory_report()["fused"] == ["fused::square_exp_scaled_add"]
    np.testing.assert_allclose(got, np.exp(x * x) * 3 + 0.5, rtol=1e-6)

    monkeypatch.setenv("OPFORGE_FUSE", "0")
    unfused = opforge.trace(f, x, b)
    np.testing.assert_allclose(unfused(x, b), got, rtol=1e-6)
    assert plan_of(unfused).memory_report()["nodes"] == 4


def test_values_read_after_the_run_are_its_outputs_too(ops):
    def f(x):
        s = ops["square"](x)
        t = opforge.ops.tanh(s)
        return opforge.ops.reduce_sum(s, axes=[0]), opforge.ops.mul(t, t), s

    x = np.random.default_rng(0).standard_normal((64, 33))
    graph = opforge.trace(f, x)
    total, tt, s = graph(x)
    report = plan_of(graph).memory_report()
    assert report["fused"] == ["fused::square_tanh"] and report["nodes"] == 3  # fused, reduce_sum, mul
    np.testing.assert_allclose(s, x * x, rtol=1e-15)
    np.testing.assert_allclose(total, (x * x).sum(0), rtol=1e-12)
    np.testing.assert_allclose(tt, np.tanh(x * x) ** 2, rtol=1e-12)


def test_what_cannot_fuse_stays_apart(ops):
    def broadcasting(x, row):
        return ops["square"](opforge.ops.add(x, row))  # add's output is x's shape, row is not one element

    x, row = np.ones((4, 5), np.float32), np.arange(5, dtype=np.float32)
    graph = opforge.trace(broadcasting, x, row)
    np.testing.assert_allclose(graph(x, row), (x + row) ** 2)
    assert plan_of(graph).memory_report()["fused"] == []

    ints = opforge.trace(lambda a: opforge.ops.neg(opforge.ops.add(a, a)), np.arange(6))
    np.testing.assert_array_equal(ints(np.arange(6)), -2 * np.arange(6))  # integer chains keep their kernels
    assert plan_of(ints).memory_report()["fused"] == []


def test_checked_mode_runs_the_fused_kernel_too(ops):
    x = np.linspace(0, 1, 1000)
    graph = opforge.trace(lambda v: opforge.ops.exp(ops["square"](v)), x)
    opforge.set_checks(True)
    try:
        np.testing.assert_allclose(graph(x), np.exp(x * x), rtol=1e-14)
    finally:
        opforge.set_checks(False)
    assert plan_of(graph).fused == ["fused::square_exp"]


def test_fuse_as_checks_its_expression():
    op = opforge.op("fusetest::bad(Tensor x) -> Tensor y", traits=["elementwise"], replace=True)
    try:
        with pytest.raises(opforge.SchemaError, match=r"\['z'\]"):
            op.fuse_as("{x} + {z}")
        with pytest.raises(opforge.SchemaError, match="fuse_as expression"):
            op.fuse_as("{x")
        plain = opforge.op("fusetest::plain(Tensor x) -> Tensor y", replace=True)
        with pytest.raises(opforge.SchemaError, match="elementwise trait"):
            plain.fuse_as("{x}")
    finally:
        opforge.registry.unregister("fusetest::bad")
        opforge.registry.unregister("fusetest::plain")


def test_fusion_is_a_no_op_when_turned_off(monkeypatch):
    monkeypatch.setenv("OPFORGE_FUSE", "0")
    assert fuse_steps(None, ["anything"]) == (["anything"], [])


def test_a_new_isa_cap_compiles_its_own_variant(ops):
    x = np.linspace(-1, 1, 4096).astype(np.float32)
    graph = opforge.trace(lambda v: opforge.ops.exp(ops["square"](v)), TensorSpec([-1], "float32"))
    want = graph(x)
    opforge.set_isa_cap("generic")
    try:
        capped = opforge.trace(lambda v: opforge.ops.exp(ops["square"](v)), TensorSpec([-1], "float32"))
        np.testing.assert_allclose(capped(x), want, rtol=1e-6)
        (node, kernel, *_), = plan_of(capped).steps
        assert kernel.isa is None
    finally:
        opforge.set_isa_cap(None)


FUSABLE_BUILTINS = sorted(op.name for op in opforge.registry.registered_ops()
                          if op.expression is not None and "::" not in op.name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", FUSABLE_BUILTINS)
def test_every_fusable_built_in_agrees_with_its_own_kernel(name, dtype, monkeypatch):
    op = opforge.lookup(name)
    rng = np.random.default_rng(1)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, np.inf, -np.inf, np.nan, 1e-30, 80.0, -80.0])
    values = [np.concatenate([special, rng.standard_normal(1000) * 3]).astype(dtype)
              for _ in op.inputs]
    values[1:] = [np.abs(v) + 0.5 for v in values[1:]]  # divisors and exponents away from 0

    def chain(*xs):  # the op between two negations: one fused run of three nodes
        return opforge.ops.neg(op(*[opforge.ops.neg(xs[0]), *xs[1:]]))

    fused = opforge.trace(chain, *values)
    got = fused(*values)
    assert plan_of(fused).memory_report()["fused"], name
    monkeypatch.setenv("OPFORGE_FUSE", "0")
    want = opforge.trace(chain, *values)(*values)
    tolerance = dict(rtol=0, atol=0) if name not in ("pow", "log", "sqrt") else dict(rtol=1e-6, atol=0)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got, want, equal_nan=True, **tolerance)
