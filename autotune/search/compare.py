"""The pick rule, and the per-drafter comparison of one scenario's trials built on it.

The pick rule (`pick_tied`, `tie_margin`, `tie_key`, `tie_note`) is the one every output that names a K uses: the
search (`autotune.search.result.pick`), each drafter's best here, the schedule (`best_depth_per_batch`), the report's
K sweep and starred trial, and simulate's best static. Figures within their own spread of the best tie: one sigma
of the prediction for predicted figures (`ModelBackend`'s calibration), 0.1% (`TIE`) for measured ones, which carry
no repeat spread today. The tie goes to max_num_seqs within the concurrency, then the smallest K.

Per-drafter comparison: the best config of every drafter variant searched.

The question P-EAGLE users ask is relative: does parallel drafting beat EAGLE-3 here, at which K, with a 2- or
4-layer head, at this concurrency? A search keeps one best config; this module answers the question from the same
trials (measured or predicted): group them by drafter variant -- (drafter, layers, parallel drafting on/off,
hypothetical or not) -- keep each variant's best config, and divide its tokens/s by no speculation's and by the
best plain EAGLE-3 head's (each at its own best K). Pure functions over plain records; no store, no Optuna.

Example::

    rows = per_drafter([TrialOutcome.from_measurement(m) for m in measurements])
    [r.to_dict() for r in rows]      # the JSON `per_drafter` list of a scenario
    print("\\n".join(format_per_drafter(rows)))   # an 80-column text table
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from autotune.measurement import Measurement
from autotune.spec import SpecConfig

__all__ = [
    "DrafterBest",
    "TrialOutcome",
    "format_per_drafter",
    "is_plain_eagle3",
    "per_drafter",
    "pick_tied",
    "tie_key",
    "tie_margin",
    "tie_note",
]

T = TypeVar("T")

#: Scores within this relative distance of the best are ties, broken by `tie_key` (the search's own rule).
TIE = 1e-3


def tie_margin(log_sigma: float = 0.0) -> float:
    """Relative gap under which a config ties the best: `TIE`, or the best's predicted spread (one sigma, log scale)
    when wider (a predicted win inside the noise of the prediction goes to the simpler config by `tie_key`)."""
    return max(TIE, 1.0 - math.exp(-log_sigma))


def pick_tied(
    items: Sequence[T], score: Callable[[T], float], margin: float, order: Callable[[T], Any]
) -> tuple[T, list[T]]:
    """The one pick rule: among `items`, those whose `score` (higher is better) lies within `margin` (relative, e.g.
    `tie_margin`) of the best tie; the tie goes to the smallest `order` (`tie_key` of their configs), then the
    better score. Returns (chosen, every tied item). Used by the search, each drafter's best, the schedule, the
    report's K sweep and simulate's best static, so they name the same K for the same figures.

    >>> pick_tied([(3, 445.0), (4, 454.0), (5, 450.0)], lambda t: t[1], 0.048, lambda t: t[0])
    ((3, 445.0), [(3, 445.0), (4, 454.0), (5, 450.0)])
    """
    if not items:
        raise ValueError("pick_tied needs at least one item; got none.")
    top = max(score(i) for i in items)
    tied = [i for i in items if score(i) >= top - abs(top) * margin]
    return min(tied, key=lambda i: (order(i), -score(i))), tied


def tie_note(tied_ks: Iterable[int], chosen_k: int, margin: float) -> str | None:
    """One line saying that several K tie and which was chosen, e.g. ``K 3-5 within 4.8%; K=3 chosen: fewer
    verified tokens``; None when only one K is within `margin` of the best."""
    ks = sorted(set(tied_ks) | {chosen_k})
    if len(ks) < 2:
        return None
    span = f"{ks[0]}-{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) else ",".join(map(str, ks))
    why = "fewer verified tokens" if chosen_k == ks[0] else "max_num_seqs within the concurrency"
    return f"K {span} within {margin:.1%}; K={chosen_k} chosen: {why}"


def tie_key(config: SpecConfig, concurrency: int | None) -> tuple[bool, int, int, int]:
    """The order among tied configs, the one rule of the search (`autotune.search.result`) and of each drafter's
    best here: max_num_seqs within the `concurrency` first (more sequences than clients are never in flight, so a
    config above it wins only when it pays more than the tie margin), then the smallest K (the same throughput with
    less verification work and memory), then max_num_seqs closest to the concurrency (the smaller of two as close).
    `concurrency` None (not known): the smallest K, then the smallest max_num_seqs."""
    seqs = config.max_num_seqs
    if concurrency is None:
        return (False, config.k, seqs, seqs)
    return (seqs > concurrency, config.k, abs(seqs - concurrency), seqs)


@dataclass(frozen=True)
class TrialOutcome:
    """One finished trial: its config and figures (output tokens/s; speedup over no speculation when known)."""

    config: SpecConfig
    output_tokens_per_s: float
    speedup_vs_no_spec: float | None = None
    tpot_ms: float | None = None
    """TPOT p50, ms (used when ranking by latency)."""
    hypothetical: bool = False
    """The drafter is an unreleased variant (no checkpoint): predicted only."""
    feasible: bool = True
    """The trial met the search's SLOs; infeasible trials only count when a variant has no feasible one."""
    log_sigma: float = 0.0
    """The spread (one sigma, log scale) of a predicted trial's figures; 0 for a measured one (`tie_margin`)."""

    @classmethod
    def from_measurement(
        cls, m: Measurement, *, hypothetical: bool = False, feasible: bool = True
    ) -> TrialOutcome | None:
        """From a backend Measurement; None for a failed one (it has no figures to compare)."""
        if not m.ok or not m.output_tokens_per_s:
            return None
        return cls(m.config, float(m.output_tokens_per_s), m.speedup_vs_no_spec, m.tpot_ms_p50, hypothetical,
                   feasible)

    @classmethod
    def from_metrics(
        cls,
        config: SpecConfig | Mapping[str, Any],
        metrics: Mapping[str, Any],
        *,
        hypothetical: bool = False,
        feasible: bool = True,
        log_sigma: float = 0.0,
    ) -> TrialOutcome | None:
        """From a stored trial: its config (object or ``SpecConfig.to_dict()``) and its metrics dict (keys
        ``output_tokens_per_s``, ``speedup_vs_no_spec``, ``tpot_ms_p50``); None without tokens/s."""
        spec = config if isinstance(config, SpecConfig) else SpecConfig.from_dict(dict(config))
        tps = metrics.get("output_tokens_per_s")
        if not isinstance(tps, int | float) or tps <= 0:
            return None
        speedup = metrics.get("speedup_vs_no_spec")
        tpot = metrics.get("tpot_ms_p50")
        return cls(
            spec,
            float(tps),
            float(speedup) if isinstance(speedup, int | float) else None,
            float(tpot) if isinstance(tpot, int | float) else None,
            hypothetical,
            feasible,
            log_sigma,
        )


