"""Predicted serving on GPUs by simulation (a script that prints figures, not a test): by default gpt-oss-120b on
H200 and gpt-oss-20b on B200.

Usage::

    python -m benchmarks.simulate_gpu [--targets gpt-oss-120b:h200,gpt-oss-20b:b200] [--concurrency 1,8,64]
                                      [--out FILE.md] [--sweep]

What it does (all PREDICTED, nothing measured; `autotune.simulate`):

1. the mt-bench/humaneval mix (built-in "mixed" workload, classes chat and code), shifting (chat alone, code alone,
   both mixed) and stationary (three mixed phases), ``max(48, 4c)`` requests per phase, closed loop at each c with
   ``max_num_seqs = c``;
2. configs: no speculation, static K = 1..8, vLLM's batch-size schedule, the adaptive controller with trimming (the
   shipped plugin) and with drafter-width control (issue 10), and the per-phase oracle;
3. step times from the model backend's roofline for the GPU, with vLLM's CUDA-graph modes (a launch's uniform
   decode steps FULL, every other step and a schedule's every step PIECEWISE) and async scheduling, as
   `peagle-tune simulate` prices them; acceptance from the P-EAGLE head's published acceptance (catalog curve),
   i.i.d. and with autocorrelation;
4. with ``--sweep``: the adaptive controller under other `ControllerSettings`, to choose GPU defaults.

The tables it prints are what docs/benchmarks/simulate.md quotes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import REPO

TARGETS = "gpt-oss-120b:h200,gpt-oss-20b:b200"
CLASSES = ["chat", "code"]


def _git_state() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "autotune/backends"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" + uncommitted model-backend changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def workloads_for(concurrency: int) -> dict[str, Any]:
    from autotune.simulate import phases_from_workload
    from autotune.workloads import load_workload

    w = load_workload("mixed")
    n = max(48, 4 * concurrency)
    return {s: phases_from_workload(w, s, n, classes=CLASSES) for s in ("shifting", "stationary")}


def run_cell(target: str, concurrency: int, *, rho: float = 0.0, settings: Any = None,
             kinds: tuple[str, ...] | None = None, seed: int = 0, local_fit: bool = False,
             max_k: int | None = None) -> Any:
    """One ``MODEL:GPU`` target at one concurrency, both workload shapes. ``local_fit``: the controller's cost
    model is fitted on batch sizes c/2..2c only (a profile at the serving concurrency) instead of 1..64. ``max_k``:
    the drafter's K (default: its trained K)."""
    from autotune.simulate import CONFIG_KINDS, gpu_setup, predict
    from policies import RequestPolicy

    model, gpu = target.split(":")
    workloads = workloads_for(concurrency)
    sizes = sorted({max(1, concurrency // 2), concurrency, 2 * concurrency}) if local_fit else None
    setup = gpu_setup(model, gpu, workloads, autocorrelation=rho, seed=seed, controller_batch_sizes=sizes,
                      max_k=max_k)
    if settings is not None:
        from autotune.simulate import token_weights

        base = setup.controller_policy(concurrency, token_weights(workloads.values()))
        setup.policy = RequestPolicy(static_k=base.static_k, max_k=base.max_k, default_class=base.default_class,
                                     controller=settings)
    return setup, predict(setup, workloads, concurrencies=[concurrency], kinds=kinds or CONFIG_KINDS, seed=seed)


def main_tables(gpus: list[str], concurrencies: list[int], rho: float) -> tuple[list[str], dict[Any, Any]]:
    lines: list[str] = []
    cells: dict[Any, Any] = {}
    for gpu in gpus:
        results = {}
        setup = None
        for c in concurrencies:
            setup, res = run_cell(gpu, c, rho=rho)
            results[c] = res
            cells[(gpu, c)] = res
        assert setup is not None
        first = results[concurrencies[0]]
        lines.append(f"### {first.model} on {first.device}")
        lines.append("")
        lines.append(f"Acceptance: {first.acceptance_source}. Step cost: {first.step_cost_source}. Controller's cost "
                     f"model: linear fit of that cost over batch sizes 1-64 (median error "
                     f"{first.controller_cost_fit['median_rel_error']:.1%}, max "
                     f"{first.controller_cost_fit['max_rel_error']:.1%}).")
        lines.append("")
        header = "| config | " + " | ".join(f"{s} c={c}" for s in ("shifting", "stationary") for c in concurrencies)
        lines.append(header + " |")
        lines.append("|---|" + "---:|" * (2 * len(concurrencies)))
        labels: list[str] = []
        for c in concurrencies:
            for r in results[c].rows:
                key = _row_key(r)
                if key not in labels:
                    labels.append(key)
        for key in labels:
            cells_text = []
            for s in ("shifting", "stationary"):
                for c in concurrencies:
                    row = next((r for r in results[c].rows_for(s, c) if _row_key(r) == key), None)
                    cells_text.append("-" if row is None else
                                      f"{row.output_tokens_per_s:.0f} ({row.speedup_vs_no_spec:.2f}x)")
            lines.append(f"| {key} | " + " | ".join(cells_text) + " |")
        lines.append("")
        lines.append("Schedules: " + "; ".join(
            f"c={c}: {next(r.config for r in results[c].rows if r.kind == 'schedule')}" for c in concurrencies))
        lines.append("")
    return lines, cells


def _row_key(row: Any) -> str:
    return "vLLM batch-size schedule" if row.kind == "schedule" else row.config


def summary_table(cells: dict[Any, Any], gpus: list[str], concurrencies: list[int]) -> list[str]:
    lines = ["| GPU | workload | c | best static | adaptive (trim) | adaptive (drafter width) | vLLM schedule | "
             "per-phase oracle | adaptive TPOT p50 vs best static |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for gpu in gpus:
        for s in ("shifting", "stationary"):
            for c in concurrencies:
                res = cells[(gpu, c)]
                rows = res.rows_for(s, c)
                best = res.best(s, c, ("none", "static"))
                by_kind = {}
                for r in rows:
                    by_kind.setdefault(r.config if r.kind == "adaptive" else r.kind, r)
                trim = by_kind["adaptive (trim)"]
                width = by_kind["adaptive (drafter width)"]
                lines.append(
                    f"| {_name(gpu)} | {s} | {c} | {best.config} ({best.speedup_vs_no_spec:.2f}x none) | "
                    f"{trim.output_tokens_per_s / best.output_tokens_per_s:.3f} | "
                    f"{width.output_tokens_per_s / best.output_tokens_per_s:.3f} | "
                    f"{by_kind['schedule'].output_tokens_per_s / best.output_tokens_per_s:.3f} | "
                    f"{by_kind['oracle'].output_tokens_per_s / best.output_tokens_per_s:.3f} | "
                    f"{width.tpot_ms_p50 / best.tpot_ms_p50:.3f} |"
                )
    return lines


SWEEP: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    ("hysteresis 0.01", {"hysteresis": 0.01}),
    ("hysteresis 0.10", {"hysteresis": 0.10}),
    ("decay 0.95", {"decay": 0.95}),
    ("decay 0.995", {"decay": 0.995}),
    ("explore_every 0 (off)", {"explore_every": 0}),
    ("explore_every 64", {"explore_every": 64}),
    ("refresh_every 4", {"refresh_every": 4}),
    ("refresh_every 64", {"refresh_every": 64}),
    ("prior_strength 200", {"prior_strength": 200.0}),
    ("learn_step_cost off", {"learn_step_cost": False}),
    ("per_request off (uniform)", {"per_request": False}),
    ("cost model fit at c/2..2c", {"_local_fit": True}),
    ("fit at c/2..2c + explore_every 64", {"_local_fit": True, "explore_every": 64}),
    ("fit at c/2..2c + learn_step_cost off", {"_local_fit": True, "learn_step_cost": False}),
    ("drafter K=6 (engine K, trimming)", {"_max_k": 6}),
    ("drafter K=5 (engine K, trimming)", {"_max_k": 5}),
    ("fit at c/2..2c + drafter K=6", {"_local_fit": True, "_max_k": 6}),
]


def sweep_table(gpus: list[str], concurrencies: list[int], cells: dict[Any, Any], rho: float) -> list[str]:
    """Adaptive (both modes) / best static (K = 1..8 and no speculation), per variant: geometric mean and minimum
    over every cell. Variants starting "fit at" fit the controller's cost model at the serving concurrency; "drafter
    K" runs the engine's drafter (and the controller's max_k) at that K instead of 8."""
    from policies import ControllerSettings

    lines = ["| settings | trim: geo-mean | trim: min | width: geo-mean | width: min | width: min cell |",
             "|---|---:|---:|---:|---:|---|"]
    for name, changes in SWEEP:
        changes = dict(changes)
        local_fit = bool(changes.pop("_local_fit", False))
        max_k = changes.pop("_max_k", None)
        settings = replace(ControllerSettings(), **changes)
        ratios: dict[str, list[tuple[float, str]]] = {"adaptive (trim)": [], "adaptive (drafter width)": []}
        for gpu in gpus:
            for c in concurrencies:
                _, res = run_cell(gpu, c, rho=rho, settings=settings, kinds=("adaptive", "adaptive-width"),
                                  local_fit=local_fit, max_k=max_k)
                for s in ("shifting", "stationary"):
                    best = cells[(gpu, c)].best(s, c, ("none", "static"))
                    for r in res.rows_for(s, c):
                        ratios[r.config].append((r.output_tokens_per_s / best.output_tokens_per_s,
                                                 f"{gpu} {s} c={c}"))
        trim, width = ratios["adaptive (trim)"], ratios["adaptive (drafter width)"]
        worst = min(width)
        lines.append(f"| {name} | {_geo(trim):.3f} | {min(trim)[0]:.3f} | {_geo(width):.3f} | {worst[0]:.3f} | "
                     f"{worst[1]} |")
    return lines


def rho_table(gpus: list[str], concurrencies: list[int]) -> list[str]:
    lines = ["| rho | GPU | workload | c | best static tok/s | adaptive (drafter width) / best static |",
             "|---:|---|---|---:|---:|---:|"]
    for rho in (0.0, 0.5, 0.9):
        for gpu in gpus:
            for c in concurrencies:
                _, res = run_cell(gpu, c, rho=rho)
                for s in ("shifting",):
                    best = res.best(s, c, ("none", "static"))
                    width = next(r for r in res.rows_for(s, c) if r.config == "adaptive (drafter width)")
                    lines.append(f"| {rho} | {_name(gpu)} | {s} | {c} | {best.output_tokens_per_s:.0f} "
                                 f"({best.config}) | {width.output_tokens_per_s / best.output_tokens_per_s:.3f} |")
    return lines


def _name(target: str) -> str:
    model, gpu = target.split(":")
    return f"{model} {gpu.upper()}"


def _geo(values: list[tuple[float, str]]) -> float:
    return math.exp(sum(math.log(v) for v, _ in values) / len(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=TARGETS, help="MODEL:GPU pairs (comma-separated)")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--rho", type=float, default=0.0, help="acceptance autocorrelation of the main tables")
    parser.add_argument("--sweep", action="store_true", help="also sweep controller settings and rho")
    parser.add_argument("--out", type=Path, default=None, help="write the tables (markdown) here")
    args = parser.parse_args(argv)
    gpus = [g.strip() for g in args.targets.split(",") if g.strip()]
    for target in gpus:
        if target.count(":") != 1:
            parser.error(f"--targets takes MODEL:GPU pairs, e.g. {TARGETS}; got {target!r}")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    started = time.perf_counter()
    out = [f"Generated by `python -m benchmarks.simulate_gpu{' --sweep' if args.sweep else ''}` on "
           f"{dt.date.today().isoformat()} (repository {_git_state()}). Every figure is PREDICTED.", ""]
    lines, cells = main_tables(gpus, concurrencies, args.rho)
    out += ["## Per config: output tokens/s (x no speculation)", "", *lines]
    out += ["## Adaptive and schedule relative to the best static config (no speculation included)", "",
            *summary_table(cells, gpus, concurrencies), ""]
    if args.sweep:
        out += ["## Controller settings (adaptive / best static over every GPU, workload and c above)", "",
                *sweep_table(gpus, concurrencies, cells, args.rho), ""]
        out += ["## Acceptance autocorrelation (shifting workload)", "", *rho_table(gpus, concurrencies), ""]
    out.append(f"Simulation wall time {time.perf_counter() - started:.0f} s.")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        print(f"Wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
