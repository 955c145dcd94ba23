"""A stored simulation (``peagle-tune simulate``) as plot series: tokens/s and TPOT p50 against concurrency."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.report._series._labels import date_text, finite_number, one_line, positive_int, short_name
from store import TrialRecord


@dataclass(frozen=True)
class SimulationData:
    """One stored simulation (``peagle-tune simulate``): predicted tokens/s and TPOT p50 against concurrency, one
    line per config, one row of panels per workload shape. Closed-loop rows only (an open-loop run has no
    concurrency axis)."""

    study: str
    title: str
    caption: str
    model: str
    device: str
    workloads: list[str]
    configs: list[str]
    """Config labels in the order simulated (no speculation first, the per-phase oracle last)."""
    tokens_per_s: dict[tuple[str, str], list[tuple[int, float]]]
    """(workload, config) -> [(concurrency, output tokens/s)], by concurrency."""
    tpot_ms_p50: dict[tuple[str, str], list[tuple[int, float]]]
    """(workload, config) -> [(concurrency, TPOT p50 in ms)]; the oracle has none (computed, not simulated)."""
    kinds: dict[str, str] = field(default_factory=dict)
    """config label -> kind ("none", "static", "schedule", "adaptive", "oracle")."""


SCHEDULE_LINE = "vLLM batch-size schedule"
"""The one line of a simulation's schedule rows (each row's label spells its own schedule)."""


def is_simulation_study(trials: Sequence[TrialRecord]) -> bool:
    """Whether a study's trials are the rows of a stored simulation (backend "simulate") rather than a search."""
    from autotune.simulate import SIMULATE_BACKEND

    return bool(trials) and all(t.backend == SIMULATE_BACKEND for t in trials)


def simulation_data(study: str, trials: Sequence[TrialRecord]) -> tuple[SimulationData | None, str]:
    """A stored simulation's rows as plot series, or (None, why not). Never raises on odd rows: a row without a
    label, workload, concurrency or value is left out."""
    tps: dict[tuple[str, str], list[tuple[int, float]]] = {}
    tpot: dict[tuple[str, str], list[tuple[int, float]]] = {}
    workloads: list[str] = []
    configs: list[str] = []
    kinds: dict[str, str] = {}
    for t in trials:
        label, workload = t.config.get("label"), t.scenario.get("workload")
        c = positive_int(t.scenario.get("concurrency"))
        if not isinstance(label, str) or not isinstance(workload, str) or c is None:
            continue
        if t.config.get("kind") == "schedule":
            label = SCHEDULE_LINE  # its label names the schedule, which changes with max_num_seqs: one line
        value = finite_number(t.values.get("output_tokens_per_s"))
        if value is None:
            continue
        if workload not in workloads:
            workloads.append(workload)
        if label not in configs:
            configs.append(label)
        kinds.setdefault(label, str(t.config.get("kind") or "?"))
        tps.setdefault((workload, label), []).append((c, value))
        latency = finite_number(t.values.get("tpot_ms_p50"))
        if latency is not None:
            tpot.setdefault((workload, label), []).append((c, latency))
    if not tps:
        return None, f"simulation {study} has no closed-loop rows with a tokens/s value (an open-loop run?)"
    first = trials[0]
    header = first.metrics.get("simulation")
    header = header if isinstance(header, dict) else {}
    device = str(header.get("device") or first.provenance.get("device") or "an unknown device")
    drafter = header.get("drafter")
    drafter_text = f", drafter {one_line(drafter)}" if drafter else ""
    caption = (
        f"Simulated serving (peagle-tune simulate; nothing measured): {one_line(first.model)}{drafter_text} on "
        f"{one_line(device)} (GPU assumed). Acceptance: {one_line(header.get('acceptance_source') or '?')}. "
        f"Step cost: {one_line(header.get('step_cost_source') or '?')}. Study {study}, stored "
        f"{date_text(first.created_at)}. TPOT p50 per request; the per-phase oracle is computed from the static "
        "configs' phase times and has no TPOT."
    )
    return SimulationData(
        study=study,
        title=f"Simulated serving: {short_name(first.model)} on {one_line(device)}",
        caption=caption,
        model=first.model,
        device=device,
        workloads=workloads,
        configs=configs,
        tokens_per_s={k: sorted(v) for k, v in tps.items()},
        tpot_ms_p50={k: sorted(v) for k, v in tpot.items()},
        kinds=kinds,
    ), ""
