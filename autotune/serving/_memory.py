"""How much RAM `peagle-tune serve` lets vLLM reserve on a machine without GPUs.

On the CPU platform vLLM reads ``--gpu-memory-utilization`` as the fraction of the memory node's RAM it reserves,
and refuses to start when that is more than the node's available memory (``vllm/v1/worker/cpu_worker.py``: "Available
memory ... is less than desired CPU memory utilization"). Its default, 0.92, fails on any machine where other
processes hold more than 8% of RAM, so serve passes ``min(default, MARGIN * available / total)`` instead; a value the
user passes after ``--`` (or in a ``--config`` file) wins.
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["MEMINFO_PATH", "VLLM_DEFAULT_MEMORY_FRACTION", "cpu_memory_fraction", "read_meminfo"]

MEMINFO_PATH = Path("/proc/meminfo")
VLLM_DEFAULT_MEMORY_FRACTION = 0.92
"""vLLM 0.32's default ``gpu_memory_utilization`` (``vllm/config/cache.py``)."""
MARGIN = 0.9
"""Share of the available memory serve lets vLLM reserve: the rest absorbs what other processes allocate between
this reading and vLLM's check, and the difference between the kernel's MemAvailable and vLLM's own estimate."""


def read_meminfo(path: Path | None = None) -> tuple[int, int] | None:
    """(total, available) bytes from a ``/proc/meminfo``-style file (``MemTotal``, ``MemAvailable``, else
    ``MemFree`` + file pages + reclaimable slab as vLLM counts it); None when it cannot be read."""
    values: dict[str, int] = {}
    try:
        text = (path or MEMINFO_PATH).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            values[parts[0][:-1]] = int(parts[1]) * 1024  # kB
    total = values.get("MemTotal")
    available = values.get("MemAvailable")
    if available is None and "MemFree" in values:
        available = sum(values.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
    if not total or available is None:
        return None
    return total, available


def cpu_memory_fraction(total: int, available: int, default: float = VLLM_DEFAULT_MEMORY_FRACTION) -> float:
    """``min(default, MARGIN * available / total)``, rounded down to 0.01 (vLLM then reserves at most MARGIN of
    the available memory), and at least 0.01 (vLLM needs a fraction > 0; the launch then fails on memory with
    vLLM's own message)."""
    fraction = min(default, MARGIN * available / total)
    return max(0.01, math.floor(fraction * 100 + 1e-9) / 100)
