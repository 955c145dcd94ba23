"""Live acceptance and step times from a serving plugin's statistics: the live profile and drift detection.

Live acceptance per class (measured). While serving, requests verify different depths (the controller picks them),
so position i is judged only on drafts that verified more than i tokens. The survival curve is the product of the
per-position conditional rates (a Kaplan-Meier estimate with the verified depth as the censoring point)::

    c_i = (drafts with position i accepted) / (drafts that verified position i with positions < i accepted)
    s_i = c_0 * c_1 * ... * c_i

which equals the plain ratio ``accepted_i / drafts`` when every draft verified the same depth. The stored profile
keeps ``num_drafts`` = drafts that verified >= 1 token and ``accepted_per_position[i] = round(s_i * num_drafts)``,
up to the deepest position with at least one judged draft.

Drift. Live AL at the served (static) K is compared with the reference the server was started with (the profile's
AL per class, else the recommendation's overall AL); a relative change beyond the threshold on a class with enough
drafts judged at every position up to K suggests re-tuning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.safe_text import shell_word
from policies import AcceptanceProfile, StepCostModel, StepSample, mix
from policies.plugin import PluginStats

__all__ = [
    "DEFAULT_DRIFT_THRESHOLD",
    "DEFAULT_MIN_DRAFTS",
    "DriftReport",
    "LiveProfile",
    "check_drift",
    "live_acceptance",
    "live_profile",
]

DEFAULT_DRIFT_THRESHOLD = 0.15
"""Relative change of AL at the served K that counts as drift (0.15 = 15%)."""
DEFAULT_MIN_DRAFTS = 200
"""Drafts judged at the served K's deepest position a class needs before its drift counts."""
_MIN_STEP_SHAPES_TO_FIT = 4


@dataclass(frozen=True)
class LiveProfile:
    """What one serving session measured so far (cumulative since the launch)."""

    acceptance: dict[str, AcceptanceProfile]
    """Per class, measured survival (see the module docstring)."""
    judged: dict[str, list[int]]
    """Per class, drafts judged at each position (at risk): the evidence behind each survival value."""
    step_samples: list[StepSample]
    """Median decode-step time per (batch size, verified tokens), ms (measured)."""
    cost_model: StepCostModel | None
    """Fitted to ``step_samples`` when they cover enough shapes (>= 4 and >= 2 batch sizes), else None."""
    decode_steps: int
    totals: dict[str, Any]
    depth_histogram: dict[int, int]
    fallback: bool
    errors: list[str]

    @property
    def num_drafts(self) -> int:
        return sum(p.num_drafts for p in self.acceptance.values())

    def acceptance_length(self, cls: str, k: int) -> float | None:
        """Measured AL at depth k for a class (None if the class has no drafts or was never judged that deep)."""
        p = self.acceptance.get(cls)
        if p is None or p.max_k < k:
            return None
        return p.acceptance_length(k)


def live_acceptance(stats: PluginStats) -> tuple[dict[str, AcceptanceProfile], dict[str, list[int]]]:
    """Per class: (survival as an `AcceptanceProfile`, drafts judged per position). See the module docstring."""
    out: dict[str, AcceptanceProfile] = {}
    judged_out: dict[str, list[int]] = {}
    for cls in stats.classes():
        by_depth = stats.acceptance_by_depth(cls)
        if not by_depth:
            continue
        total = sum(p.num_drafts for p in by_depth.values())
        deepest = max(by_depth)
        survival: list[float] = []
        judged: list[int] = []
        s = 1.0
        for i in range(deepest):
            at_risk = 0
            accepted = 0
            for d, p in by_depth.items():
                if d > i:
                    at_risk += p.num_drafts if i == 0 else p.accepted_per_position[i - 1]
                    accepted += p.accepted_per_position[i]
            if at_risk == 0 and s > 0:
                break  # nothing judged this deep: the curve ends here
            # (at_risk == 0 with s == 0: no draft survives this far, so survival stays exactly 0.)
            s = s * accepted / at_risk if at_risk else 0.0
            survival.append(s)
            judged.append(at_risk)
        if not survival:
            continue
        counts: list[int] = []
        for v in survival:
            c = int(round(v * total))
            counts.append(min(c, counts[-1]) if counts else c)
        out[cls] = AcceptanceProfile(total, tuple(counts))
        judged_out[cls] = judged
    return out, judged_out


def live_profile(stats: PluginStats, *, sequential: bool = False) -> LiveProfile:
    """The live profile of a plugin's statistics (cumulative; every figure measured except ``cost_model``)."""
    acceptance, judged = live_acceptance(stats)
    samples = stats.step_samples(sequential=sequential, uniform_only=False)
    cost: StepCostModel | None = None
    if len(samples) >= _MIN_STEP_SHAPES_TO_FIT and len({s.batch_size for s in samples}) >= 2:
        try:
            cost = StepCostModel.fit(samples, sequential=sequential)
        except ValueError:
            cost = None
    return LiveProfile(
        acceptance=acceptance,
        judged=judged,
        step_samples=samples,
        cost_model=cost,
        decode_steps=stats.decode_steps,
        totals=stats.totals(),
        depth_histogram=stats.depth_histogram(),
        fallback=stats.fallback,
        errors=list(stats.errors),
    )


