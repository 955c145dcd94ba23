"""Which stored recommendation a command means: the one rule `serve`, `export` and `show` select by.

Pure: it reads records (`store.RecommendationRecord`s or alike) and returns a choice or raises. Filters: model, GPU,
workload, objective (``latency`` matches every latency recommendation, ``latency-tpot12`` only that SLO) and
concurrency; one that leaves nothing is `NotFoundError` naming what is stored. A *search* is the recommendations of
one model, GPU, workload, objective and kind of figures; per concurrency its newest stands.
- `choose_one`: one recommendation; candidates that differ in config are `Ambiguous`, naming the options that tell
  them apart (never the newest silently).
- `choose_search`: one search for a server or a schedule (its highest concurrency's recommendation); searches that
  differ in that config or schedule, or ran for different GPUs, are `Ambiguous`.
- `drafter_by_load`: where no one drafter is best at every load, each load's best and what the others reach there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import NotFoundError, PeagleError, UsageError
from autotune.names import did_you_mean
from autotune.safe_text import shell_word


@dataclass(frozen=True)
class Criteria:
    """What the user asked for; None: any."""

    model: str | None = None
    """The model as stored (a Hugging Face id or a local path: see `autotune.cli._common.canonical_model`)."""
    gpu: str | None = None
    workload: str | None = None
    objective: str | None = None
    concurrency: int | None = None

    def described(self) -> str:
        """``for openai/gpt-oss-120b on h200, workload mt-bench, objective throughput, at concurrency 64``."""
        parts = [f"for {self.model}" if self.model else ""]
        parts += [f"on {self.gpu}" if self.gpu else ""]
        parts += [f"workload {self.workload}" if self.workload else ""]
        parts += [f"objective {self.objective}" if self.objective else ""]
        parts += [f"at concurrency {self.concurrency}" if self.concurrency is not None else ""]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class Entry:
    """One stored recommendation with the keys selection compares."""

    rec: Any
    gpu: str
    """The GPU's catalog key ("h200"), "cpu", or the stored name when no catalog GPU has it."""
    workload: str
    objective: str
    """The objective with its SLOs, e.g. ``throughput``, ``latency-tpot12`` (`Objective.slug`)."""
    concurrency: int | None
    kind: str
    """predicted, measured, ... (the provenance's kind)."""

    @property
    def id(self) -> int:
        return int(self.rec.id)

    @property
    def search(self) -> tuple[str, str, str, str, str]:
        """What makes recommendations one search's: model, GPU, workload, objective with SLOs, kind of figures."""
        return (str(self.rec.model), self.gpu, self.workload, self.objective, self.kind)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.rec.best_config or {})

    @property
    def max_num_seqs(self) -> int | None:
        value = self.config.get("max_num_seqs")
        return value if isinstance(value, int) else None

    @property
    def tokens_per_s(self) -> float | None:
        value = (self.rec.metrics or {}).get("output_tokens_per_s")
        return float(value) if isinstance(value, int | float) else None

    @property
    def order(self) -> tuple[dt.datetime, int]:
        """Newest last: stored time, then id."""
        created = self.rec.created_at
        if isinstance(created, str):
            created = dt.datetime.fromisoformat(created)
        if created.tzinfo is None:
            created = created.replace(tzinfo=dt.UTC)
        return created, self.id


@dataclass(frozen=True)
class Choice:
    """What was chosen and what else was considered (for the lines saying so)."""

    entry: Entry
    search: tuple[Entry, ...] = ()
    """The chosen recommendation's search, one recommendation per concurrency, lowest concurrency first."""
    same_config: tuple[Entry, ...] = ()
    """Other candidates holding the chosen config (the choice did not matter between them)."""

    @property
    def rec(self) -> Any:
        return self.entry.rec


class Ambiguous(UsageError):
    """Several stored recommendations match and differ in config: the user must say which (CLI exit 2)."""

    def __init__(self, message: str, candidates: Sequence[Entry], options: Sequence[str]) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)
        self.options = tuple(options)


# ------------------------------------------------------------------------------------------------- keys of a record


def gpu_key(name: str | None) -> str:
    """A stored or typed GPU name as its catalog key ("NVIDIA H200 SXM 141GB" -> "h200"); "cpu"; else unchanged."""
    if not name:
        return "-"
    if name.strip().lower() == "cpu":
        return "cpu"
    from autotune.catalogs import get_gpu

    try:
        return get_gpu(name).key
    except PeagleError:
        return name


