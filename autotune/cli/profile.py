"""`peagle-tune profile`: acceptance per class and position and the step cost T(B, K), one engine launch per drafter."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from autotune.cli._bounds import dtype_callback, name_callback, number, numbers
from autotune.cli._common import (
    canonical_model,
    console,
    db_option,
    debug_enabled,
    err_console,
    errors,
    open_store,
)


@click.command()
@click.option("--model", required=True, callback=name_callback("--model"),
              help="Target model: HF id or local path (what vLLM loads).")
@click.option("--drafter", "drafters", multiple=True, required=True, callback=name_callback("--drafter"),
              help="Drafter id or local path (repeatable).")
@click.option("--workload", required=True, callback=name_callback("--workload"),
              help="hf:mt-bench, hf:humaneval or hf:gsm8k (the dataset vllm bench serve reads; add ,prompts=N,"
              "output-len=M), spec-bench:FILE or speed-bench:DIR (categories as classes), a sample (sample-chat, ...) "
              "or a .jsonl/.json file (classes per record). See docs/workloads.md.")
@click.option("--concurrency", type=numbers("--concurrency"), default="1,4,16", show_default=True,
              help="Concurrencies, one phase each.")
@click.option("--max-k", type=number("--max-k"), default=8, show_default=True,
              help="K_max: the depth the engine drafts at.")
@click.option(
    "--method",
    type=click.Choice(["draft_model", "eagle3", "eagle"]),
    default=None,
    help="Speculative method (default: from each drafter's config: eagle3 heads, draft_model for plain LMs).",
)
@click.option(
    "--parallel-drafting",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="auto: on when the drafter's config has a mask token (P-EAGLE, PARD).",
)
@click.option("--num-prompts", type=number("--num-prompts"), default=None,
              help="Requests per concurrency phase (default: the workload, "
              "at least 8 per in-flight request).")
@click.option("--dtype", default="auto", show_default=True, callback=dtype_callback,
              help="Engine dtype (float32 makes CPU runs reproducible).")
@click.option("--max-model-len", type=number("--max-model-len"), default=None,
              help="vLLM max_model_len (default: the workload's longest prompt plus max_tokens, with headroom).")
@click.option("--load-format", default=None, help="vLLM load_format (\"dummy\" for config-only checkpoints).")
@click.option("--enforce-eager", is_flag=True, help="Skip torch.compile/CUDA graphs (faster start for small models).")
@click.option("--timeout", "timeout_s", type=number("--timeout"), default=1800.0, show_default=True,
              help="Seconds per launch.")
@click.option("--baseline", is_flag=True, help="One more launch without speculation, shared by all drafters: "
              "measures T(B, 0) without a drafter so the cost model can price no-speculation.")
@click.option("--side-by-side", is_flag=True, help="With --baseline: run the no-speculation engine beside each "
              "drafter's, both loaded, taking turns phase by phase, so a shared machine's drift does not skew the "
              "comparison (one baseline launch per drafter; twice the memory: small models only).")
@click.option("--no-store", is_flag=True, help="Do not store the profiles.")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON instead of tables.")
@errors
def profile(
    model: str,
    drafters: tuple[str, ...],
    workload: str,
    concurrency: list[int],
    max_k: int,
    method: str | None,
    parallel_drafting: str,
    num_prompts: int | None,
    dtype: str,
    max_model_len: int | None,
    load_format: str | None,
    enforce_eager: bool,
    timeout_s: float,
    baseline: bool,
    side_by_side: bool,
    no_store: bool,
    db_url: str | None,
    as_json: bool,
) -> None:
    """Measure acceptance per workload class and draft position, and the engine step time T(B, K).

    One vLLM launch per drafter, at K = --max-k: a scheduler plugin changes the verified depth at runtime while the
    workload runs at each concurrency, so one launch measures every depth and batch size. Acceptance comes from
    the requests that verified K_max drafts (AL(K) for every smaller K follows by prefix consistency); a
    least-squares step-cost model is fitted to the step times and its fit error is reported. Profiles are stored
    (see `peagle-tune show --profiles`).

    In a terminal each launch shows a live line on stderr (phase, elapsed time, ETA); piped or with --json it is
    quiet.

    \b
    Example:
      peagle-tune profile --model ./target --drafter ./drafter-1l --drafter ./drafter-2l --workload sample-mixed
      peagle-tune profile --model ./target --drafter ./drafter-1l --workload sample-mixed --concurrency 1,8 --baseline
    """
    from autotune.cli._progress import launch_progress
    from autotune.profiling import profile as run_profile
    from autotune.workloads import load_workload

    wl = load_workload(workload)
    store = None if no_store else open_store(db_url, writes=True)
    pd = {"auto": None, "on": True, "off": False}[parallel_drafting]
    live = not as_json and err_console.is_terminal

    def progress(line: str) -> None:
        if live:
            err_console.print(line, highlight=False, markup=False, soft_wrap=not err_console.is_terminal)

    with launch_progress(err_console, enabled=live):
        results = run_profile(
            model,
            list(drafters),
            wl,
            concurrencies=concurrency,
            max_k=max_k,
            store=store,
            model_name=canonical_model(model),
            method=method,
            parallel_drafting=pd,
            num_prompts=num_prompts,
            dtype=dtype,
            max_model_len=max_model_len,
            load_format=load_format,
            engine_extra={"enforce_eager": True} if enforce_eager else None,
            timeout_s=timeout_s,
            baseline=baseline,
            side_by_side=side_by_side,
            progress=progress,
        )
    baselines = (len(results) if side_by_side else 1) if baseline else 0
    launches = sum(r.engine_launches for r in results) + baselines
    if as_json:
        click.echo(json.dumps({"engine_launches": launches, "profiles": [r.to_dict() for r in results]}, indent=2))
    else:
        for r in results:
            _print_result(r)
        extra = f" (+{baselines} no-speculation baseline{'s' if baselines > 1 else ''})" if baselines else ""
        console.print(f"Engine launches: {launches} for {len(results)} drafter(s){extra}.")
    if not all(r.ok for r in results):
        raise click.ClickException(
            "; ".join(f"{r.drafter}: {r.failure_kind}: {r.failure_reason}" for r in results if not r.ok)
        )


def _print_result(r: Any) -> None:
    where = r.provenance.describe()
    console.rule(f"{r.drafter} ({r.method}{', parallel drafting' if r.parallel_drafting else ''}, K_max={r.max_k})")
    if not r.ok:
        console.print(Text.assemble((f"failed ({r.failure_kind})", "red"), f": {r.failure_reason}"))
        # vLLM's refusal of a config is its traceback: the reason above is its one line (--debug shows the tail).
        if r.log_tail and (r.failure_kind != "invalid_config" or debug_enabled()):
            console.print(r.log_tail, highlight=False, markup=False)
        return
    console.print(f"Every figure below is {where}, except the step-cost model's fit (a least-squares prediction).")
    classes = sorted(r.acceptance)
    acc = Table(title="Acceptance per draft depth K (measured)")
    acc.add_column("K", justify="right")
    for cls in classes:
        acc.add_column(f"{cls}: P(first K accepted) [95%]", justify="right")
        acc.add_column(f"{cls}: AL(K)", justify="right")
    lengths = r.acceptance_lengths()
    acc.add_row("0", *[cell for cls in classes for cell in ("-", "1.00")])
    for k in range(1, r.max_k + 1):
        cells = []
        for cls in classes:
            p = r.acceptance[cls]
            lo, hi = p.survival_interval(k - 1)
            cells += [f"{p.survival()[k - 1]:.3f} [{lo:.3f}, {hi:.3f}]", f"{lengths[cls][k]:.2f}"]
        acc.add_row(str(k), *cells)
    console.print(acc)
    drafts = ", ".join(f"{cls} {r.acceptance[cls].num_drafts}" for cls in classes)
    console.print(f"Drafts verified at K_max per class: {drafts}. AL(K) = 1 + sum of P(first i accepted), i <= K "
                  "(tokens per request per step, bonus included).")
    table = r.step_table()
    steps_at: dict[int, int] = {}
    for (b, _), sample in table.items():
        steps_at[b] = steps_at.get(b, 0) + sample.n
    # Batch sizes only seen while a phase drained (a few steps) are noise here; --json lists every sample.
    shown = sorted(b for b, n in steps_at.items() if n >= r.max_k + 1)
    cost = Table(title="Step time T(B, K): median ms (steps), decode-only steps (measured)")
    cost.add_column("B \\ K")
    for k in range(r.max_k + 1):
        cost.add_column(str(k), justify="right")
    for b in shown:
        row = []
        for k in range(r.max_k + 1):
            sample = table.get((b, k))
            row.append("-" if sample is None else f"{sample.step_ms:.2f} ({sample.n})")
        cost.add_row(str(b), *row)
    console.print(cost)
    hidden = len(steps_at) - len(shown)
    if hidden:
        console.print(f"({hidden} batch size(s) with fewer than {r.max_k + 1} steps not shown; --json lists them.)")
    if r.fit_error is not None:
        fe = r.fit_error
        console.print(
            f"Step-cost model (predicted, least squares): median error {fe['median_rel_error']:.1%}, "
            f"max {fe['max_rel_error']:.1%}, R^2 {fe['r2']:.3f} over {int(fe['num_samples'])} samples."
        )
    check = r.metrics_check or {}
    console.print(
        "Cross-check with vLLM's spec-decode counters: " + ("match" if check.get("match") else f"MISMATCH {check}")
    )
    phases = ", ".join(f"c={p['concurrency']}: {p['num_requests']} requests in {p['wall_s']:.1f} s" for p in r.phases)
    console.print(f"Phases: {phases}. Engine launch: {r.timings.get('total_s', 0):.0f} s "
                  f"(load {r.timings.get('load_s', 0):.0f} s). Stored as profile #{r.profile_id}."
                  if r.profile_id is not None else
                  f"Phases: {phases}. Engine launch: {r.timings.get('total_s', 0):.0f} s (not stored).")