@dataclass(frozen=True)
class DriftReport:
    """Live AL at the served K against the reference, per class (``"*"``: all classes mixed by drafts)."""

    k: int
    threshold: float
    rows: tuple[dict[str, Any], ...]
    """Per class: class, live_al, reference_al, change (relative, signed), judged (drafts judged at position K),
    enough (judged >= min_drafts), drifted."""

    @property
    def drifted(self) -> bool:
        return any(r["drifted"] for r in self.rows)

    def message(self, model: str, workload_hint: str = "WORKLOAD") -> str:
        """One paragraph: which classes drifted by how much, and the command that re-tunes."""
        moved = [r for r in self.rows if r["drifted"]]
        if not moved:
            return ""
        parts = ", ".join(
            f"{r['class']}: AL({self.k}) {r['live_al']:.2f} live vs {r['reference_al']:.2f} tuned "
            f"({r['change']:+.0%}, {r['judged']} drafts)"
            for r in moved
        )
        return (
            f"Live acceptance drifted by more than {self.threshold:.0%} from the tuned profile ({parts}). "
            f"Consider re-tuning from the live profile: `peagle-tune search --model {shell_word(model)} --backend "
            f"model --workload {shell_word(workload_hint)}` (it predicts from the newest profile, this live one), or "
            f"re-profile with `peagle-tune profile`."
        )


def check_drift(
    live: Mapping[str, AcceptanceProfile],
    judged: Mapping[str, Sequence[int]],
    reference: Mapping[str, float],
    k: int,
    *,
    threshold: float = DEFAULT_DRIFT_THRESHOLD,
    min_drafts: int = DEFAULT_MIN_DRAFTS,
) -> DriftReport:
    """Compare live AL(k) with ``reference`` AL(k) per class (pure arithmetic on the given numbers).

    ``reference`` maps class -> AL at k; the key ``"*"`` is an overall figure compared with all live classes mixed
    by their drafts (`policies.mix`). A class counts only with >= ``min_drafts`` drafts judged at position k (the
    deepest position AL(k) depends on). Drift: ``|live - ref| / ref > threshold``.

    Example: live survival (0.5, 0.25) on 400 drafts judged 400 and 200 times, reference AL(2) 2.2:
    live AL(2) = 1 + 0.5 + 0.25 = 1.75, change = 1.75 / 2.2 - 1 = -20% -> drifted at 15%.
    """
    if k < 1:
        return DriftReport(k, threshold, ())
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a relative change > 0 (0.15 = 15%), but got {threshold}.")
    rows = []
    for cls, ref in sorted(reference.items()):
        if cls == "*":
            usable = {c: p for c, p in live.items() if p.max_k >= k}
            if not usable:
                continue
            profile = mix(usable, {c: p.num_drafts for c, p in usable.items()})
            n_judged = sum(int(judged[c][k - 1]) for c in usable if len(judged.get(c, ())) >= k)
        else:
            p = live.get(cls)
            if p is None or p.max_k < k:
                continue
            profile = p
            n_judged = int(judged[cls][k - 1]) if len(judged.get(cls, ())) >= k else 0
        live_al = profile.acceptance_length(k)
        change = live_al / ref - 1.0
        enough = n_judged >= min_drafts
        rows.append(
            {
                "class": cls,
                "live_al": live_al,
                "reference_al": ref,
                "change": change,
                "judged": n_judged,
                "enough": enough,
                "drifted": enough and abs(change) > threshold,
            }
        )
    return DriftReport(k, threshold, tuple(rows))


def profile_notes(live: LiveProfile, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``notes`` of a stored live profile: how the figures were measured, and the raw counters."""
    notes: dict[str, Any] = {
        "source": "peagle-tune serve: scheduler plugin statistics, cumulative since the server started",
        "acceptance_method": "per-position conditional rates over every verified depth (Kaplan-Meier), measured",
        "judged_per_position": live.judged,
        "decode_steps": live.decode_steps,
        "totals": live.totals,
        "depth_histogram": {str(k): v for k, v in live.depth_histogram.items()},
        "fallback": live.fallback,
        "errors": live.errors,
        "step_time": "schedule() entry to Scheduler.update_from_output() return, decode-only steps, median ms; "
        "the drafter ran in every step (depth applied by trimming)",
    }
    if live.cost_model is not None:
        notes["fit_error"] = live.cost_model.fit_error()
    notes.update(extra or {})
    return notes
