"""Results of a simulation: one row per (workload shape, load, config), with provenance "predicted"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autotune.measurement import Provenance
from autotune.simulate._engine import SimRun

__all__ = ["ConfigResult", "SimulationResult", "result_from_run"]


@dataclass(frozen=True)
class ConfigResult:
    """One config's predicted figures on one workload shape at one load.

    ``output_tokens_per_s``: output tokens / simulated wall time of all phases. ``tpot_ms_*``: per request, (finish -
    first token) / (tokens - 1); ``ttft_ms_*``: first token - arrival (queueing included). ``acceptance_length``:
    tokens gained per decoding request-step (bonus included; capped by the requests' ends). ``speedup_vs_no_spec``:
    tokens/s over the no-speculation row of the same shape and load. The per-phase oracle row (kind "oracle") is
    computed from the static rows' phase times and has no latency figures.
    """

    config: str
    kind: str
    workload: str
    concurrency: int | None
    request_rate: float | None
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    phase_tokens_per_s: tuple[float, ...]
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    acceptance_length: float | None = None
    mean_batch: float | None = None
    steps: int | None = None
    depth_histogram: dict[int, int] = field(default_factory=dict)
    speedup_vs_no_spec: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def with_speedup(self, base_tokens_per_s: float) -> ConfigResult:
        from dataclasses import replace

        value = self.output_tokens_per_s / base_tokens_per_s if base_tokens_per_s > 0 else None
        return replace(self, speedup_vs_no_spec=value)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase_tokens_per_s"] = list(self.phase_tokens_per_s)
        d["depth_histogram"] = {str(k): v for k, v in self.depth_histogram.items()}
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfigResult:
        """The inverse of `to_dict` (as JSON gives it back: lists for tuples, string histogram keys)."""
        d = dict(data)
        d["phase_tokens_per_s"] = tuple(d.get("phase_tokens_per_s") or ())
        d["depth_histogram"] = {int(k): int(v) for k, v in (d.get("depth_histogram") or {}).items()}
        d["notes"] = dict(d.get("notes") or {})
        return cls(**d)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def result_from_run(
    run: SimRun, kind: str, workload: str, concurrency: int | None, request_rate: float | None
) -> ConfigResult:
    """Summarise a `SimRun` (percentiles over requests)."""
    tpots = [v for r in run.requests if (v := r.tpot_ms) is not None]
    ttfts = [r.ttft_ms for r in run.requests]
    decode_tokens = sum(r.output_tokens - 1 for r in run.requests)
    al = decode_tokens / run.decode_request_steps if run.decode_request_steps else None
    return ConfigResult(
        config=run.config,
        kind=kind,
        workload=workload,
        concurrency=concurrency,
        request_rate=request_rate,
        output_tokens=run.output_tokens,
        duration_s=run.duration_ms / 1000.0,
        output_tokens_per_s=run.tokens_per_s,
        phase_tokens_per_s=tuple(run.phase_tokens_per_s()),
        tpot_ms_p50=_pct(tpots, 50),
        tpot_ms_p99=_pct(tpots, 99),
        ttft_ms_p50=_pct(ttfts, 50),
        ttft_ms_p99=_pct(ttfts, 99),
        acceptance_length=al,
        mean_batch=run.batch_sum / run.steps if run.steps else None,
        steps=run.steps,
        depth_histogram=dict(run.depth_histogram),
        notes=dict(run.rule_summary),
    )


@dataclass
class SimulationResult:
    """Everything one simulation predicts, with what it was predicted from.

    ``provenance``: kind "predicted", backend "simulate", device = the GPU (or device of the profile) assumed,
    profile = acceptance source and step-cost source. ``rows``: one per (workload, load, config), oracle included.
    """

    provenance: Provenance
    model: str
    drafter: str | None
    device: str
    acceptance_source: str
    step_cost_source: str
    controller_cost_fit: dict[str, float] | None
    settings: dict[str, Any]
    rows: list[ConfigResult]
    warnings: list[str] = field(default_factory=list)

    def rows_for(self, workload: str, concurrency: int | None = None) -> list[ConfigResult]:
        return [
            r for r in self.rows if r.workload == workload and (concurrency is None or r.concurrency == concurrency)
        ]

    def best(self, workload: str, concurrency: int | None, kinds: Sequence[str]) -> ConfigResult | None:
        rows = [r for r in self.rows_for(workload, concurrency) if r.kind in kinds]
        return max(rows, key=lambda r: r.output_tokens_per_s, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "provenance": self.provenance.to_dict(),
            "label": "PREDICTED",
            "model": self.model,
            "drafter": self.drafter,
            "device": self.device,
            "acceptance_source": self.acceptance_source,
            "step_cost_source": self.step_cost_source,
            "controller_cost_fit": self.controller_cost_fit,
            "settings": self.settings,
            "rows": [r.to_dict() for r in self.rows],
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimulationResult:
        """The inverse of `to_dict` (the "label" key, always "PREDICTED", is implied)."""
        return cls(
            provenance=Provenance.from_dict(dict(data["provenance"])),
            model=data["model"],
            drafter=data.get("drafter"),
            device=data["device"],
            acceptance_source=data["acceptance_source"],
            step_cost_source=data["step_cost_source"],
            controller_cost_fit=data.get("controller_cost_fit"),
            settings=dict(data.get("settings") or {}),
            rows=[ConfigResult.from_dict(r) for r in data.get("rows") or []],
            warnings=list(data.get("warnings") or []),
        )
