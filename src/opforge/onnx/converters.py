"""The converter modules, one per op family; importing one registers its converters."""
import importlib

CONVERTER_MODULES = [
    "shape",
    "elementwise",
    "reduce",
    "nn",
    "linear",
    "indexing",
    "quantize",
    "rms_normalization",
    "mathops",
    "control_flow",
    "rnn",
    "value_sized",
    "contrib",
]


def import_converters() -> None:
    for name in CONVERTER_MODULES:
        importlib.import_module(f"{__package__}.{name}")
