"""onnx's nine "light" models (onnx/backend/test/data/light) through opforge.

Their weights are ConstantOfShape nodes, so they fold while the model loads.
Each model is fed what onnx's runner feeds it (``arange(n) / n`` in the input's
shape, float32) and must match the stored ``*_output_0.pb`` and onnxruntime,
at rtol 1e-3 / atol 1e-4.  A constant fill makes most of those outputs flat
(softmax of equal logits), so each model also runs with seeded random
weights in place of the fills, against onnxruntime on the same model at
atol 1e-6 (the outputs are probabilities of about 1e-3).
"""
import gc
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import opforge.onnx
from helpers import random_weights

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


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_its_expected_output_and_onnxruntime(name):
    model = _model(name)
    input_name, x = _runner_input(model)
    expected = _expected(name)
    (theirs,) = _onnxruntime(model, {input_name: x})
    ours = _opforge(model, x)
    assert isinstance(ours, np.ndarray) and ours.dtype == expected.dtype and ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_with_random_weights_matches_onnxruntime(name):
    model = random_weights(_model(name))
    input_name, x = _runner_input(model)
    (theirs,) = _onnxruntime(model, {input_name: x})
    ours = _opforge(model, x)
    del model
    gc.collect()
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert np.ptp(theirs) > 1e-4  # the random weights give outputs that differ, unlike the fills
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=1e-6)
