"""What an op does with inputs it was not written for: a reference that is
no kernel unless the op says so, None for a required tensor, inference
given in halves."""
import numpy as np
import pytest

import opforge
from helpers import declare

GELU_F32 = r"""
#include <cmath>
#include "custom_aot_extra.h"
extern "C" int Gelu(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                    void *stream, void *extra) {
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  int64_t n = 1;
  for (int d = 0; d < ndims[0]; d++) n *= shapes[0][d];
  for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] / std::sqrt(2.0f)));
  return 0;
}
"""


def gelu_numpy(x):
    from math import erf

    return (0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))).astype(x.dtype)


def declare_gelu(fresh, **reference_options):
    gelu = declare(fresh, "sem::gelu(Tensor x) -> Tensor y")
    gelu.def_infer(opforge.infer.same_as(0))
    gelu.kernel(code=GELU_F32, function="Gelu", dtypes={"x": ["float32"]})
    if reference_options:
        gelu.reference(**reference_options)(gelu_numpy)
    else:
        gelu.reference(gelu_numpy)
    return gelu


def test_reference_is_not_a_kernel_by_default(fresh):
    gelu = declare_gelu(fresh)
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    np.testing.assert_allclose(gelu(x), gelu_numpy(x), rtol=1e-5, atol=1e-6)
    # int64: no kernel takes it -- a DTypeError, as without a reference -- and the message says why the
    # reference, only the semantics, does not run
    with pytest.raises(opforge.DTypeError, match="reference") as caught:
        gelu(np.arange(3))
    assert "int64" in str(caught.value) and "sem::gelu" in str(caught.value)
    assert opforge.testing.check_op(gelu, x)  # the reference still checks the kernel


def test_reference_runs_where_the_op_says_so(fresh):
    gelu = declare_gelu(fresh, fallback=True)
    np.testing.assert_array_equal(gelu(np.arange(3)), gelu_numpy(np.arange(3)))

    fresh_gelu = declare(fresh, "sem::gelu_f64(Tensor x) -> Tensor y")
    fresh_gelu.def_infer(opforge.infer.same_as(0))
    fresh_gelu.reference(dtypes={"x": ["float64"]})(gelu_numpy)
    x = np.linspace(-1, 1, 4)
    np.testing.assert_array_equal(fresh_gelu(x), gelu_numpy(x))
    with pytest.raises(opforge.DTypeError, match="float32"):
        fresh_gelu(x.astype(np.float32))


@pytest.mark.parametrize("call", [
    lambda: opforge.lookup("relu")(None),
    lambda: opforge.ops.relu(None),
    lambda: opforge.lookup("add")(np.ones(2, np.float32), None),
    lambda: opforge.ops.add(None, np.ones(2, np.float32)),
    lambda: opforge.lookup("leaky_relu")(None, alpha=0.2),
    lambda: opforge.trace(lambda x: opforge.ops.add(x, None), opforge.TensorSpec([2])),
], ids=["op", "functional", "second", "functional-first", "keywords", "traced"])
def test_none_for_a_required_tensor_is_an_arity_error(call):
    with pytest.raises(opforge.ArityError, match="required tensor, got None"):
        call()


def test_none_for_an_optional_tensor_is_fine(fresh):
    op = declare(fresh, "sem::maybe_bias(Tensor x, Tensor? bias=None) -> Tensor y")
    op.def_infer(opforge.infer.same_as(0))

    @op.kernel
    def _(x, bias):
        return x if bias is None else x + bias

    np.testing.assert_array_equal(op(np.ones(2, np.float32), None), np.ones(2, np.float32))


def test_infer_dtype_alone_on_two_outputs(fresh):
    op = declare(fresh, "sem::split_types(Tensor x) -> (Tensor values, Tensor indices)")

    @op.infer_dtype
    def _(x):
        return x, "int64"

    values, indices = op.infer(opforge.TensorSpec([2, None], "float32"))
    assert values == opforge.TensorSpec([2, None], "float32")
    assert indices == opforge.TensorSpec([2, None], "int64")


def test_infer_shape_alone_on_two_outputs(fresh):
    op = declare(fresh, "sem::halves(Tensor x) -> (Tensor a, Tensor b)")

    @op.infer_shape
    def _(x):
        return [x[0] // 2] + list(x[1:]), [x[0] - x[0] // 2] + list(x[1:])

    a, b = op.infer(opforge.TensorSpec([5, 3], "float64"))
    assert (a.shape, b.shape, a.dtype, b.dtype) == ((2, 3), (3, 3), "float64", "float64")


def test_inference_halves_must_agree_with_the_outputs(fresh):
    op = declare(fresh, "sem::three(Tensor x) -> (Tensor a, Tensor b, Tensor c)")

    @op.infer_dtype
    def _(x):
        return x, x  # one short

    with pytest.raises(opforge.InferenceError, match="3 output"):
        op.infer(opforge.TensorSpec([2]))
