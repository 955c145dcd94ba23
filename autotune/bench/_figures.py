"""The figures ``vllm bench serve`` measured, in the names a recommendation stores, and their error against it.

vLLM's result file (``vllm/benchmarks/serve.py`` 1278-1300 and the ``median_*`` / ``p99_*`` keys of
``--percentile-metrics``) is renamed here: ``output_throughput`` -> ``output_tokens_per_s`` (tokens/s),
``median_tpot_ms`` -> ``tpot_ms_p50`` (ms), and so on, so measured and searched figures meet under one name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Our figure name -> the key of vLLM's result file.
FROM_VLLM: dict[str, str] = {
    "output_tokens_per_s": "output_throughput",
    "requests_per_s": "request_throughput",
    "tpot_ms_p50": "median_tpot_ms",
    "tpot_ms_p99": "p99_tpot_ms",
    "ttft_ms_p50": "median_ttft_ms",
    "ttft_ms_p99": "p99_ttft_ms",
    "itl_ms_p50": "median_itl_ms",
    "e2el_ms_p50": "median_e2el_ms",
    "duration_s": "duration",
    "completed": "completed",
    "failed": "failed",
    "output_tokens": "total_output_tokens",
}
#: The figures `compare` puts beside the recommendation's, in this order (what a search stores in metrics).
COMPARED: tuple[str, ...] = ("output_tokens_per_s", "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "ttft_ms_p99")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def figures_from_result(result: Mapping[str, Any]) -> dict[str, float]:
    """Our figures from vLLM's ``--save-result`` JSON; a key vLLM did not write is left out.

    >>> figures_from_result({"output_throughput": 41.5, "median_tpot_ms": 22.0, "completed": 8})
    {'output_tokens_per_s': 41.5, 'tpot_ms_p50': 22.0, 'completed': 8.0}
    """
    out: dict[str, float] = {}
    for ours, theirs in FROM_VLLM.items():
        value = _number(result.get(theirs))
        if value is not None:
            out[ours] = value
    return out


@dataclass(frozen=True)
class FigureError:
    """One figure measured by the benchmark beside the recommendation's (searched or predicted)."""

    name: str
    measured: float
    stored: float
    """The recommendation's value (its ``metrics``): measured by the search's backend, or predicted."""

    @property
    def error(self) -> float | None:
        """(stored - measured) / measured: how far the recommendation's figure is from what serving measured
        (+0.10: it promised 10% more); None when the measured figure is 0."""
        return None if self.measured == 0 else (self.stored - self.measured) / self.measured

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "measured": self.measured, "stored": self.stored, "error": self.error}


def compare(metrics: Mapping[str, Any], figures: Mapping[str, Any]) -> list[FigureError]:
    """The figures of `COMPARED` that both the recommendation's `metrics` and the benchmark's `figures` hold.

    >>> [e.to_dict() for e in compare({"output_tokens_per_s": 110.0}, {"output_tokens_per_s": 100.0})]
    [{'name': 'output_tokens_per_s', 'measured': 100.0, 'stored': 110.0, 'error': 0.1}]
    """
    out = []
    for name in COMPARED:
        stored, measured = _number(metrics.get(name)), _number(figures.get(name))
        if stored is not None and measured is not None:
            out.append(FigureError(name, measured, stored))
    return out


def stored_kind(recommendation: Mapping[str, Any]) -> str:
    """What the recommendation's figures are: "predicted" (model backend), "searched" (measured by the search's
    vllm backend), or "stored" when its provenance does not say."""
    kind = (recommendation.get("provenance") or {}).get("kind")
    return {"predicted": "predicted", "measured": "searched"}.get(str(kind), "stored")
