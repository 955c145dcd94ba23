"""Runtime gain of the adaptive depth controller on the CPU fixtures (a script that prints figures, not a test).

Usage::

    python benchmarks/bench_runtime.py [--models tests/fixtures/models] [--drafter drafter-2l] [--max-k 4]
        [--concurrency 8] [--repeat 2] [--out docs/benchmarks/runtime.md]

What runs (all measured on this machine, in one run; every configuration is its own engine launch, the offline
``vllm.LLM`` engine in a subprocess, because ``vllm serve`` adds HTTP and detokenisation time that is the same for
every configuration and slows the 2-core box down):

1. a profile of the drafter (``autotune.profiling.profile``: one launch at K_max with the depth plan, plus one
   no-speculation launch for the cost model's baseline): acceptance per class and position, and the step-cost
   model the controller starts from;
2. two workloads, each a sequence of phases run back to back in the same engine, requests closed-loop at
   ``--concurrency`` (all requests of a phase queued at once, at most ``max_num_seqs`` running):
   - shifting: the "predictable" class alone, then the "entropic" class alone, then both mixed;
   - stationary: both classes mixed in every phase (as many requests as the shifting workload);
3. configurations: no speculation; every static K in 1..K_max (plain vLLM); vLLM's own batch-size schedule
   (``num_speculative_tokens_per_batch_size``, best K per batch size predicted from the profile); the adaptive
   controller (``policies.scheduler.PeagleScheduler`` in adaptive mode, drafter at K_max, depth per step and per
   request class, priors from the profile, fallback to the best static K predicted by the profile); and the plugin
   alone at K_max (static mode: statistics only, no trimming), which shows the plugin's own cost.

Figures: output tokens/s = generated tokens / wall time of the workload (all its phases), measured; the adaptive
controller's decision time per step at batch 256 (`policies.benchmark_decision_time`), measured. The requests carry
their class in ``SamplingParams.extra_args`` (the adaptive controller uses it; the other configurations ignore it).
Greedy outputs of every configuration are compared with no speculation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = REPO / "tests" / "fixtures" / "models"
DEFAULT_WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "runtime.md"
ENGINE_KWARGS: dict[str, Any] = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0}
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
PREDICTABLE, ENTROPIC = "predictable", "entropic"


# ================================================================================================= worker side
def run_worker(job_path: Path, result_path: Path) -> int:
    """One configuration: load the engine, warm up, run every workload's phases; write the result JSON."""
    job = json.loads(job_path.read_text())
    from vllm import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(model=job["model"], **job["engine_kwargs"])
    load_s = time.perf_counter() - t

    def params(r: dict[str, Any], phase: str, max_tokens: int | None = None) -> Any:
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens or r["max_tokens"],
            extra_args={"peagle_class": r["class"], "peagle_phase": phase},
        )

    # Warm-up: every request of one mixed phase, cut to 16 tokens, so every batch shape has run once.
    warm = job["warmup"]
    llm.generate([r["prompt"] for r in warm], [params(r, "warmup", 16) for r in warm], use_tqdm=False)
    llm.reset_prefix_cache()
    out: dict[str, Any] = {"ok": True, "load_s": load_s, "workloads": {}}
    # Rounds alternate the workloads (shifting, stationary, shifting, ...) so slow periods of a shared machine hit
    # both; a phase's figures are summed over the rounds.
    for _ in range(int(job.get("rounds", 1))):
        for name, phases in job["workloads"].items():
            entries = out["workloads"].setdefault(name, [])
            for i, reqs in enumerate(phases):
                phase = f"{name}:{i}"
                t = time.perf_counter()
                outs = llm.generate([r["prompt"] for r in reqs], [params(r, phase) for r in reqs], use_tqdm=False)
                wall = time.perf_counter() - t
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                if len(entries) <= i:
                    entries.append({"phase": phase, "wall_s": 0.0, "output_tokens": 0,
                                    "outputs": [list(o.outputs[0].token_ids) for o in outs]})
                entries[i]["wall_s"] += wall
                entries[i]["output_tokens"] += tokens
    _write(result_path, out)
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        try:
            core.shutdown(timeout=0)  # the result is written; the parent kills the process group anyway
        except Exception:  # noqa: BLE001
            pass
    return 0


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


EXPLANATION = """
## How to read this

- Every figure is measured on this machine (output tokens / wall time of a workload's phases); the profile line and
  the schedule are the profile's measurements and the cost model's predictions.
- The adaptive controller applies depth by trimming drafts in the scheduler: with parallel drafting the drafter
  proposes K_max tokens every step whatever depth is verified (vLLM 0.32 cannot change a parallel drafter's depth at
  runtime, issue #45695; a depth-0 step still runs the drafter). So it saves verification, not drafting: on a class
  where speculation never pays (here "entropic": AL(1) ~ 1.2) it cannot reach the no-speculation speed, and a static
  small K, whose drafter proposes fewer tokens, keeps an edge there that trimming cannot reproduce.
- "plugin only" is the scheduler plugin at K_max recording statistics without changing any depth: its gap to
  "static K=K_max" is the plugin's own cost (per-step bookkeeping in the engine process).
- This 2-core machine is shared; figures move by several percent between runs. Rounds alternate the workloads in
  each engine so that slow periods hit both.
"""


