"""In-launch figures against fresh launches of the same static configs, on the CPU fixtures.

Usage::

    python -m benchmarks.bench_in_launch [--rounds 3] [--ks 1,2,3,4] [--concurrency 1,8] [--drafter drafter-1l]
        [--models DIR] [--workload FILE] [--out benchmarks/data/in_launch_cpu_fixtures.json]

A search with the vllm backend measures every static K of a drafter in one engine started at K_max, each phase's
depth pinned by the scheduler plugin (`autotune.backends.InLaunchBackend`). This script checks that those figures
are what a fresh engine of exactly that config gives: each round measures every config both ways, in-launch (one
launch for the drafter, one without speculation) and fresh (`VLLMBackend`, one launch per config and concurrency),
the two orders alternating between rounds and the fresh configs shuffled. It prints, per config, output tokens/s
both ways and the per-round ratio fresh / in-launch (median, min-max over rounds), the load average before every
launch, and writes every figure to ``--out``. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.backends import InLaunchBackend, VLLMBackend
from autotune.environment import detect_environment
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload
from benchmarks.common import DEFAULT_MODELS, DEFAULT_WORKLOAD, REPO, load_average, spread

DEFAULT_OUT = REPO / "benchmarks" / "data" / "in_launch_cpu_fixtures.json"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", type=_ints, default=[1, 2, 3, 4])
    parser.add_argument("--concurrency", type=_ints, default=[1, 8])
    parser.add_argument("--drafter", default="drafter-1l")
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    workload = load_workload(str(args.workload))
    drafter = str(args.models / args.drafter)
    scenarios = [Scenario(concurrency=c) for c in args.concurrency]
    configs = [SpecConfig(max_num_seqs=max(args.concurrency))] + [
        SpecConfig("draft_model", drafter, k, True, max_num_seqs=max(args.concurrency)) for k in args.ks
    ]
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for r in range(args.rounds):
        fresh = VLLMBackend(str(args.models / "target"))
        in_launch = InLaunchBackend(fresh, scenarios, args.ks, workload)
        pairs = [(c, s) for c in configs for s in scenarios]
        order = ["in-launch", "fresh"] if r % 2 == 0 else ["fresh", "in-launch"]
        for mode in order:
            todo = list(pairs)
            if mode == "fresh":
                rng.shuffle(todo)
            for config, scenario in todo:
                backend = in_launch if mode == "in-launch" else fresh
                load = load_average()
                m = backend.measure(config, workload, scenario)
                rows.append({
                    "round": r, "mode": mode, "config": config.label(), "k": config.k,
                    "concurrency": scenario.concurrency, "ok": m.ok, "tokens_per_s": m.output_tokens_per_s,
                    "failure": None if m.ok else f"{m.failure_kind}: {m.failure_reason}", "load_before": load,
                    "in_launch": m.extra.get("in_launch"),
                })
                print(f"round {r} {mode:9} c={scenario.concurrency} {config.label():32} "
                      f"{(m.output_tokens_per_s or 0):8.1f} tok/s  load {load:.2f}", flush=True)
        print(f"round {r}: in-launch used {in_launch.engine_launches} launches for {len(pairs)} configs", flush=True)
    report = summarize(rows)
    doc = {"started": started, "environment": detect_environment(), "args": {k: str(v) for k, v in vars(args).items()},
           "rows": rows, "summary": report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(render(report))
    return 0


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per (config, concurrency): tokens/s both ways and the per-round ratio fresh / in-launch."""
    by: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for row in rows:
        if row["ok"] and row["tokens_per_s"]:
            by.setdefault((row["config"], row["concurrency"]), {}).setdefault(row["round"], {})[row["mode"]] = float(
                row["tokens_per_s"]
            )
    out = []
    for (config, c), rounds in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        both = [v for v in rounds.values() if "fresh" in v and "in-launch" in v]
        if not both:
            continue
        ratios = [v["fresh"] / v["in-launch"] for v in both]
        out.append({
            "config": config, "concurrency": c,
            "in_launch": [v["in-launch"] for v in both], "fresh": [v["fresh"] for v in both], "ratios": ratios,
            "ratio_median": statistics.median(ratios),
        })
    medians = [e["ratio_median"] for e in out]
    return {
        "configs": out,
        "median_ratio": statistics.median(medians) if medians else None,
        "max_abs_deviation": max((abs(m - 1) for m in medians), default=None),
        "load_before": [row["load_before"] for row in rows],
    }


def render(report: dict[str, Any]) -> str:
    lines = ["| c | config | in-launch tok/s | fresh tok/s | fresh / in-launch |", "|---|---|---:|---:|---:|"]
    for e in report["configs"]:
        lines.append(f"| {e['concurrency']} | {e['config']} | {spread(e['in_launch'], 3)} | {spread(e['fresh'], 3)} | "
                     f"{spread(e['ratios'], 3)} |")
    loads = report["load_before"]
    lines.append("")
    if report["median_ratio"] is not None:
        lines.append(f"Median over configs of the per-config median ratio: {report['median_ratio']:.3f}; "
                     f"largest deviation of a config's median from 1: {report['max_abs_deviation']:.1%}.")
    if loads:
        lines.append(f"Load average before launches: {min(loads):.2f}-{max(loads):.2f}.")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
