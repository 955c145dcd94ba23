"""`peagle-tune bench`: serve a stored recommendation as it will be served and measure it with `vllm bench serve`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from autotune.cli._bounds import number
from autotune.cli._common import canonical_model, console, db_option, err_console, errors, open_store, say
from autotune.cli._select import choose, selection_options
from autotune.selection import Criteria


@click.command()
@selection_options
@click.option("--model", default=None, help="Only recommendations for this model.")
@click.option("--adaptive", is_flag=True,
              help="Serve through `peagle-tune serve` (the adaptive depth controller) instead of plain `vllm serve` "
                   "with the exported arguments.")
@click.option("--workload-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The workload file the search used, when its stored name is not a built-in (checked against the "
                   "stored content hash).")
@click.option("--num-prompts", type=number("--num-prompts"), default=None,
              help="Send the first N requests of the workload (default: all of them).")
@click.option("--timeout", "timeout_s", type=number("--timeout"), default=3600.0, show_default=True,
              help="Give up (and stop the server) after this many seconds, start-up included.")
@click.option("--dry-run", is_flag=True, help="Print the server and benchmark commands; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the stored benchmark and its comparison as JSON.")
@db_option
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@errors
def bench(
    rec_id: int | None,
    concurrency: int | None,
    gpu: str | None,
    workload: str | None,
    objective: str | None,
    model: str | None,
    adaptive: bool,
    workload_file: Path | None,
    num_prompts: int | None,
    timeout_s: float,
    dry_run: bool,
    as_json: bool,
    db_url: str | None,
    vllm_args: tuple[str, ...],
) -> None:
    """Measure a recommendation served as it will be, with vLLM's own `vllm bench serve`.

    Starts the recommended config the way it will be served (plain `vllm serve` with the arguments `export
    --format vllm-args` prints, or `peagle-tune serve` with --adaptive), sends the search's workload at the
    searched concurrency with `vllm bench serve`, stores the measured figures with where and when they were
    measured (device, vLLM version, date) beside the recommendation, and prints them beside the searched (or
    predicted) ones with the error. `peagle-tune show` then shows both. Arguments after `--` go to the server.

    \b
    Example:
      peagle-tune bench --recommendation 3
      peagle-tune bench --concurrency 8 --adaptive
      peagle-tune bench --recommendation 3 --workload-file prompts.jsonl --num-prompts 64
      peagle-tune bench --recommendation 3 --dry-run -- --dtype float32
    """
    from autotune.bench import Mode, bench_provenance, compare, plan_bench, run_bench
    from autotune.cli._tables import bench_view
    from autotune.engine import EngineOptions, run_directory, shell_line
    from autotune.engine._process import free_port
    from autotune.export import serve_args

    if not dry_run:
        _require_benchmark()
    criteria = Criteria(model=canonical_model(model) if model else None, gpu=gpu, workload=workload,
                        objective=objective, concurrency=concurrency)
    store = open_store(db_url, writes=not dry_run, existing=True)
    rec = choose(store, criteria, rec_id).rec.to_dict()
    work = _workload(rec, workload_file)
    mode: Mode = "adaptive" if adaptive else "static"
    with run_directory(None, "ptune-bench-") as run_dir:
        plan = plan_bench(rec, work, mode=mode, port=free_port(), run_dir=run_dir, server_args=serve_args(rec),
                          num_prompts=num_prompts, memory_fraction=_cpu_memory_fraction(),
                          extra=vllm_args)

        def log(line: str) -> None:
            say(err_console, line)

        log(f"peagle-tune bench: recommendation #{plan.recommendation_id} ({rec.get('model')}, {rec.get('gpu')}, "
            f"{rec.get('workload_name')}, concurrency {plan.concurrency}), {mode}.")
        for note in plan.notes:
            log(f"  note: {note}")
        if dry_run:
            click.echo(f"# server\n{shell_line(plan.serve)}\n# benchmark (after /health answers)\n"
                       f"{shell_line(plan.bench)}")
            return
        run = run_bench(plan, run_dir, timeout_s=timeout_s, env=EngineOptions().process_env({"PEAGLE_DB": store.url}),
                        progress=lambda line: log(f"  {line}"))
    if not run.ok:
        tail = f"\n{run.log_tail}" if run.log_tail else ""
        raise click.ClickException(f"{run.failure} Nothing was stored.{tail}")
    provenance = bench_provenance(mode)
    bench_id = store.add_benchmark(plan.recommendation_id, mode=mode, concurrency=plan.concurrency,
                                   num_prompts=plan.num_prompts, figures=run.figures, provenance=provenance,
                                   commands={"serve": plan.serve, "bench": plan.bench})
    stored = store.list_benchmarks(plan.recommendation_id)
    mine = [b.to_dict() for b in stored if b.id == bench_id]
    if as_json:
        rows = [e.to_dict() for e in compare(rec.get("metrics") or {}, run.figures)]
        click.echo(json.dumps({**mine[0], "comparison": rows, "wall_s": run.wall_s}, indent=2, default=str))
        return
    console.print(bench_view(rec, mine))
    log(f"Stored as benchmark {bench_id}; `peagle-tune show --recommendation {plan.recommendation_id}` shows it "
        f"({run.wall_s:.0f} s, start-up included).")


def _workload(rec: dict[str, Any], path: Path | None) -> Any:
    """The workload the search ran: --workload-file, else the stored name (a built-in or a file here), checked
    against the stored content hash (or a prefix of each class, as --requests-per-class cuts it)."""
    from autotune.errors import UsageError
    from autotune.workloads import load_workload

    name, digest = rec.get("workload_name"), rec.get("workload_hash")
    spec = path if path is not None else name
    if spec is None:
        raise UsageError(f"Recommendation #{rec['id']} names no workload; give --workload-file FILE.")
    try:
        work = load_workload(spec)
    except UsageError as exc:
        if path is not None:
            raise
        raise UsageError(f"{exc} The search ran workload {name!r}: give its file with --workload-file.") from None
    if digest is None or work.content_hash() == digest:
        return work
    longest = max((len(r) for r in work.classes.values()), default=0)
    for n in range(1, longest):
        if work.subset(n).content_hash() == digest:
            return work.subset(n)
    raise UsageError(f"{spec} is not the workload recommendation #{rec['id']} was searched on (its content hash is "
                     f"{str(digest)[:12]}...): give that file with --workload-file.")


def _require_benchmark() -> None:
    """Refuse before any launch when ``vllm bench serve`` cannot read the workload: it needs vLLM, and pandas for
    its custom dataset (``vllm/benchmarks/datasets/datasets.py`` 2454, vLLM's "bench" extra)."""
    import importlib.util

    from autotune.engine import require_vllm
    from autotune.errors import BackendUnavailableError

    require_vllm("peagle-tune bench")
    if importlib.util.find_spec("pandas") is None:
        raise BackendUnavailableError(
            "peagle-tune bench needs pandas: `vllm bench serve` reads the workload as vLLM's custom dataset with it. "
            "Install it with `pip install pandas` (or `pip install 'vllm[bench]'`).")


def _cpu_memory_fraction() -> float | None:
    """``--gpu-memory-utilization`` for vLLM's CPU build, chosen from free RAM as `peagle-tune serve` does; None on
    a machine with GPUs (the export's value, as the fit check assumed it, stays)."""
    from autotune.environment import detect_environment
    from autotune.serving import cpu_memory_fraction, read_meminfo

    if detect_environment()["gpu_count"]:
        return None
    memory = read_meminfo()
    return None if memory is None else cpu_memory_fraction(*memory)