# ================================================================================================= parent side
def launch(job: dict[str, Any], env: dict[str, str], workdir: Path, label: str, timeout_s: float) -> dict[str, Any]:
    """Run one configuration in a subprocess (its own process group, killed afterwards); its result dict."""
    from autotune.engine import kill_process_group, read_log_tail, start_process_group

    run = workdir / label
    run.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = run / "job.json", run / "result.json", run / "engine.log"
    job_path.write_text(json.dumps(job))
    full_env = dict(os.environ)
    full_env.update(ENGINE_ENV)
    full_env.update(env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(job_path), str(result_path)]
    proc = start_process_group(cmd, log_path, full_env)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and not result_path.exists() and time.monotonic() < deadline:
            time.sleep(0.25)
        time.sleep(0.5)
    finally:
        kill_process_group(proc, grace_s=5.0)
    if not result_path.exists():
        return {"ok": False, "reason": read_log_tail(log_path, 15)}
    return dict(json.loads(result_path.read_text()))


def build_workloads(workload: Any, repeat: int) -> dict[str, list[list[dict[str, Any]]]]:
    """shifting: [predictable x n, entropic x n, mixed x n]; stationary: three mixed phases of n requests."""
    by_class = {c: [{"prompt": r.text(), "max_tokens": r.max_tokens, "class": c} for r in workload.classes[c]]
                for c in (PREDICTABLE, ENTROPIC)}
    pred = by_class[PREDICTABLE] * repeat
    ent = by_class[ENTROPIC] * repeat
    n = min(len(pred), len(ent))
    pred, ent = pred[:n], ent[:n]
    mixed = [r for pair in zip(pred, ent, strict=True) for r in pair]  # alternating classes, 2n requests
    shifting = [pred, ent, mixed[:n]]
    # Three mixed phases of n requests, cycling through the alternating list (both classes in every phase).
    stationary = [[mixed[(i * n + j) % len(mixed)] for j in range(n)] for i in range(3)]
    return {"shifting": shifting, "stationary": stationary}


