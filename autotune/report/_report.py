"""`write_report`: gather a store's profiles, studies and recommendations, draw the figures, write index.html."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.report import _plots as plots
from autotune.report import _series as series
from autotune.report._html import Figure, ModelSection, render_page
from autotune.safe_io import check_target, write_file
from store import ProfileRecord, RecommendationRecord, Store, TrialRecord, mask_password

INDEX = "index.html"

SECTIONS = (
    "Acceptance per draft position",
    "Acceptance length AL(K)",
    "Step cost T(B, K)",
    "Predicted tokens/s against K",
    "Search trials",
    "Pareto fronts",
    "Simulated serving against concurrency",
)


#: Longest figure file name stem: far below the 255 bytes file systems allow, whatever the study name's length.
MAX_STEM = 120


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "x"


def figure_name(prefix: str, name: str, taken: set[str]) -> str:
    """A PNG file name for figure `name` of the model `prefix`: letters, digits, dots and dashes only, at most
    `MAX_STEM` characters before ``.png``, and not in `taken` (two names that slug alike, or are cut alike, get a
    hash of the whole name); the name returned is added to `taken`.

    >>> figure_name("m", "trials-Study 1", set())
    'm-trials-study-1.png'
    """
    stem = f"{prefix}-{_slug(name)}"
    if len(stem) > MAX_STEM or f"{stem}.png" in taken:
        digest = hashlib.sha256(f"{prefix}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:12]
        stem = f"{stem[:MAX_STEM - 13]}-{digest}"
    while f"{stem}.png" in taken:  # the same name twice: number it
        stem += "-2"
    taken.add(f"{stem}.png")
    return f"{stem}.png"


def _latest_per_key(recs: Sequence[RecommendationRecord]) -> list[RecommendationRecord]:
    """Newest recommendation per (GPU, workload, objective, scenario), ordered by those and concurrency."""
    seen: dict[tuple[Any, ...], RecommendationRecord] = {}
    for r in recs:  # newest first
        key = (
            r.gpu,
            r.workload_hash or r.workload_name,
            r.objective,
            json.dumps(series.slos_of(r), sort_keys=True),
            json.dumps(r.scenario, sort_keys=True),
        )
        seen.setdefault(key, r)
    return sorted(
        seen.values(),
        key=lambda r: (r.gpu, r.workload_name or "", r.objective, r.scenario.get("request_rate") or 0,
                       r.scenario.get("concurrency") or 0),
    )


def _latest_profiles(profiles: Sequence[ProfileRecord]) -> list[ProfileRecord]:
    """Newest profile per (drafter, parallel drafting, device, vLLM version, workload, kind)."""
    seen: dict[tuple[Any, ...], ProfileRecord] = {}
    for p in profiles:  # newest first
        key = (p.drafter, p.parallel_drafting, p.device, p.vllm_version, p.workload_hash, p.kind)
        seen.setdefault(key, p)
    return list(seen.values())


class _Builder:
    """Plans one model's figures in `out_dir`, collecting them per section; `drawings` are drawn once every file
    the report writes has been checked."""

    def __init__(self, out_dir: Path, model: str, taken: set[str]) -> None:
        self.out_dir = out_dir
        self.prefix = _slug(series.short_name(model))[:MAX_STEM // 2]
        self.taken = taken
        self.section = ModelSection(model=model, latest=[], recommendations=[])
        self.section.figures = {title: [] for title in SECTIONS}
        self.drawings: list[tuple[Callable[[Any, Path], Path], Any, Path]] = []

    def add(
        self, title: str, name: str, draw: Callable[[Any, Path], Path], data: Any, kind: str, caption: str
    ) -> None:
        path = self.out_dir / figure_name(self.prefix, name, self.taken)
        self.drawings.append((draw, data, path))
        heading = getattr(data, "title", name)
        self.section.figures[title].append(
            Figure(file=path.name, heading=str(heading), how_to_read="", kind=kind, caption=caption)
        )

    def profile(self, p: ProfileRecord) -> None:
        tag = f"profile{p.id}"
        acc, notes = series.acceptance_from_profile(p)
        self.section.notes.extend(notes)
        if acc is not None:
            self.add("Acceptance per draft position", f"acceptance-{tag}", plots.plot_acceptance, acc, "measured",
                     acc.caption)
            self.add("Acceptance length AL(K)", f"al-{tag}", plots.plot_acceptance_length, acc, "measured",
                     acc.caption)
        cost = series.step_cost_from_profile(p)
        if cost is not None:
            self.add("Step cost T(B, K)", f"step-cost-{tag}", plots.plot_step_cost, cost, "measured", cost.caption)
        else:
            self.section.notes.append(f"{series.profile_label(p)} has no step-cost samples: no T(B, K) figure.")
        good = series.goodput_from_profile(p)
        if good is not None:
            self.add("Predicted tokens/s against K", f"goodput-{tag}", plots.plot_goodput, good, "predicted",
                     good.caption_with_ties())

    def predicted(self, recs: Sequence[RecommendationRecord]) -> None:
        """Figures from the catalog and model backend for a group of recommendations with no measured profile."""
        ctx = series.backend_context(recs)
        if ctx is None:
            self.section.notes.append(
                "The recommendations serve without speculation, so there is no drafter to plot predictions for."
            )
            return
        tag = _slug(f"{series.short_name(ctx.gpu)}-{ctx.workload}-{series.short_name(ctx.config.drafter)}")
        max_k = max(8, ctx.config.k)
        acc = series.acceptance_from_catalog(ctx.model, str(ctx.config.drafter), max_k)
        if acc is not None:
            self.add("Acceptance length AL(K)", f"al-published-{tag}", plots.plot_acceptance_length, acc,
                     "predicted", acc.caption)
        cost = series.step_cost_from_backend(ctx, max_k)
        if cost is not None:
            self.add("Step cost T(B, K)", f"step-cost-predicted-{tag}", plots.plot_step_cost, cost, "predicted",
                     cost.caption)
        good, why = series.goodput_from_backend(ctx, max_k)
        if good is not None:
            self.add("Predicted tokens/s against K", f"goodput-predicted-{tag}", plots.plot_goodput, good,
                     "predicted", good.caption_with_ties())
        else:
            self.section.notes.append(f"No predicted tokens/s figure: {why}.")

    def simulation(self, name: str, trials: Sequence[TrialRecord]) -> None:
        """A stored simulation (peagle-tune simulate): tokens/s and TPOT p50 against concurrency per config."""
        data, why = series.simulation_data(name, trials)
        if data is None:
            self.section.notes.append(f"No simulation figure: {why}.")
            return
        self.add("Simulated serving against concurrency", f"simulation-{name}", plots.plot_simulation, data,
                 "predicted", data.caption)

    def study(self, name: str, trials: Sequence[TrialRecord]) -> None:
        recs = [r for r in self.section.recommendations if r.study == name]  # newest first
        data = series.study_data(
            name, trials, recs[0].best_config if recs else None, series.slos_of(recs[0]) if recs else None
        )
        kinds = {series.kind_of(t.provenance) for t in trials}
        kind = kinds.pop() if len(kinds) == 1 else "mixed"
        self.add("Search trials", f"trials-{name}", plots.plot_trials, data, kind, data.caption)
        if data.multi_objective and data.pareto():
            self.add("Pareto fronts", f"pareto-{name}", plots.plot_pareto, data, kind, data.caption)


def write_report(
    store: Store, out_dir: str | Path, model: str | None = None, *, force: bool = False
) -> Path:
    """Write PNG figures and a self-contained ``index.html`` into `out_dir`; returns the page's path.

    Covers every model in the store (or only `model`, matched exactly as stored, e.g. "openai/gpt-oss-120b"):
    recommendations (summary cards with the ``--speculative-config`` JSON), measured profiles (acceptance per
    position, AL(K), step cost T(B, K), tokens/s vs K predicted from the profile), and when a model has no profile,
    the same figures predicted by the model backend; then the trials of each study. Each figure says whether its
    numbers are measured or predicted.

    Every file goes through `autotune.safe_io.write_file` (whole or not at all, a link replaced and never written
    through, only regular files replaced). All of them are checked before the first is written, so a refusal
    changes nothing.

    Raises UsageError when the store holds nothing for `model` (run `peagle-tune search` first), or when
    `out_dir/index.html` or a figure's file exists and `force` is False, or is not a regular file or a link.
    """
    out = Path(out_dir).expanduser()
    index = out / INDEX
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out must be a directory, but {out} is a file. Choose a directory path.")
    if out.is_dir():  # refused before reading the store and drawing
        check_target(index, force=force)
    recs = store.list_recommendations(model=model)
    profiles = store.list_profiles(model=model)
    trials = store.list_trials(model=model)
    models = sorted({r.model for r in recs} | {p.model for p in profiles} | {t.model for t in trials})
    if not models:
        where = f" for model {model!r}" if model else ""
        known = sorted({r.model for r in store.list_recommendations()} | {p.model for p in store.list_profiles()})
        hint = f" Models with data: {', '.join(known)}." if model and known else ""
        raise UsageError(
            f"Nothing to report{where} in {mask_password(store.url)}: no recommendations, profiles or trials are "
            f"stored.{hint} Run `peagle-tune search --model MODEL` (or `peagle-tune profile`) first."
        )
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    builders = []
    taken: set[str] = {INDEX}
    for name in models:
        builder = _Builder(out, name, taken)
        builders.append(builder)
        model_recs = [r for r in recs if r.model == name]
        builder.section.recommendations = model_recs
        builder.section.latest = _latest_per_key(model_recs)
        model_profiles = _latest_profiles([p for p in profiles if p.model == name])
        for p in model_profiles:
            builder.profile(p)
        if not model_profiles:
            groups: dict[tuple[str, str], list[RecommendationRecord]] = {}
            for r in builder.section.latest:
                groups.setdefault((r.gpu, r.workload_name or ""), []).append(r)
            for group in groups.values():
                builder.predicted(group)
            if groups:
                builder.section.notes.append(
                    "No measured profile for this model: acceptance, step cost and tokens/s figures are predicted "
                    "by the model backend. Run `peagle-tune profile` on the target GPU to measure them."
                )
        by_study: dict[str, list[TrialRecord]] = {}
        for t in trials:
            if t.model == name:
                by_study.setdefault(t.study, []).append(t)
        for study in sorted(by_study, key=lambda s: _study_order(by_study[s])):
            if series.is_simulation_study(by_study[study]):
                builder.simulation(study, by_study[study])
            else:
                builder.study(study, by_study[study])
        sections.append(builder.section)
    drawings = [drawing for builder in builders for drawing in builder.drawings]
    for path in [index, *(path for _draw, _data, path in drawings)]:
        check_target(path, force=force)
    for draw, data, path in drawings:
        draw(data, path)
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_file(index, render_page(sections, db=mask_password(store.url), generated=generated), force=True)
    return index


def _study_order(trials: Sequence[TrialRecord]) -> tuple[Any, ...]:
    s = trials[0].scenario
    return (s.get("request_rate") or 0, s.get("concurrency") or 0, trials[0].study)
