"""`peagle-tune show`."""

from __future__ import annotations

import json
from typing import Any

import click

from autotune.cli._common import (
    canonical_model,
    console,
    db_option,
    echo,
    errors,
    open_store,
    wide_console,
)
from autotune.cli._select import selection_options
from autotune.selection import Criteria


@click.command()
@click.option("--recommendations/--no-recommendations", default=True, help="List recommendations (the default).")
@click.option("--profiles", is_flag=True, help="List stored acceptance/step-cost profiles.")
@click.option("--trials", "trials_study", default=None, metavar="STUDY", help="List the trials of this study.")
@click.option("--studies", is_flag=True, help="List studies with trial counts.")
@click.option("--simulations", is_flag=True, help="List stored simulations (peagle-tune simulate; predicted).")
@click.option("--simulation", "simulation_study", default=None, metavar="STUDY",
              help="Show one stored simulation's tables, as `peagle-tune simulate` printed them.")
@click.option("--compare", "compare_ids", nargs=2, default=None, metavar="ID ID",
              help="Two recommendations (ids, or study names: the study's recommendation) side by side: config and "
                   "figures, searched, predicted and benchmarked, with what differs.")
@click.option("--model", default=None, help="Only this model.")
@selection_options
@click.option("--wide", is_flag=True, help="Full ids, GPU names and failure reasons (tables wider than 80 columns).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@db_option
@errors
def show(
    recommendations: bool,
    profiles: bool,
    trials_study: str | None,
    studies: bool,
    simulations: bool,
    simulation_study: str | None,
    compare_ids: tuple[str, str] | None,
    model: str | None,
    rec_id: int | None,
    concurrency: int | None,
    gpu: str | None,
    workload: str | None,
    objective: str | None,
    wide: bool,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Show stored recommendations, studies, trials and profiles.

    Recommendations are selected as `export` and `serve` select them: --model, --gpu, --workload, --objective,
    --concurrency, --recommendation ID; nothing matching is exit code 3 (with the closest names stored).

    \b
    Example:
      peagle-tune show
      peagle-tune show --model gpt-oss-120b --concurrency 64
      peagle-tune show --studies
      peagle-tune show --trials STUDY --json
      peagle-tune show --profiles --wide
      peagle-tune show --simulations
      peagle-tune show --compare 3 7
    """
    from autotune import selection
    from autotune.cli import _tables
    from autotune.errors import NotFoundError
    from autotune.report import objective_directions

    store = open_store(db_url, existing=True)
    if model:
        model = canonical_model(model)
    payload: dict[str, Any] = {}
    if compare_ids:
        payload["compare"] = _compared(store, compare_ids)
    elif trials_study:
        trials_study = _study_named(store, trials_study)
        payload["trials"] = [t.to_dict() for t in store.list_trials(study=trials_study)]
        if not payload["trials"]:
            raise NotFoundError(
                f"No study named {trials_study!r} has trials stored. `peagle-tune show --studies` lists the studies."
            )
    elif simulation_study:
        from autotune.simulate import load_simulation

        payload["simulation"] = load_simulation(store, simulation_study)
    elif simulations:
        from autotune.simulate import list_simulations

        payload["simulations"] = [s.to_dict() for s in list_simulations(store, model=model)]
    elif studies:
        studies_found = store.list_studies(directions=objective_directions())
        payload["studies"] = [s.to_dict() if hasattr(s, "to_dict") else dict(s) for s in studies_found]
        recommended: dict[str, Any] = {}
        for rec in store.list_recommendations():  # newest first: a study's newest recommendation wins
            if rec.study:
                recommended.setdefault(rec.study, rec)
        for row in payload["studies"]:  # "best" is the recommendation, with its figures and kind
            rec = recommended.get(str(row.get("study")))
            row["recommendation"] = None if rec is None else {
                "id": rec.id, "best_config": rec.best_config, "metrics": rec.metrics,
                "kind": (rec.provenance or {}).get("kind"), "objective": rec.objective}
    elif profiles:
        payload["profiles"] = [p.to_dict() for p in store.list_profiles(model=model)]
    elif recommendations:
        criteria = Criteria(model=model, gpu=gpu, workload=workload, objective=objective, concurrency=concurrency)
        if rec_id is not None:
            chosen = [selection.check(store.get_recommendation(rec_id), criteria).rec]
        elif criteria != Criteria():
            chosen = [e.rec for e in selection.matching(store.list_recommendations(), criteria)]
        else:
            chosen = store.list_recommendations()
        payload["recommendations"] = [_with_benchmarks(store, r.to_dict()) for r in chosen]
    if "simulation" in payload:
        from autotune.cli.simulate import render

        result = payload["simulation"]
        echo(json.dumps({**result.to_dict(), "stored_as": simulation_study}, indent=2, default=str)
             if as_json else render(result))
        return
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    out = wide_console() if wide else console
    for key, rows in payload.items():
        if key == "compare":
            out.print(_tables.compare_view(*rows["recommendations"]))
        elif key == "simulations":
            from autotune.cli.simulate import simulations_view

            out.print(simulations_view(rows, wide=wide))
        elif key == "trials":
            out.print(_tables.trials_view(str(trials_study), rows, wide=wide))
        elif key == "studies":
            out.print(_tables.studies_view(rows, wide=wide))
        elif key == "profiles":
            out.print(_tables.profiles_view(rows, wide=wide))
        else:
            out.print(_tables.recommendations_view(rows, wide=wide))
            for row in rows:
                if row.get("benchmarks"):
                    out.print()
                    out.print(_tables.bench_view(row, row["benchmarks"]))


def _with_benchmarks(store: Any, rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` with its stored benchmarks (newest first), each with its figures beside the recommendation's and the
    error (`autotune.bench.compare`); a recommendation never benchmarked is left as it is."""
    from autotune.bench import compare

    benchmarks = store.list_benchmarks(rec["id"])
    if not benchmarks:
        return rec
    metrics = rec.get("metrics") or {}
    return {**rec, "benchmarks": [
        {**b.to_dict(), "comparison": [e.to_dict() for e in compare(metrics, b.figures)]} for b in benchmarks]}


def _compared(store: Any, ids: tuple[str, str]) -> dict[str, Any]:
    """Both recommendations of --compare (with their benchmarks), the rows side by side and the names of those that
    differ. A study name stands for that study's recommendation at the other's concurrency, else its highest."""
    from autotune.cli._tables import compare_rows
    from autotune.errors import NotFoundError, UsageError

    def by_id(text: str) -> dict[str, Any] | None:
        return _with_benchmarks(store, store.get_recommendation(int(text)).to_dict()) if text.isdigit() else None

    def by_study(name: str, other: dict[str, Any] | None) -> dict[str, Any]:
        name = _study_named(store, name)
        recs = [r for r in store.list_recommendations() if r.study == name]
        if not recs:
            raise NotFoundError(f"--compare: {name!r} is neither a recommendation id nor a study with a "
                                "recommendation; `peagle-tune show` and `show --studies` list them.")
        level = (other or {}).get("scenario", {}).get("concurrency")
        same = [r for r in recs if r.scenario.get("concurrency") == level]
        rec = same[0] if same else max(recs, key=lambda r: int(r.scenario.get("concurrency") or 0))
        return _with_benchmarks(store, rec.to_dict())

    first, second = by_id(ids[0]), by_id(ids[1])
    first = first if first is not None else by_study(ids[0], second)
    second = second if second is not None else by_study(ids[1], first)
    if first["id"] == second["id"]:
        raise UsageError(f"--compare needs two different recommendations, but both are #{first['id']}.")
    rows = compare_rows(first, second)
    return {"recommendations": [first, second],
            "rows": [{"what": what, "first": a, "second": b, "differs": d} for what, a, b, d in rows],
            "differs": [what for what, _a, _b, d in rows if d and what != "stored"]}


def _study_named(store: Any, name: str) -> str:
    """`name`, or the one study whose name starts and ends as a name cut in the middle with ``...`` (as narrow
    tables print long names) does; a cut name that fits no study or several is left for the caller to report."""
    if "..." not in name:
        return name
    head, _, tail = name.partition("...")
    names = [str(s.study) for s in store.list_studies()]
    found = [n for n in names if n.startswith(head) and n.endswith(tail) and len(n) >= len(head) + len(tail)]
    return found[0] if len(found) == 1 else name