def profile_drafter(args: argparse.Namespace, workload: Any, workdir: Path) -> Any:
    from autotune.profiling import profile

    result = profile(
        str(args.models / "target"),
        [str(args.models / args.drafter)],
        workload,
        concurrencies=sorted({1, max(1, args.concurrency // 2), args.concurrency}),
        max_k=args.max_k,
        method="draft_model",
        parallel_drafting=True,
        baseline=True,
        dtype="float32",
        max_model_len=512,
        engine_extra={"enforce_eager": True},
        log_dir=workdir / "profile",
        progress=lambda line: print(f"  [profile] {line}", flush=True),
    )[0]
    if not result.ok:
        raise SystemExit(f"profiling failed: {result.failure_kind}: {result.failure_reason}\n{result.log_tail}")
    return result


@dataclass
class Row:
    """One configuration's measured figures."""

    label: str
    ok: bool
    shifting: float = 0.0
    """Output tokens/s over the whole shifting workload (measured)."""
    stationary: float = 0.0
    phases: list[float] = field(default_factory=list)
    """Output tokens/s of each shifting phase (measured)."""
    same_as_no_spec: bool = False
    """Every greedy output token-identical to the no-speculation run."""


def summarize(label: str, r: dict[str, Any], base: dict[str, Any]) -> Row:
    if not r.get("ok"):
        return Row(label, False)
    tps = {}
    same = bool(base.get("ok"))
    for name, phases in r["workloads"].items():
        tps[name] = sum(p["output_tokens"] for p in phases) / sum(p["wall_s"] for p in phases)
        if base.get("ok"):
            for p, q in zip(phases, base["workloads"][name], strict=True):
                same = same and p["outputs"] == q["outputs"]
    phase_tps = [p["output_tokens"] / p["wall_s"] for p in r["workloads"]["shifting"]]
    return Row(label, True, tps["shifting"], tps["stationary"], phase_tps, same)


def predicted_goodput(result: Any, mix_weights: dict[str, float]) -> Any:
    """tokens/s predicted from the profile at batch b and uniform depth k, classes mixed by ``mix_weights``."""
    from policies import mix

    acceptance = mix(result.acceptance, mix_weights)
    cost = result.cost_model

    def goodput(b: int, k: int) -> float:
        ms = cost.predict(b, k, drafter_ran=k > 0)
        return 1000.0 * b * acceptance.acceptance_length(k) / ms

    return goodput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--drafter", default="drafter-2l")
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="repeat each class's prompts this many times")
    parser.add_argument("--rounds", type=int, default=2, help="run both workloads this many times per engine")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine launch")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(*args.worker)

    from autotune.environment import detect_environment
    from autotune.search import best_depth_per_batch, default_batch_sizes, merge_schedule
    from autotune.workloads import load_workload
    from policies import ClassPolicy, RequestPolicy, benchmark_decision_time
    from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats, engine_kwargs

    for needed in (args.models / "target" / "config.json", args.models / args.drafter / "config.json", args.workload):
        if not needed.is_file():
            raise SystemExit(f"missing fixture {needed}: run `python tests/fixtures/build_fixtures.py` first")
    started = time.perf_counter()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peagle-bench-runtime-"))
    workload = load_workload(args.workload)
    workloads = build_workloads(workload, args.repeat)
    c, kmax = args.concurrency, args.max_k
    target, drafter = str(args.models / "target"), str(args.models / args.drafter)
    print(f"Work directory: {workdir}", flush=True)

    print("Profiling the drafter (one launch at K_max + one without speculation)...", flush=True)
    prof = profile_drafter(args, workload, workdir)
    mixed_goodput = predicted_goodput(prof, {PREDICTABLE: 1.0, ENTROPIC: 1.0})
    ks = list(range(kmax + 1))
    best_static = best_depth_per_batch(mixed_goodput, [c], ks[1:])[c]
    sizes = default_batch_sizes(c)
    schedule = [e.as_vllm() for e in merge_schedule(best_depth_per_batch(mixed_goodput, sizes, ks), c)]

    warm = workloads["stationary"][0]

    def job(spec: dict[str, Any] | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        kw = dict(ENGINE_KWARGS, max_num_seqs=c, **(extra or {}))
        if spec is not None:
            kw["speculative_config"] = spec
        return {"model": target, "engine_kwargs": kw, "workloads": workloads, "warmup": warm, "rounds": args.rounds}

    def spec(k: int, parallel: bool = True, **more: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}
        if parallel:
            out["parallel_drafting"] = True
        out.update(more)
        return out

    configs: list[tuple[str, dict[str, Any], dict[str, str]]] = [("no speculation", job(None), {})]
    configs += [(f"static K={k}", job(spec(k)), {}) for k in range(1, kmax + 1)]
    top = max(k for _, _, k in schedule)
    schedule_spec = spec(max(top, 1), num_speculative_tokens_per_batch_size=schedule)
    configs.append((f"vLLM schedule {schedule}", job(schedule_spec), {}))
    # Both classes declared: the plugin takes a request's class label only for classes its policy knows.
    policy = RequestPolicy(
        static_k=best_static, max_k=kmax, default_class=PREDICTABLE, classes={ENTROPIC: ClassPolicy()}
    )
    stats_path = workdir / "adaptive-stats.json"
    plugin = PluginConfig(
        mode="adaptive",
        stats_path=str(stats_path),
        static_depth=best_static,
        adaptive={
            "policy": policy.to_dict(),
            "cost_model": prof.cost_model.to_dict(),
            "acceptance": {cls: p.to_dict() for cls, p in prof.acceptance.items()},
        },
    )
    plugin_path = plugin.save(workdir / "adaptive-plugin.json")
    # The plugin alone (static mode, no trimming, statistics recorded): its own cost, without any adaptation.
    static_plugin = PluginConfig(mode="static", stats_path=str(workdir / "static-plugin-stats.json"))
    static_plugin_path = static_plugin.save(workdir / "static-plugin.json")
    label = f"plugin only (K={kmax}, no adaptation)"
    configs.append((label, job(spec(kmax), engine_kwargs()), {CONFIG_ENV: str(static_plugin_path)}))
    configs.append(("adaptive (peagle)", job(spec(kmax), engine_kwargs()), {CONFIG_ENV: str(plugin_path)}))

    results: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for label, j, env in configs:
        print(f"Running {label}...", flush=True)
        r = launch(j, env, workdir, label.replace(" ", "_").replace("=", "").replace("[", "")[:40], args.timeout)
        if not r.get("ok") and label.startswith("vLLM schedule"):
            notes.append(
                "vLLM's batch-size schedule with parallel drafting failed "
                f"({r.get('reason', '')[-300:]!r}); measured with draft_model WITHOUT parallel drafting instead."
            )
            label = label + " (no parallel drafting)"
            print(f"  failed with parallel drafting; retrying {label}", flush=True)
            j = job(spec(max(top, 1), parallel=False, num_speculative_tokens_per_batch_size=schedule))
            r = launch(j, env, workdir, "vllm_schedule_seq", args.timeout)
        results[label] = r
        if not r.get("ok"):
            print(f"  FAILED: {r.get('reason')}", flush=True)

    # ---- figures --------------------------------------------------------------------------------------------
    base = results["no speculation"]
    rows = [summarize(label, r, base) for label, r in results.items()]
    static = {row.label: row for row in rows if row.label.startswith("static") and row.ok}
    best_shift = max(static.values(), key=lambda row: row.shifting)
    best_stat = max(static.values(), key=lambda row: row.stationary)
    adaptive = next(row for row in rows if row.label.startswith("adaptive"))
    decision_us = benchmark_decision_time(256)

    lines = []
    env = detect_environment()
    lines.append(f"Environment: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                 f"{env['device']}, vLLM {env['vllm_version']}, torch {env['torch_version']}, "
                 f"Python {platform.python_version()}; {dt.date.today().isoformat()}.")
    lines.append(f"Models: {args.models} (target + {args.drafter}, draft_model + parallel_drafting), K_max={kmax}, "
                 f"concurrency {c} (max_num_seqs {c}), offline vllm.LLM engine, float32, greedy.")
    n = len(workloads["shifting"][0])
    lines.append(f"Workloads: shifting = {n} predictable, then {n} entropic, then {n} mixed requests; stationary = "
                 f"3 x {n} mixed requests; max_tokens {workload.classes[PREDICTABLE][0].max_tokens}; {args.rounds} "
                 "rounds per engine, alternating the two workloads (figures summed over rounds).")
    fe = prof.fit_error or {}
    lines.append(
        "Profile (measured): AL(K) per class "
        + "; ".join(f"{cls}: " + ", ".join(f"{v:.2f}" for v in p.acceptance_lengths(kmax))
                    for cls, p in sorted(prof.acceptance.items()))
        + f". Step-cost fit median error {fe.get('median_rel_error', float('nan')):.1%}."
    )
    lines.append(f"Predicted best static K for the mix at concurrency {c}: {best_static} (the controller's fallback). "
                 f"vLLM schedule (predicted from the profile): {schedule}.")
    lines.append("")
    lines.append("| configuration | shifting tok/s | stationary tok/s | shifting phases tok/s (pred / ent / mixed) "
                 "| greedy = no-spec |")
    lines.append("|---|---:|---:|---|---|")
    for row in rows:
        if not row.ok:
            lines.append(f"| {row.label} | failed | failed | | |")
            continue
        ph = " / ".join(f"{x:.0f}" for x in row.phases)
        lines.append(f"| {row.label} | {row.shifting:.1f} | {row.stationary:.1f} | {ph} | "
                     f"{'yes' if row.same_as_no_spec else 'NO'} |")
    lines.append("")
    if adaptive.ok:
        r_shift = adaptive.shifting / best_shift.shifting
        r_stat = adaptive.stationary / best_stat.stationary
        lines.append(f"Adaptive / best static on shifting ({best_shift.label}): {r_shift:.3f}x "
                     f"(goal >= 1.15x: {'met' if r_shift >= 1.15 else 'NOT met'}).")
        nospec = next(row for row in rows if row.label == "no speculation")
        if nospec.ok:
            lines.append(f"Adaptive / no speculation: {adaptive.shifting / nospec.shifting:.3f}x shifting, "
                         f"{adaptive.stationary / nospec.stationary:.3f}x stationary.")
        lines.append(f"Adaptive / best static on stationary ({best_stat.label}): {r_stat:.3f}x "
                     f"(goal >= 0.98x: {'met' if r_stat >= 0.98 else 'NOT met'}).")
    lines.append(f"Controller decision time per step at batch 256: {decision_us:.1f} us "
                 f"(goal < 20 us: {'met' if decision_us < 20 else 'NOT met'}), measured by "
                 "policies.benchmark_decision_time.")
    if stats_path.is_file():
        stats = PluginStats.load(stats_path)
        hist = stats.depth_histogram()
        lines.append(f"Adaptive run: verified-depth histogram (request-steps) {hist}; plugin overhead "
                     f"{stats.overhead_ms / max(stats.steps, 1) * 1000:.0f} us/step; fallback={stats.fallback}.")
        for phase in sorted(stats.phases()):
            per = {cls: {d: p.num_drafts for d, p in stats.acceptance_by_depth(cls, [phase]).items()}
                   for cls in stats.classes([phase])}
            lines.append(f"- {phase}: drafts by class and verified depth {per}")
    lines += [f"Note: {n_}" for n_ in notes]
    lines.append(f"Total benchmark wall time {time.perf_counter() - started:.0f} s.")
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Runtime benchmark: adaptive depth controller vs static K vs vLLM's batch-size schedule\n\n"
        "Produced by `python benchmarks/bench_runtime.py` (the figures below are its printed output).\n\n"
        + text
        + EXPLANATION
    )
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    sys.exit(main())
