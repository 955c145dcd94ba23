"""What a backend returns: a measurement (or prediction) of one config under one scenario, with its provenance.

Plain frozen dataclasses with `to_dict`/`from_dict` so the store (which knows nothing of these types) keeps them
as JSON.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.spec import Scenario, SpecConfig


@dataclass(frozen=True)
class Provenance:
    """Where a figure comes from. Every number the tool shows carries one."""

    kind: Literal["measured", "predicted"]
    backend: str
    """"vllm" or "model"."""
    device: str
    """GPU name (e.g. "NVIDIA H200") or "cpu"; for predictions, the GPU assumed."""
    vllm_version: str | None = None
    torch_version: str | None = None
    profile: str | None = None
    """For predictions: which acceptance profile/cost model was used (e.g. "published:mt-bench" or "profile#3")."""
    date: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    model_runner: str | None = None
    """For measurements: vLLM's model runner, "v1" or "v2" (`autotune.engine.predict_variant`); None: not recorded
    (rows stored before it was)."""
    cudagraph_mode: str | None = None
    """For measurements: vLLM's CUDA-graph mode (NONE, PIECEWISE, FULL_AND_PIECEWISE, ...); None: not recorded."""
    async_scheduling: bool | None = None
    """For measurements: whether vLLM scheduled asynchronously; None: not recorded."""
    tensor_parallel_size: int | None = None
    """GPUs the target was split over (measured: vLLM's tensor_parallel_size; predicted: the GPUs assumed); None:
    one, or not recorded."""
    deployment: str | None = None
    """For measurements: the deployment the figure was measured in, named after the command that serves that way,
    with its scheduling and model runner (`autotune.engine.deployment`): "vllm serve (async, V2)" for a plain launch,
    "peagle-tune serve (sync, V1)" for one with the scheduler plugin. None: not recorded (rows stored before it was)."""

    def describe(self) -> str:
        if self.kind == "measured":
            tp = f", tensor parallel {self.tensor_parallel_size}" if (self.tensor_parallel_size or 1) > 1 else ""
            if self.deployment:
                return f"measured on {self.device} in {self.deployment} (vLLM {self.vllm_version}{tp}, " \
                    f"{self.date[:10]})"
            runner = f", {self.model_runner.upper()} model runner" if self.model_runner else ""
            return f"measured on {self.device} (vLLM {self.vllm_version}{runner}{tp}, {self.date[:10]})"
        return f"predicted by the {self.backend} backend for {self.device} from {self.profile}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        return cls(**data)


@dataclass
class SpecCounters:
    """Speculative-decoding counters over a measured phase (deltas of vLLM's cumulative metrics)."""

    num_drafts: int = 0
    """Draft proposals (one per request per step that speculated)."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """accepted_per_position[i]: drafts whose token at position i+1 was accepted."""

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per step per request, including the bonus token: ``1 + accepted / drafts``."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecCounters:
        return cls(**data)


FailureKind = Literal["invalid_config", "out_of_memory", "engine_died", "timeout", "stalled"]


@dataclass
class Measurement:
    """The result of running (or predicting) one config on one workload at one scenario."""

    config: SpecConfig
    scenario: Scenario
    provenance: Provenance
    ok: bool = True
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    """One-line reason a user can act on; `log_tail` has the engine's last lines."""
    log_tail: str | None = None
    output_tokens_per_s: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    speedup_vs_no_spec: float | None = None
    """Predicted backends fill this; measured ones leave it to the caller who has the baseline."""
    spec: SpecCounters | None = None
    spec_per_class: dict[str, SpecCounters] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(
        cls,
        config: SpecConfig,
        scenario: Scenario,
        provenance: Provenance,
        kind: FailureKind,
        reason: str,
        log_tail: str | None = None,
    ) -> Measurement:
        return cls(
            config=config,
            scenario=scenario,
            provenance=provenance,
            ok=False,
            failure_kind=kind,
            failure_reason=reason,
            log_tail=log_tail,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        data = dict(data)
        data["config"] = SpecConfig.from_dict(data["config"])
        data["scenario"] = Scenario.from_dict(data["scenario"])
        data["provenance"] = Provenance.from_dict(data["provenance"])
        if data.get("spec") is not None:
            data["spec"] = SpecCounters.from_dict(data["spec"])
        data["spec_per_class"] = {k: SpecCounters.from_dict(v) for k, v in data.get("spec_per_class", {}).items()}
        return cls(**data)