#: The objectives search takes (`autotune.search.OBJECTIVES`, held equal by tests/test_ux_selection.py: importing
#: `autotune.search` here would load Optuna into every `export`).
OBJECTIVES: tuple[str, ...] = ("throughput", "latency", "goodput", "pareto")


def objective_label(rec: Any) -> str:
    """The recommendation's objective with its SLOs, as `autotune.search.Objective.slug` writes it
    (``goodput-tpot30-ttft500``); `rec` is a record or its ``to_dict()``."""

    def get(key: str) -> Any:
        return rec.get(key) if isinstance(rec, Mapping) else getattr(rec, key, None)

    stored = (get("metrics") or {}).get("objective")
    name = str(get("objective"))
    if not isinstance(stored, Mapping):
        return name
    parts = [str(stored.get("name") or name)]
    for key, short in (("slo_tpot_p99_ms", "tpot"), ("slo_ttft_p99_ms", "ttft")):
        value = stored.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(f"{short}{value:g}")
    return "-".join(parts)


#: How a p99 SLO check is labelled when the backend models no tail (it compared the p50).
NO_TAIL = "p99 = p50 (no tail modelled)"


def slo_words(rec: Any) -> str | None:
    """The recommendation's SLOs in words, ``TPOT p99 <= 12 ms``, with `NO_TAIL` when its backend modelled no tail
    (the model backend: the check compared the p50); None without SLOs. `rec` is a record or its ``to_dict()``."""
    metrics = (rec.get("metrics") if isinstance(rec, Mapping) else getattr(rec, "metrics", None)) or {}
    stored = metrics.get("objective")
    if not isinstance(stored, Mapping):
        return None
    slos = []
    no_tail = False
    filled = metrics.get("p99_from_p50") or ()
    for key, name, metric in (("slo_tpot_p99_ms", "TPOT p99", "tpot_ms_p99"),
                              ("slo_ttft_p99_ms", "TTFT p99", "ttft_ms_p99")):
        value = stored.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            slos.append(f"{name} <= {value:g} ms")
            no_tail |= metric in filled
    if not slos:
        return None
    return ", ".join(slos) + (f"; {NO_TAIL}" if no_tail else "")


def concurrency_of(rec: Any) -> int | None:
    value = (rec.scenario or {}).get("concurrency")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def entry(rec: Any) -> Entry:
    return Entry(
        rec=rec,
        gpu=gpu_key(rec.gpu),
        workload=str(rec.workload_name or "-"),
        objective=objective_label(rec),
        concurrency=concurrency_of(rec),
        kind=str((rec.provenance or {}).get("kind", "unknown")),
    )


# ------------------------------------------------------------------------------------------------------- filtering


def _workload_names(workload: str) -> set[str]:
    """The stored workload names `workload` (as typed) matches: a file by its name or stem, a sample by its name
    or its old one (`SAMPLE_ALIASES`: searches stored before the rename carry the old)."""
    from autotune.workloads import SAMPLE_ALIASES

    text = workload.strip().removeprefix("builtin:")
    names = {text, Path(text).stem, Path(text).name}
    return names | {SAMPLE_ALIASES[n] for n in names if n in SAMPLE_ALIASES} | {
        old for old, new in SAMPLE_ALIASES.items() if new in names}


def _objective_matches(given: str, label: str) -> bool:
    return given == label or label.split("-", 1)[0] == given


def _check_objective(given: str) -> None:
    name = given.split("-", 1)[0]
    if name not in OBJECTIVES:
        raise UsageError(
            f"--objective {given!r}: {did_you_mean(given, OBJECTIVES)}objectives are {', '.join(OBJECTIVES)}, "
            "with SLOs as search names them (e.g. latency-tpot12, goodput-tpot30-ttft500)."
        )


def _wanted_gpu(given: str, stored: Iterable[str]) -> str:
    """The key of a typed GPU: a catalog GPU's, "cpu", or a stored name typed as stored; else the catalog's error."""
    if given.strip().lower() == "cpu":
        return "cpu"
    from autotune.catalogs import get_gpu

    try:
        return get_gpu(given).key
    except PeagleError:
        for name in stored:
            if name.lower() == given.strip().lower():
                return name
        raise


def _listed(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in sorted(set(values), key=lambda v: (str(type(v)), v)))


