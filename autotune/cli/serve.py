"""`peagle-tune serve`."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli._common import canonical_model, db_option, err_console, errors, open_store


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", required=True, help="Target model: catalog name, HF id or local path (what vLLM loads).")
@click.option("--recommendation", "rec_id", type=int, default=None,
              help="Recommendation id (default: the newest for this model on this machine's device).")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Policy file (`peagle-tune export --format policy`): overrides classes, caps and static K.")
@click.option("--drafter", default=None, help="Serve this drafter (id or path) instead of the recommended one.")
@click.option("--max-k", type=int, default=None,
              help="Drafter depth: the deepest depth the controller may verify (default: the policy's max_k).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the plugin config, statistics and metrics files (default: <tmp>/peagle-serve-PORT).")
@click.option("--record-every", "record_every_s", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="Store the live profile every SECONDS (and at shutdown).")
@click.option("--drift-threshold", type=float, default=0.15, show_default=True,
              help="Warn (suggest re-tuning) when live AL at the static K moves more than this fraction.")
@click.option("--no-classify", is_flag=True,
              help="Do not classify requests in the API server (every request starts in the policy's default "
                   "class; vllm_xargs.peagle_class can only move it to a class no deeper).")
@click.option("--no-record", is_flag=True, help="Do not store live profiles.")
@click.option("--dry-run", is_flag=True, help="Print the command, environment and plugin config; do not launch.")
@db_option
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@errors
def serve(
    model: str,
    rec_id: int | None,
    policy_path: Path | None,
    drafter: str | None,
    max_k: int | None,
    host: str,
    port: int,
    run_dir: Path | None,
    record_every_s: float,
    drift_threshold: float,
    no_classify: bool,
    no_record: bool,
    dry_run: bool,
    db_url: str | None,
    vllm_args: tuple[str, ...],
) -> None:
    """Serve a model with vLLM, its tuned speculative config and the adaptive depth controller.

    Looks up the tuned config (the recommendation for this model and device; a policy file overrides its classes
    and caps; acceptance and step costs come from the newest stored profile), launches `vllm serve` with the
    scheduler plugin that picks the verified depth per step and per request, and stores live acceptance and step
    times as a "live" profile. Requests are classified by served model name and prompt; a client may ask for a
    class with `"vllm_xargs": {"peagle_class": "code"}`, which the policy grants only if it is no deeper (its
    `clients:` section can allow more), cap its own depth with `{"peagle_max_k": 1}` and opt out with
    `{"peagle_speculate": false}`.
    The plugin's Prometheus gauges (peagle:*) appear in vLLM's /metrics. Arguments after `--` go to `vllm serve`.

    Example:

        peagle-tune serve --model gpt-oss-120b

        peagle-tune serve --model ./target --policy policy.yaml --dry-run -- --dtype float32 --max-model-len 512
    """
    from autotune.errors import UsageError
    from autotune.serving import (
        LOOPBACK,
        DriftReport,
        LiveRecorder,
        build_launch,
        resolve_tuned_config,
        run_server,
    )

    if record_every_s <= 0:
        raise UsageError(f"--record-every must be a number of seconds > 0, but got {record_every_s}.")
    if not 0 < drift_threshold < 10:
        raise UsageError(f"--drift-threshold is a relative change like 0.15 (15%), but got {drift_threshold}.")
    store = open_store(db_url)
    name = canonical_model(model)
    tuned = resolve_tuned_config(
        store, name, recommendation_id=rec_id, policy_path=policy_path, drafter=drafter, max_k=max_k
    )
    launch = build_launch(
        tuned, host=host, port=port, run_dir=run_dir, extra_args=vllm_args, classify=not no_classify
    )

    def log(line: str) -> None:
        err_console.print(line, highlight=False, markup=False, soft_wrap=True)

    rec = tuned.recommendation
    log(f"peagle-tune serve: recommendation #{rec.get('id')} ({rec.get('objective')}, {rec.get('gpu')}): "
        f"{tuned.spec.label()}, static K={tuned.static_k}.")
    log(f"  mode: {launch.plugin.mode}; acceptance priors: {tuned.acceptance_source or 'none'}; "
        f"step cost: {tuned.cost_source or 'none'}.")
    for note in tuned.notes:
        log(f"  note: {note}")
    if host != LOOPBACK:
        log(f"  warning: binding {host}: the server is reachable from other machines (no authentication unless "
            "you pass --api-key after --).")
    if dry_run:
        click.echo(launch.describe(), nl=False)
        return
    recorder = None
    if not no_record:
        recorder = LiveRecorder(store, tuned, launch.stats_path, log=log, drift_threshold=drift_threshold)
    code = run_server(launch, recorder, record_every_s=record_every_s, log=log)
    if recorder is not None and recorder.last_live is not None:
        live = recorder.last_live
        totals = live.totals
        drafts = totals.get("num_drafts", 0)
        al = 1 + totals.get("num_accepted_tokens", 0) / drafts if drafts else float("nan")
        log(f"peagle-tune serve: {live.decode_steps} decode steps, {drafts} drafts, mean AL {al:.2f} (measured); "
            f"live profiles stored: {recorder.profile_ids or 'none'}.")
        report: DriftReport | None = recorder.last_drift
        if report is not None and not report.drifted:
            checked = [r for r in report.rows if r["enough"]]
            if checked:
                log(f"  live acceptance at K={report.k} is within {report.threshold:.0%} of the tuned profile for "
                    f"{', '.join(r['class'] for r in checked)}.")
            else:
                log(f"  too few drafts judged at position {report.k} to check drift (each class needs "
                    f"{recorder.min_drafts}).")
    if code not in (0, -2, -15, 130, 143):
        raise click.ClickException(f"vllm serve exited with code {code}; see its log above.")
