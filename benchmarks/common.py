"""What the benchmark scripts share: where the fixtures are, the one tokens/s figure, spreads, the machine's load.

Pure helpers (no vLLM). Figures are measured output tokens over wall time; a workload run is a list of phases,
each ``{"output_tokens": int, "wall_s": float, ...}`` as `benchmarks.bench_runtime` writes them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: The tiny CPU models every engine benchmark runs (``tests/fixtures/build_fixtures.py`` builds them).
DEFAULT_MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
#: The fixtures' workload: a "predictable" and an "entropic" class.
DEFAULT_WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"


def tokens_per_s(phases: Sequence[Mapping[str, Any]], index: int | None = None) -> float:
    """Output tokens/s of a workload run: its phases' output tokens over their summed wall time (`index`: that
    phase alone). Example: ``tokens_per_s([{"output_tokens": 90, "wall_s": 2.0}, {"output_tokens": 30,
    "wall_s": 1.0}])`` is 40.0."""
    chosen = phases if index is None else [phases[index]]
    return sum(float(p["output_tokens"]) for p in chosen) / sum(float(p["wall_s"]) for p in chosen)


def round_tokens_per_s(rounds: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """`tokens_per_s` of each round that ran workload `key` (e.g. "c8:shifting"), in round order; rounds without it
    or with no wall time are left out."""
    return [tokens_per_s(r[key]) for r in rounds if r.get(key) and sum(float(p["wall_s"]) for p in r[key]) > 0]


def spread(values: Sequence[float], digits: int = 0) -> str:
    """``median (min-max)`` of `values` with `digits` decimals; "n/a" for none."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` with linear interpolation (0.25 and 0.75: the interquartile range)."""
    xs = sorted(values)
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def load_average() -> float:
    """The machine's 1-minute load average (the benchmarks share a machine; every figure says how busy it was)."""
    return os.getloadavg()[0]


def uptime() -> str:
    """``uptime``'s output (the load averages over 1, 5 and 15 minutes)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"uptime failed: {exc}"


def available_memory_gib() -> float | None:
    """MemAvailable from /proc/meminfo, GiB (None where unreadable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None
