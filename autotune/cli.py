"""The `peagle-tune` command line: a thin layer over the library. Library errors become click errors only here."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from autotune import __version__
from autotune.exceptions import PeagleError, UsageError

F = TypeVar("F", bound=Callable[..., Any])

console = Console()
err_console = Console(stderr=True)


class _UsageFailure(click.ClickException):
    """A usage error (bad model name, K out of range, ...): one line, exit code 2."""

    exit_code = 2


def _errors(fn: F) -> F:
    """Translate library errors into one-line click errors (exit 2 for usage errors, 1 otherwise)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from store import StoreError

        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            raise _UsageFailure(str(exc)) from exc
        except (PeagleError, StoreError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def _int_list(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers like 1,8,64, but got {value!r}.") from None
    if not out or any(v < 1 for v in out):
        raise UsageError(f"{option} takes positive integers like 1,8,64, but got {value!r}.")
    return out


db_option = click.option(
    "--db",
    "db_url",
    envvar="PEAGLE_DB",
    default=None,
    help="Database URL or SQLite file path (default: peagle.db in your data directory; env PEAGLE_DB).",
)


def _open_store(db_url: str | None) -> Any:
    from store import Store

    if db_url and "://" not in db_url:
        db_url = f"sqlite:///{Path(db_url).expanduser().resolve()}"
    return Store(db_url)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="peagle-tune")
def main() -> None:
    """Tune and serve speculative decoding (P-EAGLE / EAGLE-3) for vLLM.

    Example:

        peagle-tune search --model gpt-oss-120b --gpu h200

        peagle-tune export --format vllm-json
    """


@main.command()
@click.option("--model", required=True, help="Target model: catalog name (gpt-oss-120b), HF id or local path.")
@click.option("--gpu", default=None, help="GPU to predict for (h100, h200, b200, a100, l40s). Default: h200.")
@click.option(
    "--workload", default="mt-bench", show_default=True, help="Built-in workload name or a .jsonl/.json file."
)
@click.option("--concurrency", default="1,8,64", show_default=True, help="Comma-separated concurrencies to tune for.")
@click.option(
    "--objective", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True
)
@click.option("--trials", type=int, default=60, show_default=True, help="Trials per concurrency.")
@click.option("--backend", type=click.Choice(["auto", "model", "vllm"]), default="auto", show_default=True)
@click.option("--drafter", "drafters", multiple=True, help="Drafter id or path (repeatable). Default: the catalog's.")
@click.option("--max-k", type=int, default=8, show_default=True, help="Largest draft depth K to consider.")
@click.option(
    "--max-num-seqs", default=None, help="Comma-separated max_num_seqs choices (default: around each concurrency)."
)
@click.option("--parallel-drafting", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True)
@click.option("--study", default=None, help="Study name prefix; re-running with the same name resumes it.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@db_option
@_errors
def search(
    model: str,
    gpu: str | None,
    workload: str,
    concurrency: str,
    objective: str,
    trials: int,
    backend: str,
    drafters: tuple[str, ...],
    max_k: int,
    max_num_seqs: str | None,
    parallel_drafting: str,
    study: str | None,
    seed: int,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Search drafter, K, parallel drafting and max_num_seqs for a model and store the best config.

    With no GPU and no loadable model it predicts with the model backend (roofline + published acceptance)
    and says so; with vLLM and a local model it measures real trials.

    Example:

        peagle-tune search --model gpt-oss-120b --gpu h200 --concurrency 1,8,64
    """
    from autotune.runner import SearchOptions, run_search

    options = SearchOptions(
        model=model,
        gpu=gpu,
        workload=workload,
        concurrencies=_int_list(concurrency, "--concurrency"),
        objective=objective,
        trials=trials,
        backend=backend,
        drafters=list(drafters),
        max_k=max_k,
        max_num_seqs=_int_list(max_num_seqs, "--max-num-seqs") if max_num_seqs else None,
        parallel_drafting=parallel_drafting,
        study=study,
        seed=seed,
    )
    store = _open_store(db_url)
    run_search(store, options, console=err_console if as_json else console, as_json=as_json)


@main.command()
@click.option("--recommendations/--no-recommendations", default=True, help="List recommendations.")
@click.option("--profiles", is_flag=True, help="List stored acceptance/step-cost profiles.")
@click.option("--trials", "trials_study", default=None, help="List the trials of this study.")
@click.option("--studies", is_flag=True, help="List studies with trial counts.")
@click.option("--model", default=None, help="Only this model.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@db_option
@_errors
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
    from autotune import report_tables as rt

    store = _open_store(db_url)
    if model:
        model = _canonical_model(model)
    payload: dict[str, Any] = {}
    if trials_study:
        payload["trials"] = [t.to_dict() for t in store.list_trials(study=trials_study)]
    elif studies:
        payload["studies"] = [dict(s) if not hasattr(s, "to_dict") else s.to_dict() for s in store.list_studies()]
    elif profiles:
        payload["profiles"] = [p.to_dict() for p in store.list_profiles(model=model)]
    elif recommendations:
        payload["recommendations"] = [r.to_dict() for r in store.list_recommendations(model=model)]
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    for key, rows in payload.items():
        console.print(rt.table(key, rows))


def _canonical_model(model: str) -> str:
    from autotune.catalogs import resolve_model

    try:
        return resolve_model(model).name
    except PeagleError:
        return model


@main.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["vllm-json", "vllm-args", "yaml", "schedule", "policy"]),
    default="vllm-json",
    show_default=True,
)
@click.option("--recommendation", "rec_id", type=int, default=None, help="Recommendation id (default: the newest).")
@click.option("--model", default=None, help="Newest recommendation for this model.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@db_option
@_errors
def export(
    fmt: str, rec_id: int | None, model: str | None, out_path: Path | None, force: bool, db_url: str | None
) -> None:
    """Export a recommendation in a form vLLM takes.

    Example:

        peagle-tune export --format vllm-json

        peagle-tune export --format yaml --out serve.yaml   # then: vllm serve --config serve.yaml
    """
    from autotune.export import render

    store = _open_store(db_url)
    if rec_id is not None:
        rec = store.get_recommendation(rec_id)
    else:
        rec = store.latest_recommendation(model=_canonical_model(model) if model else None)
        if rec is None:
            raise UsageError(
                "There is no recommendation to export"
                + (f" for model {model!r}" if model else "")
                + ". Run `peagle-tune search --model MODEL` first."
            )
    text, warnings = render(fmt, rec.to_dict())
    for w in warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}")
    if out_path is None:
        click.echo(text, nl=False)
        return
    if out_path.exists() and not force:
        raise UsageError(f"{out_path} exists; pass --force to overwrite it.")
    out_path.write_text(text)
    err_console.print(f"Wrote {fmt} for recommendation #{rec.id} to {out_path}")


@main.group()
def db() -> None:
    """Database maintenance.

    Example:

        peagle-tune db upgrade --db sqlite:///peagle.db
    """


@db.command("upgrade")
@db_option
@_errors
def db_upgrade(db_url: str | None) -> None:
    """Upgrade the database schema to this version of peagle-tune.

    Example:

        peagle-tune db upgrade
    """
    from store import default_db_url, upgrade

    if db_url and "://" not in db_url:
        db_url = f"sqlite:///{Path(db_url).expanduser().resolve()}"
    url = db_url or default_db_url()
    upgrade(url)
    console.print(f"Database {url} is at the current schema.")


@db.command("path")
@db_option
def db_path(db_url: str | None) -> None:
    """Print the database URL peagle-tune uses.

    Example:

        peagle-tune db path
    """
    from store import default_db_url

    click.echo(db_url or default_db_url())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
