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
