"""`ProfileResult`: the profile of one drafter from one engine launch, and how it is stored."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.measurement import FailureKind, Provenance
from autotune.profiling._analysis import step_cost_entries
from autotune.workloads import Workload
from policies import AcceptanceProfile, StepCostModel, StepSample
from policies.plugin import DepthPlan

_STORE_ENV_KEYS = ("device", "gpu_count", "driver", "vllm_version", "torch_version")


ProfileFailureKind = FailureKind | Literal["counts_mismatch"]
"""An engine failure, or ``counts_mismatch``: the launch ran but the plugin's counters miss some of vLLM's."""


@dataclass
class ProfileResult:
    """The profile of one drafter on one workload, from one engine launch. Every figure is measured except
    ``cost_model`` (a least-squares fit; ``fit_error`` says how well it reproduces the measured samples)."""

    model: str
    drafter: str
    method: str
    parallel_drafting: bool
    max_k: int
    concurrencies: tuple[int, ...]
    provenance: Provenance
    drafter_layers: int | None = None
    ok: bool = True
    failure_kind: ProfileFailureKind | None = None
    failure_reason: str | None = None
    log_tail: str | None = None
    acceptance: dict[str, AcceptanceProfile] = field(default_factory=dict)
    """Per workload class, counts at full depth K_max (measured)."""
    step_samples: list[StepSample] = field(default_factory=list)
    """Median decode-step time per (batch size, verified depth), ms (measured)."""
    cost_model: StepCostModel | None = None
    fit_error: dict[str, float] | None = None
    metrics_check: dict[str, Any] | None = None
    """The plugin's counters against vLLM's ``vllm:spec_decode_*`` deltas over the measured phases."""
    phases: list[dict[str, Any]] = field(default_factory=list)
    """Per concurrency: requests, output tokens, wall s, tokens/s (measured while the depth plan ran, so it is not
    the throughput of any single K)."""
    plan: DepthPlan | None = None
    engine_launches: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    workload_name: str = ""
    workload_hash: str = ""
    plugin: dict[str, Any] = field(default_factory=dict)
    """What the plugin reported about the engine (K, method, drafting-depth lowering) and its own overhead."""
    baseline_samples: list[StepSample] = field(default_factory=list)
    """Step times of the shared no-speculation launch (``profile(baseline=True)``; drafter_ran=False), measured.
    They are in the cost-model fit and the stored step costs, so T(B, 0) without a drafter is identified."""
    step_means: list[StepSample] = field(default_factory=list)
    """``step_samples``' shapes at their *mean* step time (summed ms / steps), measured: what a run pays per step
    (step times have a tail, so the mean is above the median). Not in ``cost_model`` (a fit on the medians); the
    simulator prices steps with the model refitted on these and ``baseline_means`` (stored in the profile's notes,
    ``step_means``: `step_means_entry`). Empty: not recorded (analysed by a version that did not record them)."""
    baseline_means: list[StepSample] = field(default_factory=list)
    """``baseline_samples``' shapes at their mean step time, measured (empty without a baseline launch)."""
    prompt_steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The launches' steps with prompt tokens, summed per phase (`policies.plugin.PluginStats.prompt_steps`):
    {"speculative": [...], "baseline": [...]}, measured; not in ``cost_model`` (decode steps only). The simulator
    prices a prompt token with them (`autotune.simulate.prompt_token_costs`; stored in the notes, ``prompt_steps``).
    Empty: not recorded (analysed by a version that did not record them)."""
    warmup: list[dict[str, Any]] = field(default_factory=list)
    """The warm-up the launch ran before its measured phases (`autotune.profiling.plan_warmup`), per batch size:
    requests, output tokens, engine steps, wall s (measured; in no other figure)."""
    first_phase_outliers: list[dict[str, Any]] = field(default_factory=list)
    """First measured phases slower than the later ones at their concurrency (`first_phase_outliers`): a first use
    the warm-up did not take out of the figures. Empty: none, or too few phases to judge."""
    profile_id: int | None = None
    """Id in the store (None when not stored)."""
    outputs: dict[str, list[list[int]]] | None = None

    def acceptance_lengths(self) -> dict[str, list[float]]:
        """Per class ``[AL(0), ..., AL(K_max)]`` in tokens per request per step (measured, via prefix consistency)."""
        return {c: [float(x) for x in p.acceptance_lengths(self.max_k)] for c, p in self.acceptance.items()}

    def step_table(self) -> dict[tuple[int, int], StepSample]:
        """{(batch size, depth): sample}."""
        return {(s.batch_size, s.depth): s for s in self.step_samples}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "drafter": self.drafter,
            "method": self.method,
            "parallel_drafting": self.parallel_drafting,
            "drafter_layers": self.drafter_layers,
            "max_k": self.max_k,
            "concurrencies": list(self.concurrencies),
            "ok": self.ok,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
            "provenance": self.provenance.to_dict(),
            "acceptance": {c: p.to_dict() for c, p in self.acceptance.items()},
            "acceptance_lengths": self.acceptance_lengths(),
            "acceptance_intervals_95": {
                c: [list(p.survival_interval(i)) for i in range(p.max_k)] for c, p in self.acceptance.items()
            },
            "step_samples": step_cost_entries(self.step_samples),
            "baseline_samples": step_cost_entries(self.baseline_samples),
            "step_means": step_means_entry(self),
            "prompt_steps": self.prompt_steps or None,
            "cost_model": None if self.cost_model is None else self.cost_model.to_dict(),
            "fit_error": self.fit_error,
            "metrics_check": self.metrics_check,
            "phases": self.phases,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "engine_launches": self.engine_launches,
            "timings": self.timings,
            "workload_name": self.workload_name,
            "workload_hash": self.workload_hash,
            "plugin": self.plugin,
            "warmup": self.warmup,
            "first_phase_outliers": self.first_phase_outliers,
            "profile_id": self.profile_id,
        }



def step_means_entry(result: ProfileResult) -> dict[str, Any] | None:
    """The profile's per-shape mean step times as stored (``notes["step_means"]`` of a stored profile, ``step_means``
    of `ProfileResult.to_dict`): ``{"speculative": [...], "baseline": [...]}`` in the ``step_costs`` form, ms
    (measured); None when the profile recorded none."""
    if not result.step_means:
        return None
    return {"speculative": step_cost_entries(result.step_means), "baseline": step_cost_entries(result.baseline_means)}


def store_profile(store: Any, result: ProfileResult, workload: Workload, environment: Mapping[str, Any]) -> int:
    """Store a successful profile with its environment and workload; returns the profile id."""
    env_id = store.environment_id({k: environment[k] for k in _STORE_ENV_KEYS})
    workload_id = store.workload_id(
        workload.name, content_hash=workload.content_hash(), classes=workload.class_names, source=workload.source
    )
    notes = {
        "engine_launches": result.engine_launches,
        "baseline_launch": bool(result.baseline_samples),
        "concurrencies": list(result.concurrencies),
        "plan": None if result.plan is None else result.plan.to_dict(),
        "acceptance_source": "scheduler plugin, requests that verified K_max drafts",
        "metrics_check": result.metrics_check,
        "fit_error": result.fit_error,
        "phases": result.phases,
        "timings": result.timings,
        "warmup": result.warmup,
        "first_phase_outliers": result.first_phase_outliers,
        "plugin": result.plugin,
        "provenance": result.provenance.to_dict(),
        "step_time": "schedule() entry to Scheduler.update_from_output() return, decode-only steps, median ms; "
        "the drafter ran in every step (depth applied by trimming)",
    }
    means = step_means_entry(result)
    if means is not None:
        notes["step_means"] = means
    if result.prompt_steps:
        notes["prompt_steps"] = result.prompt_steps
    return int(
        store.add_profile(
            result.model,
            method=result.method,
            max_k=result.max_k,
            environment_id=env_id,
            acceptance={c: p.to_dict() for c, p in result.acceptance.items()},
            step_costs=step_cost_entries(result.step_samples + result.baseline_samples),
            drafter=result.drafter,
            drafter_layers=result.drafter_layers,
            parallel_drafting=result.parallel_drafting,
            workload_id=workload_id,
            cost_model=None if result.cost_model is None else result.cost_model.to_dict(),
            kind="measured",
            notes=notes,
        )
    )
