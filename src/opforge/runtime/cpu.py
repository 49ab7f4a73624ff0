"""CPU instruction sets: what this machine has, and the cap dispatch honours.

Kernels may declare an ``isa``; dispatch picks the best one the CPU supports
and the cap allows.  ``OPFORGE_ISA=sse41`` (or ``set_isa_cap("sse41")``)
caps it, to test the plainer variants or to match an older machine.
"""
from __future__ import annotations

import os
import platform

from ..errors import OpforgeError

#: Known instruction sets, weakest first, with the flags that enable them and
#: the /proc/cpuinfo flags they need.
ISA_LEVELS = ("generic", "sse41", "avx", "avx2", "avx512")
ISA_COMPILE_FLAGS = {
    "generic": [],
    "sse41": ["-msse4.1"],
    "avx": ["-mavx"],
    "avx2": ["-mavx2", "-mfma"],
    "avx512": ["-mavx512f", "-mavx2", "-mfma"],
}
_REQUIRED_FLAGS = {
    "generic": set(),
    "sse41": {"sse4_1"},
    "avx": {"avx"},
    "avx2": {"avx2", "fma"},
    "avx512": {"avx512f"},
}
_cap: str | None = None


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_FLAGS = _cpu_flags() if platform.machine() in ("x86_64", "AMD64", "i686") else set()


def normalize_isa(isa: str | None) -> str:
    name = "generic" if isa in (None, "", "none") else str(isa).lower().replace(".", "").replace("_", "")
    name = {"sse4": "sse41", "avx512f": "avx512"}.get(name, name)
    if name not in ISA_LEVELS:
        raise OpforgeError(f"unknown instruction set {isa!r}; expected one of {', '.join(ISA_LEVELS)}")
    return name


def cpu_features() -> dict[str, bool]:
    """Which instruction sets (and FMA) this CPU supports."""
    features = {isa: _REQUIRED_FLAGS[isa] <= _FLAGS for isa in ISA_LEVELS}
    features["fma"] = "fma" in _FLAGS
    return features


def set_isa_cap(isa: str | None) -> None:
    """Cap dispatch at ``isa`` (None removes the cap; OPFORGE_ISA still applies)."""
    global _cap
    _cap = None if isa is None else normalize_isa(isa)
    from ..operator import Op

    Op.forget_all_plans()  # kernels chosen under the old cap must be chosen again


_env_cap: str | None = None  # OPFORGE_ISA's cap, read once: the environment is not read on every call


def isa_cap() -> str:
    """The ISA cap: ``set_isa_cap``'s, else OPFORGE_ISA's (read when first needed), else none."""
    global _env_cap
    if _cap is not None:
        return _cap
    if _env_cap is None:
        env = os.environ.get("OPFORGE_ISA")
        _env_cap = normalize_isa(env) if env else ISA_LEVELS[-1]
    return _env_cap


def isa_rank(isa: str | None) -> int:
    return ISA_LEVELS.index(normalize_isa(isa))


def isa_reject_reason(isa: str | None) -> str | None:
    """Why a kernel for ``isa`` cannot run here, or None."""
    isa = normalize_isa(isa)
    if not cpu_features()[isa]:
        return f"this CPU lacks {isa}"
    if isa_rank(isa) > isa_rank(isa_cap()):
        return f"{isa} is above the ISA cap {isa_cap()} (OPFORGE_ISA / opforge.set_isa_cap)"
    return None


def best_isa() -> str:
    usable = [isa for isa in ISA_LEVELS if isa_reject_reason(isa) is None]
    return usable[-1]
