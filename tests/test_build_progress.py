"""Progress lines for long compiles (runtime.build.report_build)."""
import logging
import uuid

import numpy as np
import pytest

from helpers import declare
from opforge.runtime import build

SOURCE = r"""
#include "custom_aot_extra.h"
// %s: a fresh source each test, so the cache cannot answer
extern "C" int Twice(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                     void *stream, void *extra) {
  const OPFORGE_T *x = static_cast<const OPFORGE_T *>(params[0]);
  OPFORGE_T *y = static_cast<OPFORGE_T *>(params[1]);
  y[0] = 2 * x[0];
  return 0;
}
"""


@pytest.fixture
def every_build_reported(monkeypatch):
    monkeypatch.setattr(build, "BUILD_REPORT_SECONDS", 0.0)  # compile times vary: report them all
    monkeypatch.delenv("OPFORGE_QUIET", raising=False)


def twice(fresh, name="twice"):
    op = declare(fresh, f"progress::{name}(Tensor x) -> Tensor y")
    op.def_infer(lambda x: x)
    op.kernel(function="Twice", dtypes={"x": ["float32", "float64"]}, code=SOURCE % uuid.uuid4())
    return op


def test_a_cold_build_prints_one_line_per_variant_and_a_warm_one_none(fresh, every_build_reported, capfd):
    op = twice(fresh)
    op(np.ones(1, np.float32)), op(np.ones(1))
    lines = capfd.readouterr().err.splitlines()
    assert [line.split(" in ")[0] for line in lines] == [
        "opforge: compiled op 'progress::twice', kernel Twice<float32>",
        "opforge: compiled op 'progress::twice', kernel Twice<float64>"]
    assert all(line.endswith(" s") for line in lines)

    for kernel in op.kernels:  # loaded again: from the cache, silently
        kernel.library = None
        kernel.load()
    assert capfd.readouterr().err == ""


def test_quiet_and_logging_levels_silence_it(fresh, every_build_reported, capfd, monkeypatch):
    monkeypatch.setenv("OPFORGE_QUIET", "1")
    twice(fresh)(np.ones(1, np.float32))
    assert capfd.readouterr().err == ""
    monkeypatch.delenv("OPFORGE_QUIET")
    logging.getLogger("opforge").setLevel(logging.WARNING)
    try:
        twice(fresh, "again")(np.ones(1))
    finally:
        logging.getLogger("opforge").setLevel(logging.INFO)
    assert capfd.readouterr().err == ""


def test_the_record_reaches_the_application_s_handlers_even_when_quiet(fresh, every_build_reported, capfd,
                                                                        caplog, monkeypatch):
    monkeypatch.setenv("OPFORGE_QUIET", "1")
    with caplog.at_level(logging.INFO, logger="opforge"):  # caplog's handler on the root logger
        twice(fresh)(np.ones(1, np.float32))
    assert capfd.readouterr().err == ""
    assert any("compiled op 'progress::twice', kernel Twice<float32>" in r.getMessage() for r in caplog.records)


def test_long_loops_report_progress_and_short_ones_stay_silent(capfd, monkeypatch):
    from opforge.runtime.progress import Progress

    monkeypatch.delenv("OPFORGE_QUIET", raising=False)
    quick = Progress("quick", 3)  # ends well within a second: silent
    for k in range(3):
        quick.step(k)
    quick.close()
    assert capfd.readouterr().err == ""
    slow = Progress("converting model 'm'", 3, after=0.0, every=0.0)
    for k in range(3):
        slow.step(k)
    slow.close()
    lines = capfd.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [f"opforge: converting model 'm': {k}/3" for k in range(3)]
    assert lines[3].startswith("opforge: converting model 'm': 3/3 done in ")


def test_an_onnx_conversion_reports_its_nodes(capfd, monkeypatch):
    import functools
    import sys

    from onnx import TensorProto, helper

    import opforge.onnx
    from opforge.runtime.progress import Progress

    load_module = sys.modules["opforge.onnx.load"]  # (opforge.onnx.load is the function)

    monkeypatch.delenv("OPFORGE_QUIET", raising=False)
    monkeypatch.setattr(load_module, "Progress", functools.partial(Progress, after=0.0, every=0.0))
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    loaded = opforge.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert loaded(np.array([-1.0, 2.0], np.float32)).tolist() == [0.0, -2.0]
    err = capfd.readouterr().err
    assert "opforge: converting model 'two': 1/2" in err and "opforge: converting model 'two': 2/2 done" in err
