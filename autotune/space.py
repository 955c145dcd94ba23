"""The search space: drafter (with its layer count), K, parallel drafting, max_num_seqs.

Conditional, define-by-run: the baseline (no speculation) has no K, and drafters without a mask token have no
parallel-drafting choice.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config import MAX_K, SpecConfig
from autotune.exceptions import ConfigError

if TYPE_CHECKING:
    import optuna

NO_SPEC = "none"


@dataclass(frozen=True)
class DrafterChoice:
    """A drafter the search may pick."""

    name: str
    """Model id or local path, as vLLM takes it in the speculative config's ``model``."""
    method: str
    """``eagle3`` (EAGLE-3 / P-EAGLE heads) or ``draft_model`` (a small LM, PARD with parallel drafting)."""
    layers: int | None
    parallel_capable: bool
    """The checkpoint carries a mask token (pard_token / mask_token_id / ptd_token_id)."""
    recommended_k: int | None = None
    """The K its publisher serves (the baseline every recommendation is compared against)."""


@dataclass(frozen=True)
class SearchSpace:
    drafters: tuple[DrafterChoice, ...]
    k_max: int = 8
    k_min: int = 1
    max_num_seqs: tuple[int, ...] = (64,)
    parallel_drafting: str = "auto"
    """``auto``: try both where the drafter supports it; ``on``: only parallel; ``off``: only sequential."""
    max_num_batched_tokens: tuple[int | None, ...] = (None,)
    include_baseline: bool = True
    names: dict[str, DrafterChoice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.k_min <= self.k_max <= MAX_K:
            raise ConfigError(
                f"K range must satisfy 1 <= k_min <= k_max <= {MAX_K}, but got k_min={self.k_min}, "
                f"k_max={self.k_max}. Pass e.g. --max-k 8."
            )
        if self.parallel_drafting not in ("auto", "on", "off"):
            raise ConfigError(f"parallel_drafting must be auto, on or off, but got {self.parallel_drafting!r}.")
        if not self.max_num_seqs or any(s < 1 for s in self.max_num_seqs):
            raise ConfigError(f"max_num_seqs choices must be positive integers, but got {list(self.max_num_seqs)}.")
        if self.parallel_drafting == "on":
            lacking = [d.name for d in self.drafters if not d.parallel_capable]
            if lacking:
                raise ConfigError(
                    f"Parallel drafting was required but drafters {lacking} have no mask token in config.json "
                    "(vLLM reads `pard_token`, `mask_token_id` or `ptd_token_id`). Drop them or use "
                    "--parallel-drafting auto."
                )
        object.__setattr__(self, "names", {d.name: d for d in self.drafters})

    def _pd_options(self, drafter: DrafterChoice) -> list[bool]:
        if not drafter.parallel_capable or self.parallel_drafting == "off":
            return [False]
        if self.parallel_drafting == "on":
            return [True]
        return [True, False]

    def suggest(self, trial: optuna.trial.BaseTrial) -> SpecConfig:
        """Sample a config in an Optuna trial (define-by-run, conditional parameters)."""
        choices = ([NO_SPEC] if self.include_baseline else []) + [d.name for d in self.drafters]
        name = trial.suggest_categorical("drafter", choices)
        seqs = trial.suggest_categorical("max_num_seqs", list(self.max_num_seqs))
        mnbt: int | None = self.max_num_batched_tokens[0]
        if len(self.max_num_batched_tokens) > 1:
            picked = trial.suggest_categorical("max_num_batched_tokens", list(self.max_num_batched_tokens))
            mnbt = None if picked is None else int(picked)
        if name == NO_SPEC:
            return SpecConfig(max_num_seqs=int(seqs), max_num_batched_tokens=mnbt)
        drafter = self.names[str(name)]
        k = trial.suggest_int("k", self.k_min, self.k_max)
        pd_options = self._pd_options(drafter)
        pd = pd_options[0] if len(pd_options) == 1 else trial.suggest_categorical("parallel_drafting", pd_options)
        return self.config(drafter, k, bool(pd), int(seqs), mnbt)

    def config(
        self, drafter: DrafterChoice, k: int, parallel: bool, seqs: int, mnbt: int | None = None
    ) -> SpecConfig:
        return SpecConfig(
            method=drafter.method,  # type: ignore[arg-type]
            drafter=drafter.name,
            num_speculative_tokens=k,
            parallel_drafting=parallel,
            drafter_layers=drafter.layers,
            max_num_seqs=seqs,
            max_num_batched_tokens=mnbt,
        )

    def params_of(self, config: SpecConfig) -> dict[str, Any]:
        """Optuna parameters that make `suggest` return `config` (for ``study.enqueue_trial``)."""
        params: dict[str, Any] = {"max_num_seqs": config.max_num_seqs}
        if len(self.max_num_batched_tokens) > 1:
            params["max_num_batched_tokens"] = config.max_num_batched_tokens
        if not config.speculative:
            params["drafter"] = NO_SPEC
            return params
        assert config.drafter is not None
        params.update(drafter=config.drafter, k=config.k)
        if len(self._pd_options(self.names[config.drafter])) > 1:
            params["parallel_drafting"] = config.parallel_drafting
        return params

    def grid(self) -> list[SpecConfig]:
        """Every config of the space, baseline first."""
        out: list[SpecConfig] = []
        for seqs, mnbt in itertools.product(self.max_num_seqs, self.max_num_batched_tokens):
            if self.include_baseline:
                out.append(SpecConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt))
            for d in self.drafters:
                for pd in self._pd_options(d):
                    for k in range(self.k_min, self.k_max + 1):
                        out.append(self.config(d, k, pd, seqs, mnbt))
        return out

    def baselines(self, seqs: Sequence[int] | None = None) -> list[SpecConfig]:
        """No speculation, and each drafter at its publisher's K (clipped to the space), per max_num_seqs."""
        out: list[SpecConfig] = []
        for s in seqs or self.max_num_seqs:
            mnbt = self.max_num_batched_tokens[0]
            if self.include_baseline:
                out.append(SpecConfig(max_num_seqs=s, max_num_batched_tokens=mnbt))
            for d in self.drafters:
                if d.recommended_k:
                    k = min(max(d.recommended_k, self.k_min), self.k_max)
                    pd = self._pd_options(d)[0]
                    out.append(self.config(d, k, pd, s, mnbt))
        return out