def matching(records: Iterable[Any], criteria: Criteria) -> list[Entry]:
    """The records meeting every criterion given, newest first. Raises `NotFoundError` naming the first criterion
    that left nothing and what is stored instead (closest names first), or `UsageError` for a GPU or objective that
    does not exist."""
    if criteria.objective is not None:
        _check_objective(criteria.objective)
    found = sorted((entry(r) for r in records), key=lambda e: e.order, reverse=True)
    gpu = None if criteria.gpu is None else _wanted_gpu(criteria.gpu, (e.gpu for e in found))
    search_hint = _search_hint(criteria)
    if not found:
        args = f"--model {_word(criteria.model)}" + (f" --gpu {shell_word(criteria.gpu)}" if criteria.gpu else "")
        raise NotFoundError(f"No recommendation is stored yet: run `peagle-tune search {args}` first.")
    if criteria.model is not None:
        stored = sorted({str(e.rec.model) for e in found})
        kept = [e for e in found if e.rec.model == criteria.model]
        if not kept:
            from autotune.catalogs import model_names

            short = {m: m.rstrip("/").rsplit("/", 1)[-1] for m in stored}
            known = {**model_names(), **short, **{s: s for s in short.values()}}
            guess = did_you_mean(criteria.model, known)
            there = f" (stored: {', '.join(stored)})" if stored else ""
            raise NotFoundError(
                f"No recommendation is stored for model {criteria.model!r}{there}. {_sentence(guess)}{search_hint}"
            )
        found = kept
    steps: list[tuple[str, str, Any]] = []
    if gpu is not None:
        steps.append(("--gpu", "GPUs", gpu))
    if criteria.workload is not None:
        steps.append(("--workload", "workloads", criteria.workload))
    if criteria.objective is not None:
        steps.append(("--objective", "objectives", criteria.objective))
    if criteria.concurrency is not None:
        steps.append(("--concurrency", "concurrencies", criteria.concurrency))
    for option, what, wanted in steps:
        kept = [e for e in found if _meets(option, wanted, e)]
        if not kept:
            stored_values = [_value(option, e) for e in found]
            guess = did_you_mean(str(wanted), [str(v) for v in stored_values]) if option == "--workload" else ""
            of = f" of {criteria.model}" if criteria.model else ""
            raise NotFoundError(
                f"No stored recommendation{of} matches {option} {wanted} "
                f"({'stored ' + what + ': ' + _listed(stored_values) if stored_values else 'none is stored'}). "
                f"{_sentence(guess)}{search_hint}"
            )
        found = kept
    return found


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _meets(option: str, wanted: Any, e: Entry) -> bool:
    if option == "--gpu":
        return bool(e.gpu == wanted)
    if option == "--workload":
        return e.workload in _workload_names(str(wanted))
    if option == "--objective":
        return _objective_matches(str(wanted), e.objective)
    return e.concurrency == wanted


def _value(option: str, e: Entry) -> Any:
    return {"--gpu": e.gpu, "--workload": e.workload, "--objective": e.objective}.get(option, e.concurrency)


def _search_hint(criteria: Criteria) -> str:
    args = [f"--model {_word(criteria.model)}"]
    args += [f"--gpu {shell_word(criteria.gpu)}"] if criteria.gpu else []
    args += [f"--workload {shell_word(criteria.workload)}"] if criteria.workload else []
    args += [f"--concurrency {criteria.concurrency}"] if criteria.concurrency is not None else []
    return f"`peagle-tune show` lists what is stored; `peagle-tune search {' '.join(args)}` makes one."


def newest_per_concurrency(entries: Iterable[Entry]) -> list[Entry]:
    """Each search's newest recommendation per concurrency (a re-run supersedes the earlier one), newest first."""
    seen: dict[tuple[Any, ...], Entry] = {}
    for e in sorted(entries, key=lambda e: e.order, reverse=True):
        seen.setdefault((*e.search, e.concurrency), e)
    return list(seen.values())