@dataclass(frozen=True)
class DrafterBest:
    """The best config of one drafter variant in one scenario, with its gains."""

    drafter: str
    layers: int | None
    parallel_drafting: bool
    hypothetical: bool
    best_config: SpecConfig
    output_tokens_per_s: float
    speedup_vs_no_spec: float | None
    """tokens/s over no speculation (same engine limits); None when no baseline is known."""
    speedup_vs_eagle3: float | None
    """tokens/s over the best plain EAGLE-3 head at its best K; None when no EAGLE-3 head was searched."""
    is_eagle3_reference: bool = False
    """This variant is the EAGLE-3 reference the others are divided by."""

    @property
    def k(self) -> int:
        return self.best_config.k

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: drafter, layers, parallel_drafting, hypothetical, best_config (``SpecConfig.to_dict()``),
        output_tokens_per_s, speedup_vs_no_spec, speedup_vs_eagle3, is_eagle3_reference."""
        return {
            "drafter": self.drafter,
            "layers": self.layers,
            "parallel_drafting": self.parallel_drafting,
            "hypothetical": self.hypothetical,
            "best_config": self.best_config.to_dict(),
            "output_tokens_per_s": self.output_tokens_per_s,
            "speedup_vs_no_spec": self.speedup_vs_no_spec,
            "speedup_vs_eagle3": self.speedup_vs_eagle3,
            "is_eagle3_reference": self.is_eagle3_reference,
        }


def is_plain_eagle3(drafter: str) -> bool | None:
    """True for a catalog EAGLE-3 head without parallel drafting (the baseline P-EAGLE is compared with), False for
    any other catalog head, None when the catalog does not know the name (a local path, say)."""
    from autotune.catalogs import get_drafter
    from autotune.errors import PeagleError

    try:
        spec = get_drafter(drafter)
    except (PeagleError, ValueError):
        return None
    return spec.method == "eagle3" and not spec.parallel_drafting


def _variant(o: TrialOutcome) -> tuple[str, int | None, bool, bool]:
    c = o.config
    return (str(c.drafter), c.drafter_layers, c.parallel_drafting, o.hypothetical)


def _best(outcomes: Sequence[TrialOutcome], score: Callable[[TrialOutcome], float],
          concurrency: int | None = None) -> TrialOutcome:
    pool = [o for o in outcomes if o.feasible] or list(outcomes)
    best = max(pool, key=score)
    return pick_tied(pool, score, tie_margin(best.log_sigma), lambda o: tie_key(o.config, concurrency))[0]


def per_drafter(
    outcomes: Iterable[TrialOutcome | None],
    *,
    baseline_tokens_per_s: float | None = None,
    eagle3: Callable[[str], bool | None] = is_plain_eagle3,
    score: Callable[[TrialOutcome], float] | None = None,
    concurrency: int | None = None,
) -> list[DrafterBest]:
    """The best config of every drafter variant among `outcomes`, fastest first.

    Args:
        outcomes: finished trials of one scenario (None entries, e.g. failed measurements, are skipped). Trials
            without speculation are the baseline, not a variant.
        baseline_tokens_per_s: no speculation's tokens/s, used for variants whose best trial carries no
            ``speedup_vs_no_spec``; default: the best no-speculation trial among `outcomes`.
        eagle3: says whether a drafter is a plain EAGLE-3 head (default: the catalog; for names it does not know,
            a head never tried with parallel drafting counts as EAGLE-3).
        score: what "best" maximises (default output tokens/s; pass e.g. ``lambda o: -(o.tpot_ms or inf)`` for
            latency). Feasible trials win over infeasible ones; ties (within `tie_margin` of the best) are broken by
            `tie_key`, as the search picks.
        concurrency: the scenario's concurrency, for `tie_key` (None: not known).

    The EAGLE-3 reference is the best variant of a plain EAGLE-3 head run sequentially (released heads preferred
    over hypothetical ones); `speedup_vs_eagle3` of every variant divides by its tokens/s.
    """
    rank = score or (lambda o: o.output_tokens_per_s)
    real = [o for o in outcomes if o is not None]
    groups: dict[tuple[str, int | None, bool, bool], list[TrialOutcome]] = {}
    plain = [o for o in real if not o.config.speculative]
    for o in real:
        if o.config.speculative:
            groups.setdefault(_variant(o), []).append(o)
    if baseline_tokens_per_s is None and plain:
        baseline_tokens_per_s = _best(plain, lambda o: o.output_tokens_per_s, concurrency).output_tokens_per_s
    tried_parallel = {key[0] for key in groups if key[2]}

    def eagle3_variant(key: tuple[str, int | None, bool, bool]) -> bool:
        if key[2]:
            return False
        known = eagle3(key[0].split(":")[0])
        return (key[0] not in tried_parallel) if known is None else known

    bests = {key: _best(items, rank, concurrency) for key, items in groups.items()}
    references = [key for key in bests if eagle3_variant(key)]
    released = [key for key in references if not key[3]] or references
    reference = max(released, key=lambda key: bests[key].output_tokens_per_s) if released else None
    reference_tps = bests[reference].output_tokens_per_s if reference else None

    rows = []
    for key, best in bests.items():
        speedup = best.speedup_vs_no_spec
        if speedup is None and baseline_tokens_per_s:
            speedup = best.output_tokens_per_s / baseline_tokens_per_s
        rows.append(
            DrafterBest(
                drafter=key[0],
                layers=key[1],
                parallel_drafting=key[2],
                hypothetical=key[3],
                best_config=best.config,
                output_tokens_per_s=best.output_tokens_per_s,
                speedup_vs_no_spec=speedup,
                speedup_vs_eagle3=best.output_tokens_per_s / reference_tps if reference_tps else None,
                is_eagle3_reference=key == reference,
            )
        )
    return sorted(rows, key=lambda r: (-r.output_tokens_per_s, r.drafter, r.layers or 0, r.parallel_drafting))


def _short(name: str, width: int) -> str:
    # The repository part of an id, without a variant's ":<n>-layer" (the layers column says it).
    base = re.sub(r":\d+-layer$", "", name.rsplit("/", 1)[-1])
    return base if len(base) <= width else base[: width - 1] + "~"


def format_per_drafter(rows: Sequence[DrafterBest], width: int = 80) -> list[str]:
    """A plain-text table of `per_drafter` rows that fits `width` columns (80 by default).

    Columns: drafter (short name, layers, ``par``/``seq`` drafting, ``*`` = hypothetical), best K, max_num_seqs,
    tok/s, speedup over no speculation, speedup over EAGLE-3 (``ref`` marks the reference). Example line::

        GPT-OSS-20B-P-EAGLE 4L par        7    64   12345.6   2.14x   1.15x
    """
    fixed = 5 + 6 + 10 + 8 + 8  # K, seqs, tok/s, vs none, vs EAGLE-3
    name_w = max(12, width - fixed - 1)
    lines = [f"{'drafter':<{name_w}}{'K':>5}{'seqs':>6}{'tok/s':>10}{'vs none':>8}{'vs E3':>8}"]
    for r in rows:
        layers = f" {r.layers}L" if r.layers else ""
        mode = " par" if r.parallel_drafting else " seq"
        star = "*" if r.hypothetical else ""
        suffix = f"{layers}{mode}{star}"
        label = _short(r.drafter, name_w - len(suffix) - 1) + suffix
        none = f"{r.speedup_vs_no_spec:.2f}x" if r.speedup_vs_no_spec is not None else "-"
        vs_e3 = "ref" if r.is_eagle3_reference else (f"{r.speedup_vs_eagle3:.2f}x" if r.speedup_vs_eagle3 else "-")
        lines.append(
            f"{label:<{name_w}}{r.k:>5}{r.best_config.max_num_seqs:>6}{r.output_tokens_per_s:>10.1f}"
            f"{none:>8}{vs_e3:>8}"
        )
    if any(r.hypothetical for r in rows):
        lines.append("* hypothetical variant: predicted only, no released checkpoint")
    return [line[:width] for line in lines]
