"""The configuration being tuned: a speculative config (drafter, depth, batch limits) and a scenario (offered load).

Plain frozen dataclasses with `to_dict`/`from_dict` so the store (which knows nothing of these types) keeps them
as JSON.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import ConfigError
from policies import MAX_K  # 16: the deepest K of configs, spaces, profiles and runtime policies alike

Method = Literal["none", "eagle3", "eagle", "draft_model"]
METHODS: tuple[str, ...] = ("none", "eagle3", "eagle", "draft_model")

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_K",
    "MAX_NUM_BATCHED_TOKENS",
    "MAX_NUM_SEQS",
    "MAX_TENSOR_PARALLEL",
    "METHODS",
    "Method",
    "Scenario",
    "SpecConfig",
    "config_label",
]

#: Largest max_num_seqs of a config: 64x vLLM's largest default (1,024 requests per step on H100/H200-class GPUs).
#: vLLM sizes per-sequence buffers by it at start-up; larger values are typos (99999999999999999999 was exported).
MAX_NUM_SEQS = 65_536
#: Largest max_num_batched_tokens: 2^24, 1.6x the longest context window of any released model (10M tokens).
MAX_NUM_BATCHED_TOKENS = 2**24
#: Largest tensor_parallel_size: the GPUs of the largest single node sold today (NVL72 racks aside).
MAX_TENSOR_PARALLEL = 64
#: Most requests a scenario keeps in flight: no engine runs more than `MAX_NUM_SEQS` at once, and each request in
#: flight is a client task with its own connection.
MAX_CONCURRENCY = MAX_NUM_SEQS


@dataclass(frozen=True)
class SpecConfig:
    """One serving configuration: the drafter, its depth and the engine's batch limits."""

    method: Method = "none"
    """Speculative method as vLLM spells it; "none" serves without speculation (the baseline)."""
    drafter: str | None = None
    """Drafter model id or local path (None for the baseline)."""
    num_speculative_tokens: int = 0
    """K, the draft depth: tokens proposed per step per request. 0 for the baseline."""
    parallel_drafting: bool = False
    """Draft all K tokens in one drafter pass (P-EAGLE with eagle3, PARD with draft_model)."""
    drafter_layers: int | None = None
    """Number of layers of the drafter head (informational; it is a property of the drafter checkpoint)."""
    max_num_seqs: int = 64
    """vLLM's max_num_seqs: the most requests in one engine step."""
    max_num_batched_tokens: int | None = None
    """vLLM's max_num_batched_tokens (None: vLLM's default)."""
    tensor_parallel_size: int = 1
    """vLLM's tensor_parallel_size: GPUs the target is split over (left out of `to_dict` at 1)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, but got {self.method!r}.")
        if self.method == "none":
            if self.num_speculative_tokens != 0 or self.parallel_drafting or self.drafter:
                raise ConfigError(
                    "method='none' serves without speculation: it takes no drafter, K=0 and no parallel drafting, "
                    f"but got drafter={self.drafter!r}, K={self.num_speculative_tokens}, "
                    f"parallel_drafting={self.parallel_drafting}."
                )
        else:
            if not self.drafter:
                raise ConfigError(f"method={self.method!r} needs a drafter (model id or path).")
            if not 1 <= self.num_speculative_tokens <= MAX_K:
                raise ConfigError(
                    f"K (num_speculative_tokens) must be in [1, {MAX_K}] for method={self.method!r}, but got "
                    f"K={self.num_speculative_tokens}. Use method 'none' (K=0) for no speculation."
                )
        if not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise ConfigError(f"max_num_seqs must be in [1, {MAX_NUM_SEQS:,}], but got {self.max_num_seqs!r:.40}.")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) or not (
            1 <= self.tensor_parallel_size <= MAX_TENSOR_PARALLEL
        ):
            raise ConfigError(
                f"tensor_parallel_size must be an integer in [1, {MAX_TENSOR_PARALLEL}], but got "
                f"{self.tensor_parallel_size!r:.40}."
            )
        if self.max_num_batched_tokens is not None and not 1 <= self.max_num_batched_tokens <= MAX_NUM_BATCHED_TOKENS:
            raise ConfigError(
                f"max_num_batched_tokens must be in [1, {MAX_NUM_BATCHED_TOKENS:,}], but got "
                f"{self.max_num_batched_tokens!r:.40}."
            )

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    @property
    def speculative(self) -> bool:
        return self.method != "none"

    def label(self, *, layers: bool = True) -> str:
        """Short human label, e.g. ``eagle3+pd K=5 (4L) seqs=64`` (without the drafter's layer count when `layers` is
        False, e.g. in narrow table cells). The one way configs are named to people; see also `config_label`."""
        tp = f" tp={self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        if not self.speculative:
            return f"no-spec seqs={self.max_num_seqs}{tp}"
        pd = "+pd" if self.parallel_drafting else ""
        depth = f" ({self.drafter_layers}L)" if layers and self.drafter_layers else ""
        return f"{self.method}{pd} K={self.k}{depth} seqs={self.max_num_seqs}{tp}"

    def speculative_config(self) -> dict[str, Any] | None:
        """The dict vLLM takes as ``--speculative-config`` or ``LLM(speculative_config=...)``; None: no speculation."""
        if not self.speculative:
            return None
        out: dict[str, Any] = {
            "method": self.method,
            "model": self.drafter,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.parallel_drafting:
            out["parallel_drafting"] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.tensor_parallel_size == 1:  # stored configs and study keys of one-GPU runs stay as they were
            del out["tensor_parallel_size"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"Unknown config keys {sorted(unknown)}; known keys are {sorted(known)}.")
        return cls(**data)

    def with_(self, **changes: Any) -> SpecConfig:
        return dataclasses.replace(self, **changes)


def config_label(data: Mapping[str, Any], *, layers: bool = True) -> str:
    """`SpecConfig.label` of a stored config dict (as `SpecConfig.to_dict` wrote it); the dict itself as text when it
    is not a valid config (e.g. written by another version)."""
    try:
        return SpecConfig.from_dict(dict(data)).label(layers=layers)
    except (ConfigError, TypeError):
        return str(data)


@dataclass(frozen=True)
class Scenario:
    """How load is offered: a fixed concurrency (closed loop) or a request rate (open loop)."""

    concurrency: int = 1
    """Requests in flight at once (closed loop); also the batch size the engine sees in steady state."""
    request_rate: float | None = None
    """Requests per second (open loop, serve mode); None means closed loop at `concurrency`."""
    num_prompts: int | None = None
    """Prompts to send in the measured phase (None: the backend's default)."""

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"concurrency must be in [1, {MAX_CONCURRENCY:,}], but got {self.concurrency!r:.40}.")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise ConfigError(f"request_rate must be a number of requests/s > 0, but got {self.request_rate}.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        return cls(**data)
