"""`peagle-tune simulate`: predicted serving of every depth config, by discrete-event simulation."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import click

from autotune.cli._bounds import name_callback, number, numbers
from autotune.cli._common import db_option, echo, err_console, errors, open_store
from autotune.safe_text import shell_word

_WIDTH = 80
_CONFIG_COL = 30


@click.command()
@click.option("--model", default=None, callback=name_callback("--model"),
              help="Target model (catalog name, e.g. gpt-oss-120b). Not with --profile.")
@click.option("--gpu", default=None, callback=name_callback("--gpu"),
              help="GPU to predict for (h100, h200, b200, ...). Default: the catalog's.")
@click.option("--drafter", default=None, callback=name_callback("--drafter"),
              help="Drafter (default: the model's P-EAGLE head with published acceptance).")
@click.option("--max-k", type=number("--max-k"), default=None, help="The drafter's K (default: its trained K, else 8).")
@click.option("--workload", default=None,
              help="hf:mt-bench (or hf:humaneval, hf:gsm8k), a sample (sample-chat, ...; `sample-mixed` shifts "
              "between chat, code and math) or a .jsonl/.json file. Default: search's on the model backend "
              "(hf:mt-bench where cached, else sample-chat).")
@click.option("--classes", default=None, help="Comma-separated classes of the workload, in phase order (default: all).")
@click.option(
    "--shape",
    default="shifting,stationary",
    show_default=True,
    help="shifting: each class alone, then mixed; stationary: every phase mixed (comma-separated).",
)
@click.option("--concurrency", type=numbers("--concurrency"), default="1,8,64", show_default=True,
              help="Closed-loop concurrencies (comma-separated).")
@click.option("--rate", type=number("--rate"), default=None, metavar="REQ_PER_S",
              help="Open loop: Poisson arrivals at this rate.")
@click.option("--requests-per-phase", type=number("--requests-per-phase"), default=None,
              help="Requests per phase (default: max(48, 4 x c)).")
@click.option("--max-num-seqs", type=number("--max-num-seqs"), default=None,
              help="vLLM max_num_seqs (default: c; 256 with --rate).")
@click.option("--max-num-batched-tokens", type=number("--max-num-batched-tokens"), default=8192, show_default=True)
@click.option("--output-tokens", type=number("--output-tokens"), default=None,
              help="Output tokens per request (default: its max_tokens).")
@click.option("--chars-per-token", type=number("--chars-per-token"), default=4.0, show_default=True,
              help="Prompt length estimate.")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Policy file (classes, caps, controller settings) for the adaptive configs.",
)
@click.option("--profile", "profile_id", type=number("--profile"), default=None,
              help="Simulate from this stored profile (measured acceptance and fitted step cost) instead of a GPU.")
@click.option("--traces", "traces_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Recorded per-request traces (the scheduler plugin's stats JSON).")
@click.option("--autocorrelation", default="0", show_default=True,
              help="rho of the latent acceptance state in [0, 1), or 'auto' to fit it to --traces.")
@click.option("--configs", default="none,static,schedule,adaptive,adaptive-width", show_default=True,
              help="Config kinds to compare.")
@click.option("--static-k", type=numbers("--static-k"), default=None,
              help="Static depths to include (default: 1..K_max).")
@click.option("--seed", type=number("--seed"), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--verbose", is_flag=True,
              help="Print every config per workload and load (default: a one-screen summary).")
@click.option("--store/--no-store", "keep", default=True, show_default=True,
              help="Store the result (as a study of predicted trials: `peagle-tune show --simulations`, `report`).")
@db_option
@errors
def simulate(
    model: str | None,
    gpu: str | None,
    drafter: str | None,
    max_k: int | None,
    workload: str | None,
    classes: str | None,
    shape: str,
    concurrency: list[int],
    rate: float | None,
    requests_per_phase: int | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int,
    output_tokens: int | None,
    chars_per_token: float,
    policy_file: Path | None,
    profile_id: int | None,
    traces_file: Path | None,
    autocorrelation: str,
    configs: str,
    static_k: list[int] | None,
    seed: int,
    as_json: bool,
    verbose: bool,
    keep: bool,
    db_url: str | None,
) -> None:
    """PREDICT serving with no speculation, static K, vLLM's batch-size schedule, the adaptive controller and the
    per-phase oracle, by simulating continuous batching step by step.

    Step times come from the model backend's roofline for the GPU (or a stored profile's fitted cost model);
    accepted drafts per request and step from the drafter's published acceptance (or a stored profile, or recorded
    traces). The adaptive configs run the real depth controller. Nothing is measured.

    Example:

    \b
        peagle-tune simulate --model gpt-oss-120b --gpu h200 --workload sample-mixed --classes chat,code
        peagle-tune simulate --model gpt-oss-120b --gpu b200 --concurrency 64 --json
        peagle-tune simulate --profile 3 --workload fixture.jsonl --traces stats.json --autocorrelation auto
        peagle-tune show --simulations && peagle-tune report --out report/

    The result is stored (unless --no-store) as a study of predicted trials, one per config and load.
    """
    from autotune.errors import UsageError
    from autotune.simulate import (
        SHAPES,
        Phase,
        WorkloadShape,
        fit_autocorrelation,
        gpu_setup,
        load_traces,
        phases_from_workload,
        predict,
        profile_setup,
    )
    from autotune.workloads import resolve_workload
    from policies import load_policy

    shapes: list[WorkloadShape] = [s for s in SHAPES if s in {x.strip() for x in shape.split(",")}]
    if not shapes or {x.strip() for x in shape.split(",") if x.strip()} - set(SHAPES):
        raise UsageError(f"--shape takes {', '.join(SHAPES)} (comma-separated), but got {shape!r}.")
    concurrencies = [] if rate is not None else concurrency
    if profile_id is None and model is None:
        raise UsageError("simulate needs --model (with --gpu) or --profile ID.")
    if profile_id is not None and (model is not None or gpu is not None):
        raise UsageError("--profile takes the model and device from the stored profile; drop --model/--gpu.")
    wl, _stood_in = resolve_workload(workload, required=False)
    class_list = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
    per_phase = requests_per_phase or max(48, 4 * max(concurrencies, default=12))
    workloads: dict[str, list[Phase]] = {
        s: phases_from_workload(
            wl, s, per_phase, classes=class_list, chars_per_token=chars_per_token, output_tokens=output_tokens
        )
        for s in shapes
    }
    traces = load_traces(traces_file) if traces_file is not None else []
    policy = load_policy(policy_file) if policy_file is not None else None
    kinds = [k.strip() for k in configs.split(",") if k.strip()]
    static_ks = static_k
    # Opened before simulating, so a database that cannot take the result is refused before the work.
    store = open_store(db_url, writes=True) if keep else (open_store(db_url) if profile_id is not None else None)

    def build(rho: float) -> Any:
        if profile_id is not None:
            assert store is not None
            record = store.get_profile(profile_id)
            return profile_setup(record, workloads, autocorrelation=rho, traces=traces, policy=policy, seed=seed)
        return gpu_setup(
            model or "", gpu, workloads, drafter=drafter, max_k=max_k, autocorrelation=rho, traces=traces,
            policy=policy, seed=seed,
        )

    rho_note = None
    if autocorrelation.strip().lower() == "auto":
        if not traces:
            raise UsageError("--autocorrelation auto fits rho to recorded traces: pass --traces FILE.")
        base = build(0.0)
        rho, statistic = fit_autocorrelation(traces, base.acceptance.profiles, base.max_k, seed=seed)
        rho_note = f"rho={rho:.3f} fit to the traces' lag-1 correlation {statistic:.3f}"
    else:
        try:
            rho = float(autocorrelation)
        except ValueError:
            raise UsageError(
                f"--autocorrelation takes a number in [0, 1) or 'auto', but got {autocorrelation!r}."
            ) from None
    setup = build(rho)
    same = _same_acceptance(setup, workloads, traces)
    if same and len(workloads) > 1 and _default(click.get_current_context(), "shape"):
        del workloads["stationary"]  # one acceptance for every class: it would repeat shifting number for number
    # Progress lines only in a terminal: piped or with --json stderr stays quiet, as search's does.
    live = err_console.is_terminal and not as_json
    progress = (lambda line: err_console.print(f"  simulating {line}", style="dim")) if live else None
    result = predict(
        setup, workloads, concurrencies=concurrencies, request_rate=rate, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kinds=kinds, static_ks=static_ks, seed=seed,
        progress=progress,
    )
    if rho_note:
        result.warnings.append(rho_note)
    if same and "stationary" not in workloads and _default(click.get_current_context(), "shape"):
        which = f"the workload's one class ({same[0]})" if len(same) == 1 else f"every class ({', '.join(same)})"
        result.warnings.append(f"stationary left out: {which} has one acceptance, so it would repeat the shifting "
                               "scenario number for number (--shape stationary runs it).")
    result.settings["requests_per_phase"] = per_phase
    study = None
    if store is not None and keep:
        from autotune.simulate import store_simulation

        study = store_simulation(store, result)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "stored_as": study}, indent=2, default=str))
        return
    if verbose:
        echo(render(result, per_phase))
    else:
        from autotune.cli._simulate_summary import summary
        from autotune.simulate._setup import tie_margin_for

        echo(summary(result, tie_margin_for(result.step_cost_source)))
    if study is not None:
        err_console.print(f"Stored as study {study} (peagle-tune show --simulation {shell_word(study)}; "
                          "peagle-tune report).",
                          soft_wrap=True, highlight=False, markup=False)


def _default(ctx: click.Context, name: str) -> bool:
    """Whether option `name` kept its default (the user did not choose it)."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None)


