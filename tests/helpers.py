"""Helpers shared by several test modules."""
import numpy as np

import opforge


def declare(fresh, schema, **kwargs):
    """``opforge.op(schema)`` for a test; the ``fresh`` fixture unregisters it afterwards."""
    op = opforge.op(schema, **kwargs)
    fresh.append(op.name)
    return op


def encode_probe(values):
    """What attr_probe.cc writes for ``values`` (see the layout in its header comment)."""
    f32 = lambda v: float(np.float32(v))  # noqa: E731 - the kernel narrows to float
    row = [float(values["flag"]), float(values["width"]), f32(values["ratio"])]
    label = values["label"].encode("utf-8")
    row += [len(label), *label]
    row += [len(values["ints"]), *values["ints"]]
    row += [len(values["floats"]), *map(f32, values["floats"])]
    row += [len(values["grid"])]
    for r in values["grid"]:
        row += [len(r), *r]
    row += [len(values["table"])]
    for r in values["table"]:
        row += [len(r), *map(f32, r)]
    row += [1.0, 0.0, f32(values["width"])]  # HasAttr("flag"), HasAttr("no_such_attr"), Attr<float>("width")
    assert len(row) <= values["width"]
    row += [-1.0] * (values["width"] - len(row))
    return np.array([row, row], dtype=np.float64)
