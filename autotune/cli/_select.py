"""The options `serve`, `export` and `show` select recommendations by, and the CLI side of choosing one: the rule is
`autotune.selection`; this module fetches the records, draws the candidates when the choice is the user's (on
stderr, before the one-line error) and words the choice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from autotune.cli._bounds import number
from autotune.cli._common import err_console
from autotune.selection import Ambiguous, Choice, Criteria, Entry

F = TypeVar("F", bound=Callable[..., Any])

Unit = Literal["one", "search"]

recommendation_option = click.option(
    "--recommendation", "rec_id", type=number("--recommendation"), default=None, metavar="ID",
    help="The recommendation with this id (`peagle-tune show` lists them); the other options must agree with it.")
concurrency_option = click.option(
    "--concurrency", type=number("--concurrency"), default=None, metavar="C",
    help="Only recommendations tuned for concurrency C.")
gpu_option = click.option(
    "--gpu", default=None, metavar="GPU",
    help="Only recommendations tuned for this GPU (h200, \"NVIDIA H100 PCIe\", ...; cpu).")
workload_option = click.option(
    "--workload", default=None, metavar="W", help="Only recommendations tuned on this workload (mt-bench, ...).")
objective_option = click.option(
    "--objective", default=None, metavar="OBJ",
    help="Only recommendations of this objective: throughput, latency, goodput, pareto, or with its SLOs as `show` "
    "names it (latency-tpot12).")


def selection_options(f: F) -> F:
    """--recommendation, --concurrency, --gpu, --workload and --objective, the same on every command that selects."""
    for option in (objective_option, workload_option, gpu_option, concurrency_option, recommendation_option):
        f = option(f)
    return f


def choose(store: Any, criteria: Criteria, rec_id: int | None, unit: Unit = "one") -> Choice:
    """The recommendation `rec_id` (checked against `criteria`), else the one `criteria` select (`unit`: one
    recommendation, or a search's highest concurrency). When the choice is the user's, the candidates are drawn on
    stderr and `autotune.selection.Ambiguous` (a usage error: exit 2) is raised."""
    from autotune import selection

    if rec_id is not None:
        records = store.list_recommendations(model=criteria.model)
        chosen = selection.check(store.get_recommendation(rec_id), criteria)
        return selection.with_search(Choice(chosen), records)
    records = store.list_recommendations(model=None)
    try:
        if unit == "one":
            return selection.choose_one(records, criteria)
        return selection.choose_search(records, criteria)
    except Ambiguous as exc:
        show_candidates(exc.candidates)
        raise


def show_candidates(entries: tuple[Entry, ...] | list[Entry]) -> None:
    from autotune.cli._tables import candidates_table

    err_console.print(candidates_table(entries))


def search_words(choice: Choice) -> str:
    """``mt-bench, throughput, predicted; concurrency 1, 8, 64 (#1, #2, #3)``: the chosen search in words."""
    e = choice.entry
    levels = ", ".join(str(x.concurrency) for x in choice.search)
    ids = ", ".join(f"#{x.id}" for x in choice.search)
    return f"{e.workload}, {e.objective}, {e.kind}; concurrency {levels} ({ids})"


def schedule_words(rec: Any) -> str:
    """``1: K=4, 2-15: K=3, 16-64: K=4`` (the stored batch-size schedule), or "" without one."""
    parts = []
    for item in rec.schedule or []:
        lo, hi, k = item.get("batch_min"), item.get("batch_max"), item.get("k")
        parts.append(f"{lo}: K={k}" if lo == hi else f"{lo}-{hi}: K={k}")
    return ", ".join(parts)