def check(rec: Any, criteria: Criteria) -> Entry:
    """`rec` (chosen by id) if it agrees with every criterion also given; else a `UsageError` saying which not."""
    e = entry(rec)
    wrong = []
    if criteria.model is not None and rec.model != criteria.model:
        wrong.append(f"model {rec.model}, not {criteria.model}")
    if criteria.gpu is not None and e.gpu != _wanted_gpu(criteria.gpu, [e.gpu]):
        wrong.append(f"GPU {e.gpu}, not {criteria.gpu}")
    if criteria.workload is not None and e.workload not in _workload_names(criteria.workload):
        wrong.append(f"workload {e.workload}, not {criteria.workload}")
    if criteria.objective is not None and not _objective_matches(criteria.objective, e.objective):
        wrong.append(f"objective {e.objective}, not {criteria.objective}")
    if criteria.concurrency is not None and e.concurrency != criteria.concurrency:
        wrong.append(f"concurrency {e.concurrency}, not {criteria.concurrency}")
    if wrong:
        raise UsageError(
            f"Recommendation #{e.id} is for {'; '.join(wrong)}: drop --recommendation or the options it contradicts."
        )
    return e


# -------------------------------------------------------------------------------------------------------- choosing

#: The options that tell candidates apart, in the order they are suggested, with the entry field each compares.
_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--concurrency", "concurrency"), ("--gpu", "gpu"), ("--workload", "workload"), ("--objective", "objective"),
)


def _telling_apart(candidates: Sequence[Entry], criteria: Criteria, *, fields: Sequence[str]) -> list[str]:
    """``--concurrency C (1, 8 or 64)``-style hints for each option not given whose values differ among candidates;
    ``--recommendation ID`` when none does."""
    hints = []
    for option, name in _OPTIONS:
        if name not in fields or getattr(criteria, name) is not None:
            continue
        values = sorted({getattr(c, name) for c in candidates}, key=lambda v: (v is None, str(type(v)), v))
        if len(values) > 1:
            shown = ", ".join(str(v) for v in values[:-1]) + f" or {values[-1]}"
            hints.append(f"{option} ({shown})")
    return hints or ["--recommendation ID"]


def _ambiguous(candidates: Sequence[Entry], criteria: Criteria, what: str, fields: Sequence[str],
               differ: str = " and differ in config") -> Ambiguous:
    hints = _telling_apart(candidates, criteria, fields=fields)
    fix = "pass --recommendation ID" if hints == ["--recommendation ID"] else \
        f"add {' and '.join(hints)}, or pass --recommendation ID"
    asked = criteria.described()
    return Ambiguous(
        f"{len(candidates)} {what} match{' ' + asked if asked else ''}{differ} (listed above): {fix}.",
        candidates,
        [h.split()[0] for h in hints],
    )


def choose_one(records: Iterable[Any], criteria: Criteria) -> Choice:
    """The one recommendation `criteria` mean (see the module docstring). Raises `NotFoundError` when none
    matches, `Ambiguous` when several that differ in config do."""
    candidates = newest_per_concurrency(matching(records, criteria))
    configs = {_config_key(c.config) for c in candidates}
    if len(configs) > 1:
        raise _ambiguous(sorted(candidates, key=_listing_order), criteria, "recommendations",
                         [name for _, name in _OPTIONS])
    chosen = candidates[0]
    return Choice(chosen, search=tuple(_search_of(chosen, candidates)), same_config=tuple(candidates[1:]))


def choose_search(records: Iterable[Any], criteria: Criteria) -> Choice:
    """One search's highest-concurrency recommendation (with the search, one per concurrency): `Ambiguous` when the
    matching searches were run for different GPUs, or differ in that recommendation's config or schedule (the
    newest of searches that agree is chosen, the others in `Choice.same_config`)."""
    candidates = newest_per_concurrency(matching(records, criteria))
    searches: dict[tuple[str, ...], list[Entry]] = {}
    for c in candidates:
        searches.setdefault(c.search, []).append(c)
    tops = sorted((_top(items) for items in searches.values()),
                  key=lambda e: max(x.order for x in searches[e.search]), reverse=True)
    if len({t.gpu for t in tops}) > 1:  # figures, schedule and priors are one GPU's
        newest_per_gpu = {t.gpu: t for t in reversed(tops)}
        raise _ambiguous(sorted(newest_per_gpu.values(), key=_listing_order), criteria, "searches", ["gpu"],
                         " on different GPUs")
    if len({(_config_key(t.config), _config_key(t.rec.schedule or [])) for t in tops}) > 1:
        raise _ambiguous(sorted(tops, key=_listing_order), criteria, "searches", ["gpu", "workload", "objective"])
    chosen = tops[0]
    return Choice(chosen, search=tuple(sorted(searches[chosen.search], key=_by_concurrency)),
                  same_config=tuple(tops[1:]))


DrafterKey = tuple[str, bool]
"""A drafter as served: its id (``org/name``, ``:N-layer`` for a variant) and parallel drafting; ``("", False)``:
no speculation."""


