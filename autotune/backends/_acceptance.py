"""Acceptance of a workload: each class's AL(K) curve (measured, or the drafter's published acceptance) and the
token weights that mix them into the workload's AL(K)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.backends._shape import WorkloadShape
from autotune.catalogs import DrafterSpec, reference_survival
from autotune.errors import ConfigError
from autotune.spec import MAX_K
from autotune.workloads import REFERENCE_FOR_CLASS
from policies import AcceptanceProfile

__all__ = ["WorkloadAcceptance", "workload_acceptance"]


@dataclass
class WorkloadAcceptance:
    """AL(K) of a workload: per-class profiles, their sources, and the token weights used to mix them."""

    profiles: dict[str, AcceptanceProfile]
    sources: dict[str, str]
    token_weights: dict[str, float]
    warnings: list[str] = field(default_factory=list)

    def by_class(self, k: int) -> dict[str, float]:
        return {c: p.acceptance_length(k) for c, p in self.profiles.items()}

    def length(self, k: int) -> float:
        """Mixed AL(K): total output tokens / total request-steps.

        A class c with token share w_c needs w_c / AL_c(K) request-steps per output token, so
        ``AL = sum_c w_c / sum_c (w_c / AL_c)`` -- the token-weighted harmonic mean. It equals averaging the
        survival curves with weights = each class's share of drafts (`policies.mix`): a class that accepts more
        finishes its requests in fewer steps and so holds fewer batch slots.
        Example: chat AL 2 and code AL 4 with equal tokens -> 2 / (1/2 + 1/4) = 2.67, not 3.
        """
        if k == 0:
            return 1.0
        als = self.by_class(k)
        total = sum(self.token_weights.values())
        return total / sum(w / als[c] for c, w in self.token_weights.items())

    def label(self) -> str:
        return ", ".join(sorted(set(self.sources.values())))


def workload_acceptance(
    drafter: DrafterSpec,
    shape: WorkloadShape,
    measured: Mapping[str, AcceptanceProfile],
    measured_drafter: str | None,
    measured_label: str,
) -> WorkloadAcceptance:
    """AL(K) of `drafter` on a workload of `shape`: per class, the `measured` profile when it covers the class and
    was measured with this drafter (`measured_drafter` None: with any), else the catalog's published acceptance
    (the nearest published workload when the class has none, with a warning). Raises ConfigError when neither
    exists."""
    use_override = bool(measured) and (
        measured_drafter is None or measured_drafter in (drafter.name, drafter.local_path)
    )
    refs = drafter.reference_acceptance
    profiles: dict[str, AcceptanceProfile] = {}
    sources: dict[str, str] = {}
    warnings: list[str] = []
    for cls in shape.requests_by_class:
        if use_override and cls in measured:
            profiles[cls] = measured[cls]
            sources[cls] = measured_label
            continue
        dataset = cls if cls in refs else REFERENCE_FOR_CLASS.get(cls)
        if dataset not in refs:
            if not refs:
                raise ConfigError(
                    f"drafter {drafter.name} has no published acceptance (catalog reference_acceptance is "
                    f"empty) and no measured profile covers class {cls!r}, so its speedup cannot be "
                    "predicted. Profile it with the vllm backend, or pass a measured profile "
                    "(ModelBackend(acceptance={...}))."
                )
            # Unknown class: the lowest published acceptance (open chat, usually) is the cautious guess.
            dataset = min(refs, key=lambda d: refs[d]["acceptance_length"] / (refs[d]["k"] + 1))
            warnings.append(
                f"class {cls!r} maps to no reference benchmark ({dict(REFERENCE_FOR_CLASS)}); assumed "
                f"{dataset}, the drafter's lowest published acceptance."
            )
        ref = refs[str(dataset)]
        profiles[cls] = AcceptanceProfile.from_survival(reference_survival(ref, MAX_K), num_drafts=100_000)
        sources[cls] = f"published:{dataset}@K={ref['k']}"
        if "nearest" in ref:
            sources[cls] = f"published:{ref['nearest']}@K={ref['k']} in place of {dataset}"
            warnings.append(
                f"{drafter.name} has no published acceptance on {dataset}; the nearest published workload, "
                f"{ref['nearest']}, is used."
            )
    total = sum(shape.requests_by_class.values())
    weights = {c: n / total * shape.output_tokens_by_class[c] for c, n in shape.requests_by_class.items()}
    return WorkloadAcceptance(profiles, sources, weights, warnings)
