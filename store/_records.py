"""Frozen records the store returns. Never live ORM objects: a record stays valid after its session closes.

JSON fields are plain dicts/lists (copies of what the database holds); `to_dict()` gives a JSON-ready dict with
timestamps as ISO-8601 UTC strings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any


def _to_plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready dict (datetimes as ISO-8601 strings, tuples as lists)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class EnvironmentRecord(_Record):
    """Hardware and software a profile was measured on."""

    id: int
    device: str
    """The GPU name (e.g. "NVIDIA H200"), or "cpu"."""
    gpu_count: int
    driver: str | None
    vllm_version: str | None
    torch_version: str | None
    created_at: dt.datetime


@dataclass(frozen=True)
class ModelRecord(_Record):
    id: int
    name: str
    hf_id: str | None
    info: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True)
class DrafterRecord(_Record):
    id: int
    name: str
    target: str
    """Name of the target model the drafter serves."""
    method: str
    layers: int | None
    info: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True)
class WorkloadRecord(_Record):
    id: int
    name: str
    content_hash: str
    classes: list[str]
    source: str
    created_at: dt.datetime


@dataclass(frozen=True)
class ProfileRecord(_Record):
    """A measured (or live) acceptance profile and step-cost table, with its environment and workload flattened."""

    id: int
    model: str
    drafter: str | None
    drafter_layers: int | None
    method: str
    parallel_drafting: bool
    max_k: int
    """Depth the profile was measured at; acceptance is known for every K <= max_k (prefix consistency)."""
    acceptance: dict[str, dict[str, Any]]
    """{class: {"num_drafts": int, "accepted_per_position": [int, ...]}} (measured counts, not rates)."""
    step_costs: list[dict[str, Any]]
    """[{"batch_size": B, "depth": K, "step_ms": measured mean engine step time in ms, "n": steps averaged}]."""
    cost_model: dict[str, Any] | None
    """Fitted step-cost model parameters (predicted T(B, K)), or None."""
    kind: str
    """Either "measured" (offline profiling run) or "live" (collected while serving)."""
    notes: dict[str, Any]
    environment_id: int
    device: str
    gpu_count: int
    driver: str | None
    vllm_version: str | None
    torch_version: str | None
    workload_id: int | None
    workload_name: str | None
    workload_hash: str | None
    created_at: dt.datetime


@dataclass(frozen=True)
class TrialRecord(_Record):
    """One evaluated configuration of a search study."""

    id: int
    study: str
    number: int
    model: str
    config: dict[str, Any]
    scenario: dict[str, Any]
    values: dict[str, float]
    """Objective values, e.g. {"throughput": 812.5} in the objective's unit (tokens/s, ms)."""
    metrics: dict[str, Any]
    status: str
    """One of "complete", "failed", "pruned", "running"."""
    failure_reason: str | None
    backend: str
    """Either "vllm" (measured) or "model" (predicted)."""
    provenance: dict[str, Any]
    created_at: dt.datetime


@dataclass(frozen=True)
class RecommendationRecord(_Record):
    """The configuration a search recommends, with what it was tuned for."""

    id: int
    model: str
    gpu: str
    """GPU name or "cpu" the recommendation is for (the environment's device)."""
    vllm_version: str | None
    torch_version: str | None
    """From the provenance dict (None if it has none)."""
    workload_name: str | None
    workload_hash: str | None
    objective: str
    scenario: dict[str, Any]
    best_config: dict[str, Any]
    metrics: dict[str, Any]
    provenance: dict[str, Any]
    pareto: list[Any]
    schedule: list[Any]
    """Batch-size -> K schedule (vLLM's num_speculative_tokens_per_batch_size), as stored by the caller."""
    class_policy: dict[str, Any]
    study: str | None
    created_at: dt.datetime

    @property
    def device(self) -> str:
        """Alias of `gpu`, named like the profile's environment field."""
        return self.gpu


@dataclass(frozen=True)
class StudySummary(_Record):
    """Counts and best values of one study, computed from the store's trials table (not from Optuna's)."""

    study: str
    models: tuple[str, ...]
    n_trials: int
    n_complete: int
    n_failed: int
    n_pruned: int
    n_running: int
    best_values: dict[str, float]
    """Best value over complete trials of each objective the caller gave a direction (max or min per it)."""
    best_trial_numbers: dict[str, int]
    """Trial number that reached `best_values[objective]` (the earliest one on ties)."""
    first_created_at: dt.datetime
    last_created_at: dt.datetime


@dataclass(frozen=True)
class BenchmarkRecord(_Record):
    """A recommendation served as it will be and measured by vLLM's ``vllm bench serve`` (`peagle-tune bench`)."""

    id: int
    recommendation_id: int
    mode: str
    """Either "static" (plain ``vllm serve`` with the exported arguments) or "adaptive" (``peagle-tune serve``)."""
    concurrency: int
    """``--max-concurrency`` of the benchmark: the recommendation's concurrency."""
    num_prompts: int
    figures: dict[str, Any]
    """Measured by ``vllm bench serve``: {"output_tokens_per_s": tokens/s, "tpot_ms_p50": ms, ...}."""
    provenance: dict[str, Any]
    """{"kind": "measured", "backend": "vllm bench serve", "device", "vllm_version", "torch_version", "date"}."""
    commands: dict[str, Any]
    """{"serve": [argv of the server], "bench": [argv of vllm bench serve]}."""
    created_at: dt.datetime
