"""Simulations in the store, kept like other predictions: as trials of a study of their own.

No table of its own (the schema is unchanged): a simulation is one study in the trials table, named
``simulate-<model>-<device>-<UTC time>``, with one trial per result row (trial number = row index, in the result's
order), backend "simulate" and the result's provenance (kind "predicted", the GPU assumed, acceptance and step-cost
sources). A trial's ``values`` are the figures other studies are compared on (``output_tokens_per_s``, and
``tpot_ms_p50`` where the row has one: the per-phase oracle has none); its ``metrics`` hold the whole row
(``metrics["row"]``) and what the simulation was predicted from (``metrics["simulation"]``: model, drafter, device,
sources, settings, warnings), so `load_simulation` gives back the `SimulationResult` that was stored, and any one
trial says where its numbers come from. ``config`` holds the row's label and kind, not a `SpecConfig` (an adaptive
row is not one engine config).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import NotFoundError, UsageError
from autotune.safe_text import shell_word
from autotune.simulate._result import SimulationResult
from store import Store, TrialRecord

__all__ = [
    "SIMULATE_BACKEND",
    "StoredSimulation",
    "is_simulation",
    "list_simulations",
    "load_simulation",
    "simulation_study_name",
    "store_simulation",
]

SIMULATE_BACKEND = "simulate"
"""The ``backend`` of a stored simulation's trials (and of its provenance)."""


def is_simulation(trial: TrialRecord) -> bool:
    """Whether a stored trial is a row of a simulation (rather than a search trial)."""
    return trial.backend == SIMULATE_BACKEND


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "x"


def simulation_study_name(result: SimulationResult, when: dt.datetime) -> str:
    """``simulate-gpt-oss-120b-nvidia-h200-sxm-141gb-20260131t120000z``: model, device and UTC time of storing."""
    stamp = when.astimezone(dt.UTC).strftime("%Y%m%dt%H%M%Sz")
    return f"simulate-{_slug(result.model.rstrip('/').split('/')[-1])}-{_slug(result.device)}-{stamp}"


def _finite(value: Any) -> Any:
    """`value` with NaN/infinite floats as None (the store refuses them; a simulation never makes them, but a
    zero-length run's ratios could)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def store_simulation(store: Store, result: SimulationResult, *, study: str | None = None) -> str:
    """Store `result` as a new study (one trial per row); returns the study's name.

    `study`: the name to use (default `simulation_study_name` at the current time, with ``-2``, ``-3``, ... added
    when that name is taken). A name that already has trials is refused (`UsageError`): a stored simulation is never
    mixed with another's rows.
    """
    now = dt.datetime.now(dt.UTC)
    if study is None:
        base = simulation_study_name(result, now)
        study, n = base, 1
        while store.list_trials(study=study):
            n += 1
            study = f"{base}-{n}"
    elif store.list_trials(study=study):
        raise UsageError(f"Study {study!r} already has trials stored; choose another name for the simulation.")
    data = result.to_dict()
    header = _finite({k: v for k, v in data.items() if k not in ("rows", "provenance")})
    provenance = _finite(data["provenance"])
    for number, row in enumerate(data["rows"]):
        values = {
            name: float(row[name])
            for name in ("output_tokens_per_s", "tpot_ms_p50")
            if isinstance(row.get(name), int | float) and math.isfinite(row[name])
        }
        store.add_trial(
            study,
            number=number,
            model=result.model,
            config={"label": row["config"], "kind": row["kind"]},
            backend=SIMULATE_BACKEND,
            scenario={"concurrency": row["concurrency"], "request_rate": row["request_rate"],
                      "workload": row["workload"]},
            values=values,
            metrics={"row": _finite(row), "simulation": header},
            status="complete",
            provenance=provenance,
            created_at=now,
        )
    return study


def load_simulation(store: Store, study: str) -> SimulationResult:
    """The `SimulationResult` stored as `study` (rows in their stored order).

    Raises `NotFoundError` when the study has no trials, `UsageError` when it is not a simulation (a search study)
    or its trials do not hold one (written by hand or by another version).
    """
    trials = store.list_trials(study=study)
    if not trials:
        raise NotFoundError(
            f"No simulation named {study!r} is stored. `peagle-tune show --simulations` lists the stored ones."
        )
    if not all(is_simulation(t) for t in trials):
        raise UsageError(f"Study {study!r} is not a simulation (its trials come from a search): use "
                         f"`peagle-tune show --trials {shell_word(study)}`.")
    first = trials[0]
    try:
        header = dict(first.metrics["simulation"])
        return SimulationResult.from_dict(
            {**header, "provenance": first.provenance, "rows": [t.metrics["row"] for t in trials]}
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"The trials of {study!r} do not hold a simulation this version can read ({exc}).") from None


@dataclass(frozen=True)
class StoredSimulation:
    """One stored simulation, summarised for listing (``peagle-tune show --simulations``)."""

    study: str
    model: str
    device: str
    """The GPU (or profile's device) assumed."""
    drafter: str | None
    acceptance_source: str
    step_cost_source: str
    workloads: list[str]
    concurrencies: list[int]
    request_rate: float | None
    configs: list[str]
    """Config labels in the order simulated (the oracle included)."""
    rows: int
    created_at: dt.datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "model": self.model,
            "device": self.device,
            "drafter": self.drafter,
            "acceptance_source": self.acceptance_source,
            "step_cost_source": self.step_cost_source,
            "workloads": list(self.workloads),
            "concurrencies": list(self.concurrencies),
            "request_rate": self.request_rate,
            "configs": list(self.configs),
            "rows": self.rows,
            "created_at": self.created_at.isoformat(),
            "label": "PREDICTED",
        }