def _same_acceptance(setup: Any, workloads: dict[str, Any], traces: list[Any]) -> list[str]:
    """The workload's classes when every one has the same acceptance (one profile, no recorded traces: a shifting
    and a stationary scenario then serve the same requests with the same draws); [] when they differ."""
    classes = sorted({c for phases in workloads.values() for phase in phases for c in phase.classes})
    if traces or not classes:
        return []
    survivals = {tuple(setup.acceptance.survival(c)) for c in classes}
    return classes if len(survivals) == 1 else []


def render(result: Any, per_phase: int | None = None) -> str:
    """The result as text at most 80 columns wide: header naming the sources, one table per workload and load.

    `per_phase`: requests per phase (default: the result's ``settings["requests_per_phase"]``, when stored)."""
    if per_phase is None:
        per_phase = result.settings.get("requests_per_phase")
    from autotune.search.compare import TIE
    from autotune.simulate._setup import tie_margin_for

    lines = ["PREDICTED by simulation (nothing here is measured)"]

    def field(name: str, value: str) -> None:
        lines.extend(textwrap.wrap(value, _WIDTH, initial_indent=f"{name:<10}", subsequent_indent=" " * 10))

    field("model", f"{result.model}" + (f", drafter {result.drafter} (K_max {result.settings['max_k']})"
                                         if result.drafter else ""))
    field("device", result.device)
    field("accept.", result.acceptance_source)
    field("cost", result.step_cost_source)
    margin = tie_margin_for(result.step_cost_source)
    field("ties", f"within {margin:.1%}" + (" (the model backend's spread)" if margin > TIE else "")
          + " go to the smaller K, as search picks")
    if result.controller_cost_fit:
        fit = result.controller_cost_fit
        field("ctl cost", f"linear fit of that cost, median error {fit['median_rel_error']:.1%}, "
                          f"max {fit['max_rel_error']:.1%}")
    graphs = result.settings.get("cuda_graphs")
    if graphs is not None:
        field("graphs", "FULL for a launch's uniform decode steps, PIECEWISE penalty (vLLM #49548) on every other "
                        "step and on a schedule's" if graphs else "none (CPU build): every step alike")
        scheduling = "async (plain vLLM and the plugin, one step late)" if result.settings.get("async_scheduling") \
            else "synchronous"
        field("sched.", scheduling + ("; adaptive launches at the static K" if graphs else ""))
    for w in result.warnings:
        field("note", w)
    groups: dict[tuple[str, Any], list[Any]] = {}
    for row in result.rows:
        groups.setdefault((row.workload, row.concurrency if row.request_rate is None else row.request_rate), []).append(
            row
        )
    header = f"{'config':<{_CONFIG_COL}} {'tok/s':>8} {'x none':>7} {'TPOT p50':>9} {'TTFT p50':>9} {'AL':>5}"
    for (workload, load), rows in groups.items():
        lines.append("")
        load_text = f"{load} req/s" if rows[0].request_rate is not None else f"c={load}"
        phases = result.settings["workloads"][workload]
        per = f" x {per_phase} requests" if per_phase else ""
        lines.append(f"{workload}, {load_text}: {len(phases)} phases ({', '.join(phases)}){per}")
        lines.append(header)
        lines.append("-" * len(header))
        for r in rows:
            label = r.config if len(r.config) <= _CONFIG_COL else r.config[: _CONFIG_COL - 3] + "..."
            lines.append(
                f"{label:<{_CONFIG_COL}} {r.output_tokens_per_s:>8.1f} {_x(r.speedup_vs_no_spec):>7} "
                f"{_ms(r.tpot_ms_p50):>9} {_ms(r.ttft_ms_p50):>9} {_num(r.acceptance_length):>5}"
            )
        lines.extend(_verdict(rows, margin))
    return "\n".join(lines)


