"""onnx's node conformance cases through onnxruntime and through opforge, per op.

For every ai.onnx op type opforge has a converter for (``converted_op_types``,
as ``SUPPORTED_OPS`` in tests/test_onnx_backend.py), runs each of onnx's node cases of that op (``opforge.onnx.backend.conformance_cases``)
with onnxruntime's backend and with opforge's, compares with the expected
outputs as onnx's runner does (the case's rtol/atol, exact dtypes and shapes),
and prints the pass counts side by side.  ``--failures`` lists every case that
fails, with the first line of its error.

    python benchmarks/onnx_conformance.py [--ops Conv,Pad] [--failures] [--markdown] [--backend ort|opforge|both]

The last line is ``opforge_ge_ort: <ops where opforge passes at least as many>/<ops>``.
"""
import argparse
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import opforge  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

from opforge.onnx.backend import check_case, conformance_cases, converted_op_types  # noqa: E402


def outcome(backend, case):
    """None when the case passes, else the first line of the failure."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with np.errstate(all="ignore"):
                check_case(backend, case)
    except Exception as error:  # noqa: BLE001 -- every failure is a result here
        lines = [line for line in str(error).splitlines() if line.strip()]
        return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
    return None


def backends(which):
    chosen = {}
    if which in ("ort", "both"):
        import onnxruntime
        import onnxruntime.backend

        class Quiet:  # onnxruntime's backend, quiet: some cases fail on purpose
            @staticmethod
            def prepare(model, device):
                return onnxruntime.backend.prepare(model, device, log_severity_level=4)

        onnxruntime.set_default_logger_severity(4)
        chosen["onnxruntime"] = Quiet
    if which in ("opforge", "both"):
        from opforge.onnx.backend import OpforgeBackend

        chosen["opforge"] = OpforgeBackend
    return chosen


def main(argv=None):
    from test_onnx_backend import EXCLUDED

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated op types (default: every ai.onnx op type opforge converts)")
    parser.add_argument("--backend", choices=["ort", "opforge", "both"], default="both")
    parser.add_argument("--failures", action="store_true", help="list failing cases with their error")
    parser.add_argument("--markdown", action="store_true", help="print the table in Markdown (docs/onnx.md)")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else converted_op_types()
    cases = conformance_cases(ops)
    runners = backends(args.backend)
    columns = ["op", "cases", *runners, "excluded"]
    if args.markdown:
        print("| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    else:
        widths = [6] + [13] * len(runners) + [10]
        print(f"{'op':<26}" + "".join(f"{name:>{width}}" for name, width in zip(columns[1:], widths)))
    at_least, failures = 0, []
    for op in ops:
        passed = {}
        for name, backend in runners.items():
            passed[name] = 0
            for case in cases.get(op, []):
                error = outcome(backend, case)
                if error is None:
                    passed[name] += 1
                else:
                    failures.append((name, op, case.name, error))
        row = [op, len(cases.get(op, [])), *passed.values(),
               sum(f"{case.name}_cpu" in EXCLUDED for case in cases.get(op, []))]
        if args.markdown:
            print("| " + " | ".join(str(cell) for cell in row) + " |", flush=True)
        else:
            print(f"{op:<26}" + "".join(f"{cell:>{width}}" for cell, width in zip(row[1:], widths)), flush=True)
        if len(runners) == 2:
            at_least += passed["opforge"] >= passed["onnxruntime"]
    if args.failures:
        for name, op, case, error in failures:
            print(f"FAIL {name:<12}{op:<20}{case}: {error}")
    if len(runners) == 2:
        print(f"opforge_ge_ort: {at_least}/{len(ops)}")


if __name__ == "__main__":
    main()
