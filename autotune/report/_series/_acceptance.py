"""Acceptance per draft position and AL(K): measured from a stored profile, or predicted from a drafter's published
acceptance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.errors import PeagleError
from autotune.report._series._labels import CONFIDENCE, measured_caption, one_line, profile_label, short_name
from autotune.spec import MAX_K
from policies import AcceptanceProfile
from store import ProfileRecord


@dataclass(frozen=True)
class ClassAcceptance:
    """Acceptance of one workload class: survival per draft position and AL(K), with 95% intervals."""

    name: str
    num_drafts: int
    """Drafts measured (0 for curves predicted from a published figure)."""
    survival: list[float]
    """``survival[i]`` = P(first i+1 drafts accepted), positions 1..len."""
    survival_low: list[float]
    survival_high: list[float]
    acceptance_length: list[float]
    """``[AL(0), ..., AL(max_k)]`` in tokens per request per step (bonus token included)."""
    al_low: list[float]
    al_high: list[float]
    references: list[tuple[int, float, str]] = field(default_factory=list)
    """Published points (K, AL, label) from the drafter catalog."""


@dataclass(frozen=True)
class AcceptanceData:
    title: str
    caption: str
    measured: bool
    classes: list[ClassAcceptance]
    max_k: int
    reference_note: str = ""
    """Where the published points come from (shown under the figure)."""


def published_references(drafter_name: str | None, model: str) -> tuple[dict[str, Any], str, int | None]:
    """The catalog's published acceptance of a drafter: ({dataset: ref}, note, recommended K)."""
    if not drafter_name:
        return {}, "", None
    try:
        from autotune.catalogs import get_drafter

        spec = get_drafter(drafter_name, target=model)
    except (PeagleError, ValueError):
        return {}, "", None
    refs = dict(spec.reference_acceptance)
    note = ""
    if refs:
        first = next(iter(refs.values()))
        note = f"Stars: {one_line(first['source'])}"
    return refs, note, spec.recommended_k


def _class_refs(cls: str, refs: dict[str, Any]) -> list[tuple[int, float, str]]:
    from autotune.workloads import REFERENCE_FOR_CLASS

    dataset = cls if cls in refs else REFERENCE_FOR_CLASS.get(cls)
    if dataset is None or dataset not in refs:
        return []
    ref = refs[dataset]
    return [(int(ref["k"]), float(ref["acceptance_length"]), f"published {dataset}")]


def _class_acceptance(
    name: str, profile: AcceptanceProfile, max_k: int, measured: bool, refs: list[tuple[int, float, str]]
) -> ClassAcceptance:
    survival = profile.survival().tolist()
    lows, highs = [], []
    for i in range(profile.max_k):
        lo, hi = profile.survival_interval(i, CONFIDENCE)
        lows.append(lo)
        highs.append(hi)
    als = profile.acceptance_lengths(max_k).tolist()
    al_lo, al_hi = [], []
    for k in range(max_k + 1):
        lo, hi = profile.acceptance_length_interval(k, CONFIDENCE)
        al_lo.append(lo)
        al_hi.append(hi)
    return ClassAcceptance(
        name=name,
        num_drafts=profile.num_drafts if measured else 0,
        survival=survival,
        survival_low=lows,
        survival_high=highs,
        acceptance_length=als,
        al_low=al_lo,
        al_high=al_hi,
        references=refs,
    )


def profile_acceptances(profile: ProfileRecord) -> tuple[dict[str, AcceptanceProfile], list[str]]:
    """Per-class `AcceptanceProfile`s of a stored profile, and notes on the classes that had to be skipped."""
    out: dict[str, AcceptanceProfile] = {}
    notes: list[str] = []
    for cls, entry in sorted(profile.acceptance.items()):
        counts = list(entry.get("accepted_per_position") or [])
        try:
            out[cls] = AcceptanceProfile(int(entry.get("num_drafts", 0)), tuple(counts))
        except ValueError as exc:
            notes.append(f"{profile_label(profile)}: class {cls!r} skipped ({exc})")
    return out, notes


def acceptance_from_profile(profile: ProfileRecord) -> tuple[AcceptanceData | None, list[str]]:
    """Measured acceptance per class and position (with 95% Clopper-Pearson intervals) and AL(K) for K <= max_k."""
    per_class, notes = profile_acceptances(profile)
    if not per_class:
        return None, notes + [f"{profile_label(profile)} holds no usable acceptance counts."]
    refs, ref_note, _ = published_references(profile.drafter, profile.model)
    max_k = max(p.max_k for p in per_class.values())
    classes = [
        _class_acceptance(cls, p, p.max_k, True, _class_refs(cls, refs)) for cls, p in per_class.items()
    ]
    title = f"{short_name(profile.model)} / {short_name(profile.drafter)} on {profile.workload_name or '?'}"
    return (
        AcceptanceData(
            title=title,
            caption=measured_caption(profile),
            measured=True,
            classes=classes,
            max_k=max_k,
            reference_note=ref_note,
        ),
        notes,
    )


def acceptance_from_catalog(model: str, drafter: str, max_k: int | None = None) -> AcceptanceData | None:
    """AL(K) predicted from the drafter's published acceptance (one curve per published benchmark).

    Each curve is the constant-rate fit through the published point (`AcceptanceProfile.from_acceptance_length`),
    the same acceptance the model backend predicts with when no profile exists.
    """
    from autotune.catalogs import get_drafter
    from autotune.workloads import REFERENCE_FOR_CLASS

    try:
        spec = get_drafter(drafter, target=model)
    except (PeagleError, ValueError):
        return None
    refs = dict(spec.reference_acceptance)
    if not refs:
        return None
    depth = max_k or spec.trained_k or 8
    depth = max(1, min(depth, MAX_K))
    class_of = {dataset: cls for cls, dataset in REFERENCE_FOR_CLASS.items()}
    classes = []
    for dataset, ref in refs.items():
        prof = AcceptanceProfile.from_acceptance_length(float(ref["acceptance_length"]), int(ref["k"]), max_k=depth)
        name = f"{dataset} ({class_of[dataset]})" if dataset in class_of else dataset
        point = [(int(ref["k"]), float(ref["acceptance_length"]), f"published {dataset}")]
        classes.append(_class_acceptance(name, prof, depth, False, point))
    first = next(iter(refs.values()))
    return AcceptanceData(
        title=f"{short_name(model)} / {short_name(spec.name)}: published acceptance",
        caption=(
            f"Predicted: no measured profile; curves are the constant-rate fit through each published AL "
            f"(the acceptance the model backend uses). Stars: {one_line(first['source'])}"
        ),
        measured=False,
        classes=classes,
        max_k=depth,
    )