def _verdict(rows: list[Any], margin: float) -> list[str]:
    """The best static config by the search's pick rule (`pick_tied`: ties within `margin` go to the smallest K),
    and each adaptive config against it."""
    from autotune.cli._simulate_summary import static_k as _static_k
    from autotune.search.compare import pick_tied, tie_note

    statics = [r for r in rows if r.kind in ("none", "static")]
    if not statics:
        return []
    best, tied = pick_tied(statics, lambda r: r.output_tokens_per_s, margin, _static_k)
    out = [f"best static: {best.config} ({best.output_tokens_per_s:.1f} tok/s)"]
    note = tie_note([_static_k(r) for r in tied], _static_k(best), margin)
    if note:
        out.append(f"  {note}")
    for r in rows:
        if r.kind in ("adaptive", "schedule", "oracle"):
            out.append(f"  {r.config[:40]}: {r.output_tokens_per_s / best.output_tokens_per_s:.3f}x best static")
    return out


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}ms" if value < 100 else f"{value:.0f}ms"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def simulations_view(rows: list[dict[str, Any]], *, wide: bool = False) -> Any:
    """Stored simulations (`StoredSimulation.to_dict` rows), each name whole on its own line so it can be copied
    into ``show --simulation``; model, device, loads and size below it (acceptance and cost sources with --wide)."""
    from rich.console import Group
    from rich.text import Text

    if not rows:
        return Text("No simulations stored yet: run `peagle-tune simulate --model MODEL --gpu GPU`.")
    lines: list[Any] = [Text(f"Simulations ({len(rows)}), PREDICTED (nothing measured);\n"
                             "show one with `peagle-tune show --simulation STUDY`:", style="bold")]
    for row in rows:
        loads = (f"{row.get('request_rate')} req/s" if row.get("request_rate") is not None
                 else "c=" + ",".join(str(c) for c in row.get("concurrencies") or []))
        model = str(row.get("model") or "?")
        when = str(row.get("created_at") or "?")[:16].replace("T", " ")
        lines.append(Text(f"  {row.get('study')}"))
        lines.append(Text(f"    {model if wide else model.split('/')[-1]} on {row.get('device')}, {when}",
                          style="dim"))
        lines.append(Text(f"    {', '.join(row.get('workloads') or [])} at {loads}; "
                          f"{len(row.get('configs') or [])} configs, {row.get('rows')} rows", style="dim"))
        if wide:
            lines.append(Text(f"    acceptance: {row.get('acceptance_source')}; step cost: "
                              f"{row.get('step_cost_source')}", style="dim"))
    return Group(*lines)
