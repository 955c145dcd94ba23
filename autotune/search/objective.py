"""What a search optimises: the objective, its SLO constraints, and the figures a trial keeps of a measurement.

Optuna constraints follow its convention: a trial is feasible when every constraint value is <= 0 (here
``metric - SLO`` in ms).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import UsageError
from autotune.measurement import Measurement

OBJECTIVES: tuple[str, ...] = ("throughput", "latency", "goodput", "pareto")

#: SLO name -> the metric it bounds (ms).
SLO_METRICS: dict[str, str] = {"tpot_ms_p99": "TPOT p99", "ttft_ms_p99": "TTFT p99"}


class MissingFigureError(Exception):
    """A measurement came back without a figure the objective needs (the trial counts as failed)."""


@dataclass(frozen=True)
class Objective:
    """What a search optimises, and the SLOs every recommended config must meet.

    - ``throughput``: maximise output tokens/s;
    - ``latency``: minimise TPOT p50 (ms per output token; p99 is reported);
    - ``goodput``: maximise output tokens/s among configs that meet the SLOs (at least one SLO required);
    - ``pareto``: maximise output tokens/s and minimise TPOT p99 together; the front is kept and the recommended
      point is the front's highest-throughput config that meets the SLOs given.

    SLOs given with any objective are Optuna constraints (``trial.set_constraint``): ``metric - slo`` in ms, feasible
    when <= 0. Violating trials stay in the study and the store with their constraint values and are never
    recommended.
    """

    name: str = "throughput"
    slo_tpot_p99_ms: float | None = None
    """Largest acceptable TPOT p99, ms."""
    slo_ttft_p99_ms: float | None = None
    """Largest acceptable TTFT p99, ms."""

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, but got {self.name!r}.")
        for option, value in (("--slo-tpot-p99", self.slo_tpot_p99_ms), ("--slo-ttft-p99", self.slo_ttft_p99_ms)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"{option} must be a positive number of milliseconds, but got {value}.")
        if self.name == "goodput" and not self.slos:
            raise UsageError(
                "--objective goodput maximises throughput subject to SLOs, but none was given. "
                "Pass --slo-tpot-p99 MS and/or --slo-ttft-p99 MS, or use --objective throughput."
            )

    @property
    def slos(self) -> dict[str, float]:
        """{metric: bound in ms} for the SLOs given."""
        out: dict[str, float] = {}
        if self.slo_tpot_p99_ms is not None:
            out["tpot_ms_p99"] = float(self.slo_tpot_p99_ms)
        if self.slo_ttft_p99_ms is not None:
            out["ttft_ms_p99"] = float(self.slo_ttft_p99_ms)
        return out

    @property
    def multi(self) -> bool:
        return self.name == "pareto"

    @property
    def value_names(self) -> list[str]:
        """The metrics Optuna optimises, in order (also the keys of a stored trial's ``values``)."""
        return {
            "throughput": ["output_tokens_per_s"],
            "goodput": ["output_tokens_per_s"],
            "latency": ["tpot_ms_p50"],
            "pareto": ["output_tokens_per_s", "tpot_ms_p99"],
        }[self.name]

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        return ["minimize" if n.startswith(("tpot", "ttft")) else "maximize" for n in self.value_names]

    def values(self, metrics: Mapping[str, Any]) -> list[float]:
        """The objective values of a measurement's metrics (see `measurement_metrics`).

        Raises MissingFigureError when a value is missing or not finite."""
        out = []
        for name in self.value_names:
            value = metrics.get(name)
            if value is None or not math.isfinite(float(value)):
                raise MissingFigureError(f"the backend returned no {name} figure, which objective {self.name} needs")
            out.append(float(value))
        return out

    def constraints(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """{metric: value - SLO} in ms; feasible when every entry is <= 0. A missing figure violates its SLO."""
        out: dict[str, float] = {}
        for metric, bound in self.slos.items():
            value = metrics.get(metric)
            out[metric] = math.inf if value is None else float(value) - bound
        return out

    def feasible(self, metrics: Mapping[str, Any]) -> bool:
        """Does a measurement with these metrics meet every SLO?"""
        return all(v <= 0 for v in self.constraints(metrics).values())

    def score(self, m: Measurement, *, check_slos: bool = True) -> float | None:
        """A higher-is-better score of a measurement's first objective value: tokens/s, or 1/TPOT p50 (1/ms) for
        latency. None when it failed, has no usable figure, or (with `check_slos`) violates an SLO."""
        if not m.ok:
            return None
        metrics = measurement_metrics(m)
        try:
            value = self.values(metrics)[0]
        except MissingFigureError:
            return None
        if check_slos and not self.feasible(metrics):
            return None
        if value <= 0:
            return None
        return value if self.directions[0] == "maximize" else 1.0 / value

    def describe(self) -> str:
        base = {
            "throughput": "max output tokens/s",
            "latency": "min TPOT p50",
            "goodput": "max output tokens/s",
            "pareto": "Pareto front of output tokens/s vs TPOT p99",
        }[self.name]
        slos = self.describe_slos()
        return f"{base} subject to {slos}" if slos else base

    def describe_slos(self) -> str:
        """The SLOs in words, e.g. ``TPOT p99 <= 12 ms, TTFT p99 <= 500 ms`` ("" without SLOs)."""
        return ", ".join(f"{SLO_METRICS[m]} <= {v:g} ms" for m, v in self.slos.items())

    def slug(self) -> str:
        """Short name for default study names, e.g. ``goodput-tpot30-ttft500``."""
        parts = [self.name]
        if self.slo_tpot_p99_ms is not None:
            parts.append(f"tpot{self.slo_tpot_p99_ms:g}")
        if self.slo_ttft_p99_ms is not None:
            parts.append(f"ttft{self.slo_ttft_p99_ms:g}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measurement_metrics(m: Measurement) -> dict[str, Any]:
    """The figures a trial keeps (tokens/s; TPOT and TTFT p50/p99 in ms; acceptance length).

    A backend that gives no p99 (the model backend predicts one steady-state value per config, with no tail) has its
    p50 used as the p99, and ``p99_from_p50`` lists the metrics where that was done.
    """
    out: dict[str, Any] = {
        "output_tokens_per_s": m.output_tokens_per_s,
        "tpot_ms_p50": m.tpot_ms_p50,
        "tpot_ms_p99": m.tpot_ms_p99,
        "ttft_ms_p50": m.ttft_ms_p50,
        "ttft_ms_p99": m.ttft_ms_p99,
    }
    filled = []
    for kind in ("tpot", "ttft"):
        if out[f"{kind}_ms_p99"] is None and out[f"{kind}_ms_p50"] is not None:
            out[f"{kind}_ms_p99"] = out[f"{kind}_ms_p50"]
            filled.append(f"{kind}_ms_p99")
    if filled:
        out["p99_from_p50"] = filled
    if m.spec is not None:
        out["acceptance_length"] = m.spec.mean_acceptance_length
    if "acceptance_length" in m.extra:
        out["acceptance_length"] = m.extra["acceptance_length"]
    if m.speedup_vs_no_spec is not None:
        out["speedup_vs_no_spec"] = m.speedup_vs_no_spec
    if m.provenance.kind == "predicted":
        out.update(prediction_figures(m.extra, out.get("speedup_vs_no_spec")))
    return out


#: What a prediction says about itself (`autotune.backends.model`): the spread of its speedup, and what its step time
#: is made of and which bound applies.
PREDICTION_KEYS = ("prediction_log_sigma", "step_ms", "step_breakdown_ms", "bound")


def prediction_figures(extra: Mapping[str, Any], speedup: float | None) -> dict[str, Any]:
    """A predicted trial's own figures kept beside its metrics: ``prediction_log_sigma`` (one sigma, log scale),
    ``speedup_range`` (`speedup` x exp(-sigma) .. x exp(+sigma)), ``step_ms`` with ``step_breakdown_ms`` (ms, summing
    to it) and ``bound`` ("memory" or "compute"); only those the backend gave."""
    out = {key: extra[key] for key in PREDICTION_KEYS if key in extra}
    sigma = out.get("prediction_log_sigma")
    if isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0 and isinstance(speedup, (int, float)) \
            and math.isfinite(speedup):
        out["speedup_range"] = speedup_range(float(speedup), float(sigma))
    return out


def speedup_range(speedup: float, log_sigma: float) -> list[float]:
    """One sigma each side of a predicted speedup (log scale): ``[speedup * exp(-sigma), speedup * exp(sigma)]``."""
    return [speedup * math.exp(-log_sigma), speedup * math.exp(log_sigma)]
