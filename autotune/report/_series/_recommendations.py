"""Stored recommendations for the report: near-identical ones grouped, each drafter variant's best config per
concurrency, and P-EAGLE's advantage over EAGLE-3 beside the published ratios."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import PeagleError
from autotune.report._series._labels import finite_number, one_line, positive_int, short_name
from store import RecommendationRecord


def same_recommendation_key(rec: RecommendationRecord) -> tuple[str, ...]:
    """What makes two recommendations near-identical for a reader: the same GPU, workload, scenario and config
    (whatever the objective or run that stored them)."""
    return (rec.gpu, rec.workload_hash or rec.workload_name or "", json.dumps(rec.scenario, sort_keys=True),
            json.dumps(rec.best_config, sort_keys=True))


def distinct(recs: Sequence[RecommendationRecord]) -> list[tuple[RecommendationRecord, list[RecommendationRecord]]]:
    """One entry per distinct recommendation (`same_recommendation_key`), in `recs`' order (the first of each kept),
    with the near-identical ones it stands for."""
    groups: dict[tuple[str, ...], list[RecommendationRecord]] = {}
    for r in recs:
        groups.setdefault(same_recommendation_key(r), []).append(r)
    return [(items[0], items[1:]) for items in groups.values()]


@dataclass(frozen=True)
class DrafterRow:
    """One drafter variant's best config at one concurrency (a stored recommendation's ``per_drafter`` entry)."""

    concurrency: int
    drafter: str
    layers: int | None
    parallel_drafting: bool
    hypothetical: bool
    k: int | None
    max_num_seqs: int | None
    tokens_per_s: float | None
    speedup_vs_no_spec: float | None
    speedup_vs_eagle3: float | None
    eagle3_reference: bool
    recommended: bool


def drafter_rows(recs: Sequence[RecommendationRecord]) -> list[DrafterRow]:
    """P-EAGLE vs EAGLE-3 (and 2- vs 4-layer heads) per concurrency, from the recommendations' ``per_drafter``
    (search's comparison of every drafter variant at its best config), lowest concurrency first, fastest first
    within it. Entries another version wrote in another shape are skipped; numbers are kept only when numbers."""
    out: list[DrafterRow] = []
    for rec in sorted(recs, key=lambda r: positive_int(r.scenario.get("concurrency")) or 0):
        concurrency = positive_int(rec.scenario.get("concurrency"))
        entries = (rec.metrics or {}).get("per_drafter")
        if concurrency is None or not isinstance(entries, list):
            continue
        best = rec.best_config
        for e in entries:
            config = e.get("best_config") if isinstance(e, dict) else None
            if not isinstance(config, dict) or not isinstance(e.get("drafter"), str):
                continue
            variant = (config.get("drafter"), config.get("drafter_layers"), config.get("parallel_drafting"))
            out.append(DrafterRow(
                concurrency=concurrency,
                drafter=one_line(re.sub(r":\d+-layer$", "", e["drafter"])),
                layers=positive_int(e.get("layers")),
                parallel_drafting=e.get("parallel_drafting") is True,
                hypothetical=e.get("hypothetical") is True,
                k=positive_int(config.get("num_speculative_tokens")),
                max_num_seqs=positive_int(config.get("max_num_seqs")),
                tokens_per_s=finite_number(e.get("output_tokens_per_s")),
                speedup_vs_no_spec=finite_number(e.get("speedup_vs_no_spec")),
                speedup_vs_eagle3=finite_number(e.get("speedup_vs_eagle3")),
                eagle3_reference=e.get("is_eagle3_reference") is True,
                recommended=variant == (best.get("drafter"), best.get("drafter_layers"), best.get("parallel_drafting")),
            ))
    return out


#: The published points (package data, with their sources) the model backend is calibrated against.
PUBLISHED_POINTS = "model_calibration.yaml"


@dataclass(frozen=True)
class PublishedRatio:
    """A published P-EAGLE over EAGLE-3 throughput ratio (each at its best K) at one concurrency: a figure
    (`low` = `high`) or a range, with the GPU it was measured on and its source."""

    point_id: str
    concurrency: int
    low: float
    high: float
    gpu: str
    """The GPU's catalog key (``b200``)."""
    label: str
    """The source in a few words (``vLLM PR #32887``)."""
    source: str
    """The source whole: what was measured, where and how."""


def source_label(source: str) -> str:
    """A source's first clause, outside brackets: ``vLLM PR #32628 (parallel token drafting for EAGLE-3, gpt-oss-120b):
    ...`` -> ``vLLM PR #32628 (parallel token drafting for EAGLE-3, gpt-oss-120b)``."""
    depth = 0
    for i, ch in enumerate(source):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch in ",:":
            return source[:i].strip()
    return source.strip()


def published_advantage(model: str) -> list[PublishedRatio]:
    """Every published P-EAGLE over EAGLE-3 ratio for `model` (any GPU; catalog names match whatever their
    spelling), lowest concurrency first, from the model backend's calibration points
    (``autotune/backends/model_calibration.yaml``)."""
    from importlib.resources import files

    import yaml

    from autotune.catalogs import model_names

    names = {k.lower(): v for k, v in model_names().items()}  # every name and alias -> the model's short name

    def canonical(name: str) -> str | None:
        return names.get(name.strip().lower())

    wanted = canonical(model) or model
    data = yaml.safe_load(files("autotune.backends").joinpath(PUBLISHED_POINTS).read_text(encoding="utf-8"))
    out: list[PublishedRatio] = []
    for p in data.get("points") or []:
        if p.get("metric") != "ratio" or canonical(str(p.get("model"))) != wanted:
            continue
        published = p["published"]
        low, high = (float(published[0]), float(published[1])) if isinstance(published, list) else \
            (float(published), float(published))
        out += [PublishedRatio(str(p["id"]), int(c), low, high, str(p["gpu"]), source_label(str(p["source"])),
                               " ".join(str(p["source"]).split())) for c in p.get("concurrencies") or []]
    return sorted(out, key=lambda r: (r.concurrency, r.point_id))


@dataclass(frozen=True)
class AdvantageData:
    """P-EAGLE's advantage over EAGLE-3 against concurrency for one search (GPU, workload, objective): each parallel
    drafting variant's predicted (or measured) ratio per concurrency beside the published ones."""

    title: str
    gpu: str
    """The search's GPU as a catalog key (published points on it are drawn filled, others hollow)."""
    series: dict[str, list[tuple[int, float]]]
    """Variant label -> (concurrency, speedup over EAGLE-3 at its best K)."""
    published: list[PublishedRatio]
    kind: str
    """"predicted", "measured" or "mixed": where the series' figures come from."""


def advantage_data(model: str, gpu: str, rows: Sequence[DrafterRow], title: str, kind: str) -> AdvantageData | None:
    """The advantage figure's data from `drafter_rows` (its parallel drafting variants with a speedup over an
    EAGLE-3 reference) and the published ratios for `model`; None when no variant has one."""
    from autotune.catalogs import get_gpu

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.parallel_drafting and r.speedup_vs_eagle3 is not None:
            label = f"{short_name(r.drafter)}{f' {r.layers}L' if r.layers else ''}{'*' if r.hypothetical else ''}"
            series.setdefault(label, []).append((r.concurrency, r.speedup_vs_eagle3))
    if not series:
        return None
    try:
        key = get_gpu(gpu).key
    except (PeagleError, ValueError):
        key = gpu
    return AdvantageData(title, key, series, published_advantage(model), kind)
