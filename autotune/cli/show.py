"""`peagle-tune show`."""

from __future__ import annotations

import json
from typing import Any

import click

from autotune.cli._common import (
    canonical_model,
    console,
    db_option,
    errors,
    open_store,
)


@click.command()
@click.option("--recommendations/--no-recommendations", default=True, help="List recommendations.")
@click.option("--profiles", is_flag=True, help="List stored acceptance/step-cost profiles.")
@click.option("--trials", "trials_study", default=None, help="List the trials of this study.")
@click.option("--studies", is_flag=True, help="List studies with trial counts.")
@click.option("--model", default=None, help="Only this model.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@db_option
@errors
def show(
    recommendations: bool,
    profiles: bool,
    trials_study: str | None,
    studies: bool,
    model: str | None,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Show stored recommendations, studies, trials and profiles.

    Example:

        peagle-tune show --studies

        peagle-tune show --trials gpt-oss-120b-nvidia-h200-mt-bench-throughput-c8 --json
    """
    from autotune.cli._tables import records_table
    from autotune.report import objective_directions

    store = open_store(db_url)
    if model:
        model = canonical_model(model)
    payload: dict[str, Any] = {}
    if trials_study:
        payload["trials"] = [t.to_dict() for t in store.list_trials(study=trials_study)]
    elif studies:
        studies_found = store.list_studies(directions=objective_directions())
        payload["studies"] = [dict(s) if not hasattr(s, "to_dict") else s.to_dict() for s in studies_found]
    elif profiles:
        payload["profiles"] = [p.to_dict() for p in store.list_profiles(model=model)]
    elif recommendations:
        payload["recommendations"] = [r.to_dict() for r in store.list_recommendations(model=model)]
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    for key, rows in payload.items():
        console.print(records_table(key, rows))
