"""onnx's nine "light" models (onnx/backend/test/data/light) through opforge.

Their weights are ConstantOfShape nodes, so they fold while the model loads.
Each model is fed what onnx's runner feeds it (``arange(n) / n`` in the input's
shape, float32) and must match the stored ``*_output_0.pb`` and onnxruntime,
at rtol 1e-3 / atol 1e-4.  A constant fill makes most of those outputs flat
(softmax of equal logits) and most logits huge (squeezenet's 9.5e9, vgg19's
3.7e31): there a rounding difference of 1e-6 in the last conv or gemm moves a
logit by thousands, and the softmax turns that into different, equally wrong
probabilities.  So the models that end in a Softmax also output its input, the
logits, which are compared at the same tolerance (relative to their size); the
probabilities are compared where rounding cannot decide them, elsewhere checked
to be the softmax of our own logits (``helpers.assert_softmax_close``).  Each
model also runs with seeded random weights in place of the fills, against
onnxruntime on the same model at atol 1e-6 (the outputs are probabilities of
about 1e-3, their logits of about 1).
"""
import gc
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import opforge.onnx
from helpers import assert_softmax_close, logits_exposed, random_weights

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512"]
RTOL, ATOL = 1e-3, 1e-4


def _model(name):
    return onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))


def _runner_input(model):
    """The input onnx's runner generates for a light model."""
    initializers = {t.name for t in model.graph.initializer}
    (info,) = [i for i in model.graph.input if i.name not in initializers]
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return info.name, (np.arange(n).reshape(shape) / n).astype(np.float32)


def _expected(name):
    tensor = onnx.TensorProto()
    with open(os.path.join(LIGHT, f"light_{name}_output_0.pb"), "rb") as f:
        tensor.ParseFromString(f.read())
    return numpy_helper.to_array(tensor)


def _onnxruntime(model, feeds):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    del session
    gc.collect()
    return outputs


def _opforge(model, x):
    graph = opforge.onnx.load(model)
    y = graph(x)
    del graph
    gc.collect()
    return y


def _outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_its_expected_output_and_onnxruntime(name):
    model = logits_exposed(_model(name))
    input_name, x = _runner_input(model)
    expected = _expected(name)
    theirs = _onnxruntime(model, {input_name: x})
    ours = _outputs(_opforge(model, x))
    assert len(ours) == len(theirs)
    assert isinstance(ours[0], np.ndarray) and ours[0].dtype == expected.dtype and ours[0].shape == expected.shape
    if len(ours) == 1:  # no Softmax at the end (densenet121): the output is the logits
        np.testing.assert_allclose(ours[0], expected, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=RTOL, atol=ATOL)
        return
    assert_softmax_close(ours[0], theirs[0], ours[1], theirs[1], rtol=RTOL, atol=ATOL)
    # the stored probabilities, where they mean something (their run's logits are onnxruntime's, to rounding)
    assert_softmax_close(ours[0], expected, ours[1], theirs[1], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_with_random_weights_matches_onnxruntime(name):
    model = logits_exposed(random_weights(_model(name)))
    input_name, x = _runner_input(model)
    theirs = _onnxruntime(model, {input_name: x})
    ours = _outputs(_opforge(model, x))
    del model
    gc.collect()
    assert len(ours) == len(theirs)
    assert ours[0].shape == theirs[0].shape and ours[0].dtype == theirs[0].dtype
    assert np.ptp(theirs[0]) > 1e-4  # the random weights give outputs that differ, unlike the fills
    if len(ours) == 1:
        np.testing.assert_allclose(ours[0], theirs[0], rtol=RTOL, atol=1e-6)
    else:  # logits of about 1: the probabilities themselves are compared
        assert assert_softmax_close(ours[0], theirs[0], ours[1], theirs[1], rtol=RTOL, atol=1e-6)
