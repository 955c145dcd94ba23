"""Runtime gain of the adaptive depth controller on the CPU fixtures (a script that prints figures, not a test).

Usage::

    python -m benchmarks.bench_runtime [--models tests/fixtures/models] [--drafter drafter-2l] [--max-k 4]
        [--concurrency 1 8] [--rounds 3] [--c1-requests 12] [--workdir DIR]

What runs (all measured on this machine, in one run; every configuration is its own engine, the offline
``vllm.LLM`` engine on the engine worker harness, `benchmarks.runtime_worker` launched by
`autotune.engine.run_worker`, because ``vllm serve`` adds HTTP and detokenisation time that is the same for every
configuration and slows a 2-core machine down):

1. a profile of the drafter (``autotune.profiling.profile``: one launch at K_max with the depth plan, plus one
   no-speculation launch for the cost model's baseline, loaded side by side and taking turns phase by phase):
   acceptance per class and position, and the step-cost model the controller starts from;
2. two workloads, each a sequence of phases run back to back in the same engine:
   - shifting: the "predictable" class alone, then the "entropic" class alone, then both mixed;
   - stationary: both classes mixed in every phase (as many requests as the shifting workload);
   at every concurrency of ``--concurrency``: c > 1 queues all requests of a phase at once in an engine with
   ``max_num_seqs`` = max concurrency (closed loop); c = 1 sends the first ``--c1-requests`` requests of each phase
   one after the other;
3. configurations: no speculation; every static K in 1..K_max (plain vLLM); vLLM's own batch-size schedule
   (``num_speculative_tokens_per_batch_size``, best K per batch size predicted from the profile); the adaptive
   controller with drafter-width control off (``PluginConfig.drafter_width = {"enabled": False}``: depth applied by
   trimming drafts only, the drafter proposes K_max every step); the adaptive controller as shipped (drafter
   width per step and off-steps on, the default); and the idle drafter (`IDLE`: the speculative engine with the
   plugin pinned at depth 0, every step an off-step, no exploration), the ceiling of any controller where no
   speculation is the best static configuration, since the engine still carries the drafter. Plus the per-phase
   oracle, computed, not run: in each round and phase the fastest of the static configurations (no speculation
   included).

Protocol: all engines are loaded first and stay up; then ``--rounds`` rounds, each running every configuration once
(one after the other, the order rotated each round), so a slow period of the shared machine hits every
configuration. Before its round an engine waits `benchmarks.runtime_worker.SETTLE_S` and runs an untimed burst
(the engine before it still spins for a second, and its own caches are cold). All engines are resident at once
(`ENGINE_GIB` each with the fixtures; the script refuses to start when ``MemAvailable`` is below that times the
number of configurations). Figures are the median over rounds with min-max. ``uptime``'s load average is recorded
before and after.

Figures: output tokens/s = generated tokens / wall time of the workload (all its phases), measured
(`benchmarks.common.tokens_per_s`). The requests carry their class in ``SamplingParams.extra_args`` (the adaptive
controller uses it; the other configurations ignore it). Greedy outputs of every configuration (first round) are
compared with no speculation at the same concurrency. The figures are printed and written to
``runtime-figures.md`` in the work directory; docs/benchmarks/runtime.md quotes them with their explanation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from autotune.engine import POLL_S, EngineOptions, LaunchResult, run_worker
from autotune.spec import SpecConfig
from benchmarks.common import DEFAULT_MODELS, DEFAULT_WORKLOAD, available_memory_gib, spread, tokens_per_s, uptime
from benchmarks.runtime_worker import SETTLE_S

WORKER = "benchmarks.runtime_worker"
STOP_WAIT_S = 60.0
"""How long the parent waits, at the end, for the workers to write their statistics and shut their engines down."""
KV_CACHE_BYTES = 256 * 2**20
"""KV cache per engine (vLLM's ``kv_cache_memory_bytes``; VLLM_CPU_KVCACHE_SPACE, whole GiB, would override it and is
removed from the engines' environment). The fixtures need 12 KiB a token (target 8, drafter 4; float32), 48 MiB for
8 requests of 512 tokens; with 256 MiB a worker holds ~1.0 GB (with 1 GiB, ~1.9 GB)."""
ENGINE_OPTIONS = EngineOptions(
    dtype="float32", max_model_len=512, cpu_kv_cache_gib=None,
    engine_extra={"enforce_eager": True, "seed": 0, "kv_cache_memory_bytes": KV_CACHE_BYTES},
)
"""How every engine of this benchmark (and of `benchmarks.bench_phase_ab`) is set up."""
PREDICTABLE, ENTROPIC = "predictable", "entropic"
NO_SPEC = "no speculation"
IDLE = "idle drafter (depth 0)"
ENGINE_GIB = 2.0
"""Memory per loaded engine with the fixtures, GiB, with a margin: ~1.6 GiB each measured as the drop of
``MemAvailable`` with 8 and 9 engines loaded (RSS counts shared library pages in every process and overstates it:
worker ~1.0 GB with `KV_CACHE_BYTES`, engine core ~0.65 GB, driver ~0.65 GB)."""


class Engine:
    """One configuration's engine: a `benchmarks.runtime_worker` job launched by `autotune.engine.run_worker` (its
    own process group, killed when the job ends or its deadline passes) on a thread, so that all stay resident."""

    def __init__(self, label: str, job: dict[str, Any], env: dict[str, str], workdir: Path,
                 options: EngineOptions) -> None:
        self.label = label
        self.dir = workdir / label.replace(" ", "_").replace("=", "").replace("[", "").replace("]", "")[:40]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.failure: str | None = None
        self.result: LaunchResult | None = None
        job = dict(job, run_dir=str(self.dir))
        self.thread = threading.Thread(target=self._run, args=(job, env, options), name=label, daemon=True)
        self.thread.start()

    def _run(self, job: dict[str, Any], env: dict[str, str], options: EngineOptions) -> None:
        self.result = run_worker(WORKER, job, self.dir, options, extra_env=env)

    def wait_for(self, name: str, deadline: float) -> dict[str, Any] | None:
        """The JSON file ``name`` once the worker wrote it; None (and ``failure`` set) if the worker ended or the
        deadline passed first."""
        path = self.dir / name
        while not path.exists():
            if not self.thread.is_alive() or time.monotonic() > deadline:
                time.sleep(0.5)
                if path.exists():
                    break
                self.failure = self._why()
                return None
            time.sleep(POLL_S)
        return dict(json.loads(path.read_text()))

    def _why(self) -> str:
        if self.result is None:
            return f"no answer before the deadline (log: {self.dir / 'engine.log'})"
        failure = self.result.failure()
        what = "ended" if failure is None else f"{failure[0]}: {failure[1]}"
        return f"{what}\n{self.result.log_tail}"

    def stop(self) -> None:
        """Ask the worker to end after its round (its launch then ends and its process group is killed)."""
        (self.dir / "stop").touch()


LENGTH_OFFSETS = (-21, -18, -6, -9, 9, 6, 18, 21)
"""Output-length offsets by position in a phase (cycled): every fixture request asks for 48 tokens and generates all
of them, so without them a c=8 phase without speculation ran in lock-step waves of 8 requests with one batched
prefill per wave (measured: 9 prompt steps per round against ~50 with speculation, whose requests finish apart),
which traffic with varied lengths never does. All eight differ: with equal pairs (-21, -21, -9, -9, 9, 9, 21, 21,
an earlier setting) the two requests of a pair still finished together without speculation and joined in one prefill,
16-17 steps with prompt tokens per c=8 phase under speculation against 11-12 without (docs/benchmarks/runtime.md,
"Admission"). Mean 0 over 8 positions and over each class of the alternating mixed phases (even positions -21, -6,
9, 18; odd -18, -9, 6, 21)."""


def build_workloads(workload: Any, repeat: int) -> dict[str, list[list[dict[str, Any]]]]:
    """shifting: [predictable x n, entropic x n, mixed x n]; stationary: three mixed phases of n requests. Output
    lengths vary by position in the phase (`LENGTH_OFFSETS`), the same for every configuration."""
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

    def varied(phase: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(r, max_tokens=max(1, r["max_tokens"] + LENGTH_OFFSETS[j % len(LENGTH_OFFSETS)]))
                for j, r in enumerate(phase)]

    return {"shifting": [varied(p) for p in shifting], "stationary": [varied(p) for p in stationary]}


def profile_drafter(args: argparse.Namespace, workload: Any, workdir: Path) -> Any:
    from autotune.profiling import profile

    top = max(args.concurrency)
    result = profile(
        str(args.models / "target"),
        [str(args.models / args.drafter)],
        workload,
        concurrencies=sorted({1, max(1, top // 2), top}),
        max_k=args.max_k,
        method="draft_model",
        parallel_drafting=True,
        baseline=True,
        side_by_side=True,  # both launches loaded, taking turns: their comparison does not span minutes of drift
        options=EngineOptions(dtype="float32", max_model_len=512, engine_extra={"enforce_eager": True}),
        log_dir=workdir / "profile",
        progress=lambda line: print(f"  [profile] {line}", flush=True),
    )[0]
    if not result.ok:  # also when the plugin's counts miss vLLM's (counts_mismatch): the prior would be off
        raise SystemExit(f"profiling failed: {result.failure_kind}: {result.failure_reason}\n{result.log_tail}")
    return result


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
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 1])
    parser.add_argument("--c1-requests", type=int, default=12, help="requests per phase at concurrency 1")
    parser.add_argument("--repeat", type=int, default=1, help="repeat each class's prompts this many times")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration once")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine load and per round")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (markdown) here")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)

    from autotune.environment import detect_environment
    from autotune.search import best_depth_per_batch, default_batch_sizes, merge_schedule
    from autotune.workloads import load_workload
    from policies import ClassPolicy, RequestPolicy
    from policies.plugin import CONFIG_ENV, PluginConfig, PluginStats, engine_kwargs
    from policies.plugin.config import engine_env

    for needed in (args.models / "target" / "config.json", args.models / args.drafter / "config.json", args.workload):
        if not needed.is_file():
            raise SystemExit(f"missing fixture {needed}: run `python tests/fixtures/build_fixtures.py` first")
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override KV_CACHE_BYTES in every engine
    started = time.perf_counter()
    load_before = uptime()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peagle-bench-runtime-"))
    workload = load_workload(args.workload)
    workloads = build_workloads(workload, args.repeat)
    concs = sorted(set(args.concurrency), reverse=True)
    c, kmax = concs[0], args.max_k
    target, drafter = str(args.models / "target"), str(args.models / args.drafter)
    # Every engine's deadline: its load and every round (the parent also gives up on one round after --timeout).
    options = EngineOptions.build(ENGINE_OPTIONS, timeout_s=args.timeout * (args.rounds + 1))
    print(f"Work directory: {workdir}\nLoad before: {load_before}", flush=True)

    print("Profiling the drafter (one launch at K_max + one without speculation)...", flush=True)
    prof = profile_drafter(args, workload, workdir)
    mixed_goodput = predicted_goodput(prof, {PREDICTABLE: 1.0, ENTROPIC: 1.0})
    ks = list(range(kmax + 1))
    best_static = best_depth_per_batch(mixed_goodput, [c], ks[1:])[c]
    sizes = default_batch_sizes(c)
    schedule = [e.as_vllm() for e in merge_schedule(best_depth_per_batch(mixed_goodput, sizes, ks), c)]

    warm = workloads["stationary"][0]

    def job(config: SpecConfig, plugin: bool = False, speculative_extra: dict[str, Any] | None = None
            ) -> dict[str, Any]:
        kwargs = options.engine_args(config, speculative_extra=speculative_extra,
                                     defaults=engine_kwargs(async_scheduling=False) if plugin else None)
        return {"model": target, "engine_kwargs": kwargs, "workloads": workloads, "warmup": warm,
                "rounds": args.rounds, "concurrencies": concs, "c1_requests": args.c1_requests}

    def spec(k: int) -> SpecConfig:
        return SpecConfig("draft_model", drafter, k, parallel_drafting=True, max_num_seqs=c)

    configs: list[tuple[str, dict[str, Any], dict[str, str]]] = [(NO_SPEC, job(SpecConfig(max_num_seqs=c)), {})]
    configs += [(f"static K={k}", job(spec(k)), {}) for k in range(1, kmax + 1)]
    top = max(k for _, _, k in schedule)
    schedule_label = f"vLLM schedule {schedule}"
    configs.append((schedule_label, job(spec(max(top, 1)),
                                        speculative_extra={"num_speculative_tokens_per_batch_size": schedule}), {}))
    # What each configuration is, for benchmarks.validate_simulate and benchmarks.model_error (they replay the
    # same requests in the simulator / predict them from the profile, and compare with the rounds measured here).
    kinds: dict[str, dict[str, Any]] = {NO_SPEC: {"kind": "none"}, schedule_label: {"kind": "schedule",
                                                                                     "entries": schedule}}
    kinds.update({f"static K={k}": {"kind": "static", "k": k} for k in range(1, kmax + 1)})
    # Both classes declared: the plugin takes a request's class label only for classes its policy knows.
    policy = RequestPolicy(
        static_k=best_static, max_k=kmax, default_class=PREDICTABLE, classes={ENTROPIC: ClassPolicy()}
    )
    adaptive_cfg = {
        "policy": policy.to_dict(),
        "cost_model": prof.cost_model.to_dict(),
        "acceptance": {cls: p.to_dict() for cls, p in prof.acceptance.items()},
    }
    stats_paths: dict[str, Path] = {}
    for label, width in (("adaptive, trimming only", {"enabled": False}), ("adaptive (new)", None)):
        name = "trim" if width else "new"
        stats_paths[label] = workdir / f"adaptive-{name}-stats.json"
        plugin = PluginConfig(mode="adaptive", stats_path=str(stats_paths[label]), static_depth=best_static,
                              adaptive=adaptive_cfg, drafter_width=width)
        plugin_path = plugin.save(workdir / f"adaptive-{name}-plugin.json")
        configs.append((label, job(spec(kmax), plugin=True), {**engine_env(), CONFIG_ENV: str(plugin_path)}))
        kinds[label] = {"kind": "adaptive", "policy": policy.to_dict(), "drafter_width": width is None}
    # The speculative engine that never drafts (plugin pinned at depth 0: off-steps only, nothing explored).
    stats_paths[IDLE] = workdir / "idle-stats.json"
    idle_plugin = PluginConfig(mode="static", static_depth=0, stats_path=str(stats_paths[IDLE]))
    configs.append((IDLE, job(spec(kmax), plugin=True),
                    {**engine_env(), CONFIG_ENV: str(idle_plugin.save(workdir / "idle-plugin.json"))}))
    kinds[IDLE] = {"kind": "idle"}
    (workdir / "profile.json").write_text(json.dumps(prof.to_dict()))

    # ---- load every engine, then interleave the configurations in rounds ------------------------------------
    # Every engine stays resident (`ENGINE_GIB` each): refuse rather than let the kernel's OOM killer pick a process
    # of this or another job.
    need_gib = ENGINE_GIB * len(configs)
    avail_gib = available_memory_gib()
    if avail_gib is not None and avail_gib < need_gib:
        raise SystemExit(f"{len(configs)} resident engines need ~{need_gib:.0f} GiB, only {avail_gib:.1f} GiB "
                         "available: run fewer configurations or on a quieter machine.")
    print(f"Loading {len(configs)} engines...", flush=True)
    engines = [Engine(label, j, env, workdir, options) for label, j, env in configs]
    rounds: dict[str, list[dict[str, Any]]] = {e.label: [] for e in engines}
    notes: list[str] = []
    loaded_gib: float | None = None
    try:
        deadline = time.monotonic() + args.timeout
        for e in engines:
            if e.wait_for("ready.json", deadline) is None:
                print(f"  {e.label} FAILED to load: {e.failure}", flush=True)
        live = [e for e in engines if e.failure is None]
        avail = available_memory_gib()
        loaded_gib = None if avail is None else round(avail, 1)
        print(f"Loaded ({time.perf_counter() - started:.0f} s since start). Load: {uptime()}; available memory "
              f"{loaded_gib} GiB", flush=True)
        for rnd in range(args.rounds):
            shift = rnd % len(live) if live else 0
            for e in live[shift:] + live[:shift]:
                if e.failure is not None:
                    continue
                t = time.perf_counter()
                (e.dir / f"go-{rnd}").touch()
                r = e.wait_for(f"round-{rnd}.json", time.monotonic() + args.timeout)
                if r is None:
                    print(f"  round {rnd} {e.label} FAILED: {e.failure}", flush=True)
                    continue
                rounds[e.label].append(r)
                print(f"  round {rnd} {e.label}: {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        for e in engines:
            e.stop()
        # Each worker ends after its last round, idle for `FLUSH_S` (the plugin writes its statistics), then its
        # engine shuts down within `run_worker`'s grace.
        until = time.monotonic() + STOP_WAIT_S
        for e in engines:
            e.thread.join(max(0.0, until - time.monotonic()))
    load_after = uptime()
    for e in engines:
        if e.failure is not None and not rounds[e.label]:
            notes.append(f"{e.label} failed: {e.failure[-300:]!r}")

    (workdir / "rounds.json").write_text(json.dumps(rounds))
    (workdir / "bench.json").write_text(json.dumps({
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "load_before": load_before,
        "load_after": load_after, "available_gib_loaded": loaded_gib, "concurrencies": concs, "max_k": kmax,
        "c1_requests": args.c1_requests,
        "workloads": workloads, "configs": kinds,
    }))
    # ---- figures --------------------------------------------------------------------------------------------
    static_labels = [NO_SPEC] + [f"static K={k}" for k in range(1, kmax + 1)]
    keys = [f"c{cc}:{w}" for cc in concs for w in ("shifting", "stationary")]
    tput: dict[str, dict[str, list[float]]] = {label: {} for label in rounds}
    phase_tput: dict[str, dict[str, list[list[float]]]] = {label: {} for label in rounds}
    for label, rs in rounds.items():
        for key in keys:
            tput[label][key] = [tokens_per_s(r[key]) for r in rs]
            phase_tput[label][key] = [[e["output_tokens"] / e["wall_s"] for e in r[key]] for r in rs]
    # Oracle per round: each phase at the wall time of the fastest static configuration in that round.
    oracle: dict[str, list[float]] = {}
    oracle_pick: dict[str, list[list[str]]] = {}
    n_rounds = min((len(rounds[s]) for s in static_labels if rounds.get(s)), default=0)
    for key in keys:
        oracle[key], oracle_pick[key] = [], []
        for i in range(n_rounds):
            phases = len(rounds[NO_SPEC][i][key])
            tokens = wall = 0.0
            picks = []
            for p in range(phases):
                best = min((s for s in static_labels if rounds.get(s)), key=lambda s: rounds[s][i][key][p]["wall_s"])
                wall += rounds[best][i][key][p]["wall_s"]
                tokens += rounds[best][i][key][p]["output_tokens"]
                picks.append(best.replace("static ", "").replace(NO_SPEC, "off"))
            oracle[key].append(tokens / wall)
            oracle_pick[key].append(picks)

    def same_outputs(label: str, key: str) -> str:
        if not rounds.get(label) or not rounds.get(NO_SPEC):
            return "?"
        a, b = rounds[label][0][key], rounds[NO_SPEC][0][key]
        return "yes" if all(p["outputs"] == q["outputs"] for p, q in zip(a, b, strict=True)) else "NO"

    def med(label: str, key: str) -> float:
        v = tput.get(label, {}).get(key) or []
        return statistics.median(v) if v else float("nan")

    lines = []
    env = detect_environment()
    lines.append(f"Environment: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                 f"{env['device']}, vLLM {env['vllm_version']}, torch {env['torch_version']}, "
                 f"Python {platform.python_version()}; {dt.date.today().isoformat()}.")
    lines.append(f"Load before: `{load_before}`; after: `{load_after}`. Available memory with every engine loaded: "
                 f"{loaded_gib} GiB.")
    lines.append(f"Models: {args.models} (target + {args.drafter}, draft_model + parallel_drafting), K_max={kmax}, "
                 f"offline vllm.LLM engine (max_num_seqs {c}), float32, greedy.")
    n = len(workloads["shifting"][0])
    lines.append(f"Workloads: shifting = {n} predictable, then {n} entropic, then {n} mixed requests; stationary = "
                 f"3 x {n} mixed requests; max_tokens {workload.classes[PREDICTABLE][0].max_tokens} + "
                 f"{list(LENGTH_OFFSETS)} by position in a phase. At c=1 the "
                 f"first {args.c1_requests} requests of each phase, one at a time. {n_rounds} rounds; each round "
                 f"runs every configuration once (order rotated; each starts after {SETTLE_S} s and an untimed burst); "
                 "figures: median (min-max) over rounds.")
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
    for cc in concs:
        lines.append(f"### Concurrency {cc} (output tokens/s)")
        lines.append("")
        lines.append("| configuration | shifting | stationary | shifting phases, medians (pred / ent / mixed) "
                     "| greedy = no-spec |")
        lines.append("|---|---:|---:|---|---|")
        for label in [*rounds, "per-phase oracle (computed)"]:
            if label.startswith("per-phase"):
                sh, st = oracle[f"c{cc}:shifting"], oracle[f"c{cc}:stationary"]
                phase_picks = oracle_pick[f"c{cc}:shifting"]
                ph = "picks " + "; ".join("/".join(p) for p in phase_picks)
                lines.append(f"| {label} | {spread(sh)} | {spread(st)} | {ph} | |")
                continue
            if not rounds[label]:
                lines.append(f"| {label} | failed | failed | | |")
                continue
            key = f"c{cc}:shifting"
            ph = " / ".join(f"{statistics.median(col):.0f}" for col in zip(*phase_tput[label][key], strict=True))
            same = "yes" if all(same_outputs(label, f"c{cc}:{w}") == "yes" for w in ("shifting", "stationary")) \
                else "NO"
            lines.append(f"| {label} | {spread(tput[label][key])} | {spread(tput[label][f'c{cc}:stationary'])} | "
                         f"{ph} | {same} |")
        lines.append("")
    lines.append("### Ratios against the targets (medians)")
    lines.append("")
    lines.append("| ratio | value | target | met |")
    lines.append("|---|---:|---:|---|")

    def entropic(label: str, key: str) -> float:
        """Median over rounds of a configuration's tok/s in the shifting workload's entropic (second) phase."""
        return statistics.median(r[1] for r in phase_tput[label][key])

    def best_static_of(key: str) -> str:
        return max((s for s in static_labels if rounds.get(s)), key=lambda s: med(s, key))

    for label in ("adaptive (new)", "adaptive, trimming only"):
        if not rounds.get(label):
            continue
        for cc in concs:
            for w in ("shifting", "stationary"):
                key = f"c{cc}:{w}"
                bs = best_static_of(key)
                goal = 1.15 if (cc == 1 and w == "shifting") else 0.98
                ratio = med(label, key) / med(bs, key)
                lines.append(f"| {label} / best static ({bs}), c={cc} {w} | {ratio:.3f}x | >= {goal}x | "
                             f"{'yes' if ratio >= goal else 'NO'} |")
        for cc in concs:
            key = f"c{cc}:shifting"
            ent, ent0 = entropic(label, key), entropic(NO_SPEC, key)
            lines.append(f"| {label} / no speculation, c={cc} entropic phase | {ent / ent0:.3f}x | >= 0.95x | "
                         f"{'yes' if ent / ent0 >= 0.95 else 'NO'} |")
            oc = statistics.median(oracle[key])
            lines.append(f"| {label} / per-phase oracle, c={cc} shifting | {med(label, key) / oc:.3f}x | | |")
            if rounds.get(IDLE):
                lines.append(f"| {label} / {IDLE}, c={cc} entropic phase | {ent / entropic(IDLE, key):.3f}x | | |")
    if rounds.get(IDLE):  # the ceiling where no speculation is best: what carrying an idle drafter costs
        for cc in concs:
            key = f"c{cc}:shifting"
            ratio = entropic(IDLE, key) / entropic(NO_SPEC, key)
            lines.append(f"| {IDLE} / no speculation, c={cc} entropic phase | {ratio:.3f}x | | |")
            skey = f"c{cc}:stationary"
            lines.append(f"| {IDLE} / no speculation, c={cc} stationary | {med(IDLE, skey) / med(NO_SPEC, skey):.3f}x "
                         "| | |")
    lines.append("")
    for label, path in stats_paths.items():
        if not path.is_file():
            lines.append(f"{label}: no statistics file ({path}).")
            continue
        stats = PluginStats.load(path)
        lines.append(f"**{label}**: verified-depth histogram (request-steps, all phases incl. warm-up) "
                     f"{stats.depth_histogram()}; plugin overhead {stats.overhead_ms / max(stats.steps, 1) * 1000:.0f} "
                     f"us/step over {stats.steps} steps; fallback={stats.fallback}; drafter_width "
                     f"{stats.info.get('drafter_width')}.")
        between = [f"after a step {'with' if k == 'drafter' else 'without'} the drafter {ms / n:.2f} ms ({n} steps)"
                   for k, (n, ms) in sorted(stats.between_steps.items()) if n]
        if between:
            lines.append(f"- the engine core between steps (plugin-timed, requests unfinished): {'; '.join(between)}")
        mixed: dict[bool, list[float]] = {}
        for (phase, ran), entry in stats.mixed_costs.items():
            if phase != "warmup":
                mixed[ran] = [a + b for a, b in zip(mixed.get(ran, [0, 0.0, 0, 0]), entry, strict=True)]
        timed = [f"{'with' if ran else 'without'} the drafter {ms / n:.2f} ms ({int(n)} steps, {tokens / n:.0f} prompt "
                 f"tokens each)" for ran, (n, ms, tokens, _) in sorted(mixed.items(), reverse=True) if n]
        if timed:
            lines.append(f"- steps with prompt tokens (plugin-timed, warm-up excluded): {'; '.join(timed)}")
        for phase in sorted(stats.phases()):
            per = {cls: {d: p.num_drafts for d, p in stats.acceptance_by_depth(cls, [phase]).items()}
                   for cls in stats.classes([phase])}
            lines.append(f"- {phase}: drafts by class and verified depth {per}")
        lines.append("")
    lines += [f"Note: {n_}" for n_ in notes]
    lines.append(f"Total benchmark wall time {time.perf_counter() - started:.0f} s.")
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    (workdir / "runtime-figures.md").write_text(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(f"Figures in {workdir / 'runtime-figures.md'}")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    sys.exit(main())