@dataclass(frozen=True)
class Load:
    """One load of a search: the drafter best there and each drafter's figure (its best config's tokens/s)."""

    entry: Entry
    best: DrafterKey
    tokens_per_s: dict[DrafterKey, float]


@dataclass(frozen=True)
class DrafterSplit:
    """A search whose loads have different best drafters (`drafter_by_load`)."""

    served: DrafterKey
    """The drafter of the search's highest concurrency: the one a server for every load serves."""
    loads: tuple[Load, ...]
    """Lowest concurrency first."""
    configs: dict[DrafterKey, dict[str, Any]]
    """A config of each drafter named (to name it)."""

    @property
    def others(self) -> list[DrafterKey]:
        """The drafters best at some load other than the served one's, in load order."""
        return list(dict.fromkeys(x.best for x in self.loads if x.best != self.served))


def drafter_key(config: Mapping[str, Any]) -> DrafterKey:
    if not config.get("drafter") or not config.get("num_speculative_tokens"):
        return ("", False)
    return (str(config["drafter"]), bool(config.get("parallel_drafting")))


def drafter_by_load(search: Sequence[Entry]) -> DrafterSplit | None:
    """Where the best drafter of `search` (one recommendation per concurrency) is not the same at every load: each
    load's best, and there the figure of each drafter's best config as the search stored it (``per_drafter`` in
    its metrics; no speculation's from the speedup over it). None where one drafter is best at every load."""
    if len({drafter_key(e.config) for e in search}) < 2:
        return None
    loads = []
    configs: dict[DrafterKey, dict[str, Any]] = {}
    for e in sorted(search, key=_by_concurrency):
        metrics = e.rec.metrics or {}
        figures: dict[DrafterKey, float] = {}
        for row in metrics.get("per_drafter") or ():
            key, tps = drafter_key(row.get("best_config") or {}), row.get("output_tokens_per_s")
            if isinstance(tps, int | float) and key[0]:
                figures[key] = max(float(tps), figures.get(key, 0.0))
                configs.setdefault(key, dict(row["best_config"]))
        best = drafter_key(e.config)
        configs.setdefault(best, e.config)
        if e.tokens_per_s is not None:
            figures[best] = e.tokens_per_s
        speedup = metrics.get("speedup_vs_no_spec")
        if e.tokens_per_s is not None and isinstance(speedup, int | float) and speedup > 0:
            figures.setdefault(("", False), e.tokens_per_s / speedup)
        loads.append(Load(e, best, figures))
    return DrafterSplit(served=drafter_key(_top(search).config), loads=tuple(loads), configs=configs)


def _top(items: Sequence[Entry]) -> Entry:
    """A search's recommendation at its highest concurrency (the newest of equals)."""
    return max(items, key=lambda e: (e.concurrency or 0, e.order))


def _search_of(chosen: Entry, candidates: Sequence[Entry]) -> list[Entry]:
    return sorted((c for c in candidates if c.search == chosen.search), key=_by_concurrency)


def _by_concurrency(e: Entry) -> tuple[int, tuple[dt.datetime, int]]:
    return (e.concurrency or 0, e.order)


def _listing_order(e: Entry) -> tuple[Any, ...]:
    return (str(e.rec.model), e.gpu, e.workload, e.objective, e.concurrency or 0, e.id)


def _config_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def with_search(choice: Choice, records: Iterable[Any]) -> Choice:
    """`choice` with its search filled in from `records` (for a recommendation chosen by id)."""
    mine = newest_per_concurrency(e for e in (entry(r) for r in records) if e.search == choice.entry.search)
    by_c = {e.concurrency: e for e in mine}
    by_c[choice.entry.concurrency] = choice.entry
    return dataclasses.replace(choice, search=tuple(sorted(by_c.values(), key=_by_concurrency)))


__all__ = [
    "Ambiguous",
    "Choice",
    "Criteria",
    "DrafterSplit",
    "Entry",
    "Load",
    "check",
    "choose_one",
    "choose_search",
    "concurrency_of",
    "drafter_by_load",
    "drafter_key",
    "entry",
    "gpu_key",
    "matching",
    "newest_per_concurrency",
    "objective_label",
    "with_search",
]


def _word(model: str | None) -> str:
    """A --model value for a hint: the name, shell-quoted, or the placeholder MODEL."""
    return shell_word(model) if model else "MODEL"
