"""The CUDA architecture sources are compiled for: ``sm_XX`` of the visible GPU.

``detect_cuda_arch()`` answers without spawning anything on a warm run: the
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
from pathlib import Path

from ..errors import BuildError
from .cache import atomic_write, cache_dir

__all__ = ["DEFAULT_CUDA_ARCH", "detect_cuda_arch", "normalize_arch"]

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


_arch_memo: dict[str, str] = {}


def detect_cuda_arch() -> str:
    """The ``sm_XX`` of the visible GPU, else ``"sm_80"``; ``$OPFORGE_CUDA_ARCH`` wins.

    Asks ``nvidia-smi --query-gpu=compute_cap``, else the CUDA driver/runtime
    library.  The answer is remembered on disk, keyed by the driver's view of
    the GPUs in ``/proc/driver/nvidia``, so a warm build of a ``.cu`` source
    in a fresh process spawns nothing.  Without an NVIDIA driver no probe runs.
    """
    override = os.environ.get("OPFORGE_CUDA_ARCH", "").strip()
    if override:
        return normalize_arch(override)
    fingerprint = _gpu_fingerprint()
    if fingerprint is None:
        return DEFAULT_CUDA_ARCH
    if fingerprint in _arch_memo:
        return _arch_memo[fingerprint]
    memo_file = cache_dir() / ".cuda-arch.json"
    try:
        stored = json.loads(memo_file.read_text())
        if isinstance(stored, dict) and isinstance(stored.get(fingerprint), str):
            arch = normalize_arch(stored[fingerprint])
            _arch_memo[fingerprint] = arch
            return arch
    except (OSError, ValueError):
        pass
    probed = _probe_cuda_arch()
    found = probed is not None
    arch = probed or DEFAULT_CUDA_ARCH
    _arch_memo[fingerprint] = arch
    if found:
        with contextlib.suppress(OSError):
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(memo_file, json.dumps({fingerprint: arch}).encode())
    return arch


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


def _first_visible_index() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def _probe_cuda_arch() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=15,
            )
            caps = [line.strip() for line in done.stdout.splitlines() if line.strip()]
            if done.returncode == 0 and caps:
                index = _first_visible_index()
                return normalize_arch(caps[index if index < len(caps) else 0])
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            log.debug("nvidia-smi could not report the compute capability: %s", exc)
    return _probe_cuda_arch_ctypes()


def _probe_cuda_arch_ctypes() -> str | None:
    import ctypes

    major, minor = ctypes.c_int(), ctypes.c_int()
    with contextlib.suppress(OSError, AttributeError):
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        if (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) == 0):
            return f"sm_{major.value}{minor.value}"
    candidates = ["libcudart.so"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "lib64", "libcudart.so"))
    candidates.append("/usr/local/cuda/lib64/libcudart.so")
    for name in candidates:
        with contextlib.suppress(OSError, AttributeError):
            cudart = ctypes.CDLL(name)
            if (cudart.cudaDeviceGetAttribute(ctypes.byref(major), 75, 0) == 0
                    and cudart.cudaDeviceGetAttribute(ctypes.byref(minor), 76, 0) == 0):
                return f"sm_{major.value}{minor.value}"
    return None
