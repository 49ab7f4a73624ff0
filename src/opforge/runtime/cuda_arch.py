"""The CUDA architectures sources are compiled for: the ``sm_XX`` of each visible GPU.

``detect_cuda_archs()`` answers without spawning anything on a warm run: the
answer is remembered in the cache folder, keyed by the NVIDIA driver's view
of the GPUs.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ..errors import BuildError
from .cache import atomic_write, cache_dir

__all__ = ["DEFAULT_CUDA_ARCH", "detect_cuda_arch", "detect_cuda_archs", "normalize_arch", "normalize_archs"]

log = logging.getLogger("opforge.build")

DEFAULT_CUDA_ARCH = "sm_80"


def normalize_arch(arch: object) -> str:
    """"sm_90", "90", "9.0", "compute_90", "sm_90a" -> "sm_90" / "sm_90a"."""
    text = str(arch).strip().lower()
    for prefix in ("sm_", "compute_", "sm", "compute"):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    if re.fullmatch(r"\d+\.\d+", text):
        major, minor = text.split(".")
        text = f"{major}{minor}"
    if not re.fullmatch(r"\d{2,3}[a-z]?", text):
        raise BuildError(f"cannot read CUDA architecture {arch!r}; use a form like 'sm_90' or '9.0'")
    return f"sm_{text}"


def normalize_archs(archs: str | Iterable[str]) -> tuple[str, ...]:
    """"sm_90,8.0" or ["90", "sm_80", "80"] -> ("sm_80", "sm_90"): each once, in order, so that one set of
    architectures always gives one command line (and one cache entry)."""
    words = archs.split(",") if isinstance(archs, str) else archs
    found = {normalize_arch(word) for word in words if str(word).strip()}
    if not found:
        raise BuildError(f"no CUDA architecture in {archs!r}; use a form like 'sm_90' or 'sm_80,sm_90'")
    return tuple(sorted(found, key=lambda arch: (int(re.findall(r"\d+", arch)[0]), arch)))


_arch_memo: dict[str, tuple[str, ...]] = {}


def detect_cuda_arch() -> str:
    """The lowest of ``detect_cuda_archs()``."""
    return detect_cuda_archs()[0]


def detect_cuda_archs() -> tuple[str, ...]:
    """Every distinct ``sm_XX`` among the visible GPUs, else ``("sm_80",)``; ``$OPFORGE_CUDA_ARCH``
    (one, or several separated by commas) wins.

    Asks ``nvidia-smi --query-gpu=compute_cap``, else the CUDA driver/runtime
    library.  The answer is remembered on disk, keyed by the driver's view of
    the GPUs in ``/proc/driver/nvidia``, so a warm build of a ``.cu`` source
    in a fresh process spawns nothing.  Without an NVIDIA driver no probe runs.
    """
    override = os.environ.get("OPFORGE_CUDA_ARCH", "").strip()
    if override:
        return normalize_archs(override)
    fingerprint = _gpu_fingerprint()
    if fingerprint is None:
        return (DEFAULT_CUDA_ARCH,)
    if fingerprint in _arch_memo:
        return _arch_memo[fingerprint]
    memo_file = cache_dir() / ".cuda-archs.json"  # (.cuda-arch.json held the first GPU's alone)
    try:
        stored = json.loads(memo_file.read_text())
        if isinstance(stored, dict) and isinstance(stored.get(fingerprint), list):
            archs = normalize_archs(stored[fingerprint])
            _arch_memo[fingerprint] = archs
            return archs
    except (OSError, ValueError, BuildError):
        pass
    probed = _probe_cuda_archs()
    archs = normalize_archs(probed) if probed else (DEFAULT_CUDA_ARCH,)
    _arch_memo[fingerprint] = archs
    if probed:
        with contextlib.suppress(OSError):
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(memo_file, json.dumps({fingerprint: list(archs)}).encode())
    return archs


def _gpu_fingerprint() -> str | None:
    """A digest of what the NVIDIA driver reports, or None when there is no driver."""
    proc = Path("/proc/driver/nvidia")
    parts = [os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"), os.environ.get("CUDA_DEVICE_ORDER", "")]
    if proc.is_dir():
        with contextlib.suppress(OSError):
            parts.append((proc / "version").read_text())
        with contextlib.suppress(OSError):
            for gpu in sorted((proc / "gpus").iterdir()):
                parts.append(gpu.name)
                with contextlib.suppress(OSError):
                    parts.append((gpu / "information").read_text())
    elif sys.platform.startswith("linux") or not shutil.which("nvidia-smi"):
        # Linux without the driver's /proc entries has no usable NVIDIA GPU.
        return None
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _visible(caps: list[str]) -> list[str]:
    """The entries of ``caps`` (one per GPU, nvidia-smi's order) that CUDA_VISIBLE_DEVICES lets CUDA see;
    all of them when it names GPUs other than by index (UUIDs), or when CUDA numbers them otherwise than
    nvidia-smi (its default order is fastest first, nvidia-smi's the PCI bus's): an extra architecture
    costs build time only, a missing one a library that cannot load."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or os.environ.get("CUDA_DEVICE_ORDER", "").strip() != "PCI_BUS_ID":
        return caps
    indices = []
    for word in visible.split(","):  # CUDA stops at the first entry it cannot read
        if not word.strip().isdigit():
            break
        indices.append(int(word))
    seen = [caps[index] for index in indices if index < len(caps)]
    return seen or caps


def _probe_cuda_archs() -> list[str] | None:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=15,
            )
            caps = [line.strip() for line in done.stdout.splitlines() if line.strip()]
            if done.returncode == 0 and caps:
                return [normalize_arch(cap) for cap in _visible(caps)]
        except (OSError, subprocess.SubprocessError, BuildError) as exc:
            log.debug("nvidia-smi could not report the compute capability: %s", exc)
    return _probe_cuda_archs_ctypes()


def _probe_cuda_archs_ctypes() -> list[str] | None:
    """Each visible device's arch from the driver library, else the runtime's (both see CUDA_VISIBLE_DEVICES)."""
    import ctypes

    major, minor, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    with contextlib.suppress(OSError, AttributeError):
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        archs = []
        if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0:
            for index in range(count.value):
                if (cuda.cuDeviceGet(ctypes.byref(device), index) == 0
                        and cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) == 0
                        and cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) == 0):
                    archs.append(f"sm_{major.value}{minor.value}")
        if archs:
            return archs
    candidates = ["libcudart.so"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "lib64", "libcudart.so"))
    candidates.append("/usr/local/cuda/lib64/libcudart.so")
    for name in candidates:
        with contextlib.suppress(OSError, AttributeError):
            cudart = ctypes.CDLL(name)
            archs = []
            if cudart.cudaGetDeviceCount(ctypes.byref(count)) == 0:
                for index in range(count.value):
                    if (cudart.cudaDeviceGetAttribute(ctypes.byref(major), 75, index) == 0
                            and cudart.cudaDeviceGetAttribute(ctypes.byref(minor), 76, index) == 0):
                        archs.append(f"sm_{major.value}{minor.value}")
            if archs:
                return archs
    return None