def _text(value: Any, default: str = "?") -> str:
    return value if isinstance(value, str) and value else default


def summarise(study: str, trials: Sequence[TrialRecord]) -> StoredSimulation:
    """A listing line's facts from a simulation's trials; whatever a trial lacks is shown as "?" (never raises)."""
    first = trials[0]
    header = first.metrics.get("simulation")
    header = header if isinstance(header, Mapping) else {}
    workloads: list[str] = []
    concurrencies: list[int] = []
    configs: list[str] = []
    rate: float | None = None
    for t in trials:
        w, c, r = t.scenario.get("workload"), t.scenario.get("concurrency"), t.scenario.get("request_rate")
        label = t.config.get("label")
        if isinstance(w, str) and w not in workloads:
            workloads.append(w)
        if isinstance(c, int) and not isinstance(c, bool) and c not in concurrencies:
            concurrencies.append(c)
        if isinstance(r, int | float) and not isinstance(r, bool):
            rate = float(r)
        if isinstance(label, str) and label not in configs:
            configs.append(label)
    drafter = header.get("drafter")
    return StoredSimulation(
        study=study,
        model=first.model,
        device=_text(header.get("device") or first.provenance.get("device")),
        drafter=drafter if isinstance(drafter, str) else None,
        acceptance_source=_text(header.get("acceptance_source")),
        step_cost_source=_text(header.get("step_cost_source")),
        workloads=workloads,
        concurrencies=sorted(concurrencies),
        request_rate=rate,
        configs=configs,
        rows=len(trials),
        created_at=first.created_at,
    )


def list_simulations(store: Store, model: str | None = None) -> list[StoredSimulation]:
    """Stored simulations (of `model` if given, matched as stored), newest first."""
    studies: dict[str, list[TrialRecord]] = {}
    for t in store.list_trials(model=model):
        if is_simulation(t):
            studies.setdefault(t.study, []).append(t)
    found = [summarise(name, trials) for name, trials in studies.items()]
    return sorted(found, key=lambda s: (s.created_at, s.study), reverse=True)
