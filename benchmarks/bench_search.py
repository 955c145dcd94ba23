"""Search efficiency on the CPU fixtures: engine launches each strategy needs to reach 98% of the grid's best.

Usage::

    python -m benchmarks.bench_search --measure-grid [--models DIR] [--workload FILE]   # ~30 launches, ~25 min
    python -m benchmarks.bench_search --replay [--seeds 20] [--out docs/benchmarks/search.md]
    python -m benchmarks.bench_search --live   [--models DIR] [--workload FILE]          # model-guided, real engine
    python -m benchmarks.bench_search --profile-baseline                                  # 3 launches

``--measure-grid`` measures every config of a small space on the real engine (vLLM CPU build, `VLLMBackend`, one
fresh engine per config): drafters {drafter-1l, drafter-2l} (PARD ``draft_model`` drafters with parallel drafting)
x K in 1..6, plus no speculation, at concurrency 1 and 8 (26 launches), and profiles each drafter once
(`autotune.profiling.profile`: one launch per drafter at K_max=6 over concurrencies 1 and 8). It writes everything,
with the environment (device, vLLM version, date), to ``benchmarks/data/grid_cpu_fixtures.json``, after every launch
(a rerun skips what is already measured).

``--replay`` runs the real `autotune.search.Search` with each strategy (model-guided, blackbox TPE, random, grid)
over >= 10 seeds against `GridReplayBackend`, a backend that returns the measured grid's figure for the config asked
(a lookup of real measurements, not a prediction; each lookup counts as one engine launch because on the real
engine it is one). Model-guided predicts from the stored profiles (measured) and counts their launches (one per
drafter, shared by both scenarios). The figure per run: launches until the best measured config so far reaches 98%
of the grid's best output tokens/s at that concurrency.

``--live`` runs one model-guided search on the real engine at both concurrencies, from a fresh database: it
profiles each drafter (one launch each, counted) and verifies its candidates with real launches; the result is
compared with the measured grid.

``--profile-baseline`` profiles both drafters again with the shared no-speculation launch (``profile(baseline=True)``,
3 launches), so the step-cost model knows the cost of a step without the drafter; ``--replay`` then also shows
model-guided predicting from those profiles ("model-guided+baseline", 3 profile launches).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.backends import Backend
from autotune.measurement import Measurement, Provenance
from autotune.search import DrafterChoice, SearchSpace
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from benchmarks.common import DEFAULT_MODELS, REPO
from benchmarks.common import DEFAULT_WORKLOAD as FIXTURE_WORKLOAD

DEFAULT_WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", FIXTURE_WORKLOAD))
DEFAULT_DATA = REPO / "benchmarks" / "data" / "grid_cpu_fixtures.json"
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "search.md"
DRAFTERS = ("drafter-1l", "drafter-2l")
LAYERS = {"drafter-1l": 1, "drafter-2l": 2}
K_MAX = 6
CONCURRENCIES = (1, 8)
MAX_NUM_SEQS = 8
NUM_PROMPTS = 24
PROFILE_PROMPTS = 48
TARGET_FRACTION = 0.98
ENGINE: dict[str, Any] = {"dtype": "float32", "max_model_len": 320, "engine_extra": {"enforce_eager": True,
                                                                      "enable_prefix_caching": False}}
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


# ----------------------------------------------------------------------------------------------------- the space


def fixture_space(drafter_paths: Mapping[str, str]) -> SearchSpace:
    """drafter-1l and drafter-2l (parallel drafting on) x K 1..6 plus no speculation, max_num_seqs 8: 13 configs."""
    choices = tuple(
        DrafterChoice(name=drafter_paths[d], method="draft_model", layers=LAYERS[d], parallel_capable=True)
        for d in DRAFTERS
    )
    return SearchSpace(drafters=choices, k_min=1, k_max=K_MAX, max_num_seqs=(MAX_NUM_SEQS,), parallel_drafting="on")


def scenario_for(concurrency: int) -> Scenario:
    return Scenario(concurrency=concurrency, num_prompts=NUM_PROMPTS)


def config_key(config: SpecConfig | Mapping[str, Any]) -> str:
    """A path-independent key: ``none`` or ``<drafter dir name>:K<k>:pd<0|1>``."""
    c = config if isinstance(config, SpecConfig) else SpecConfig.from_dict(dict(config))
    if not c.speculative:
        return "none"
    return f"{Path(str(c.drafter)).name}:K{c.k}:pd{int(c.parallel_drafting)}"


# ------------------------------------------------------------------------------------------------- measure-grid


def _vllm_backend(models: Path) -> Any:
    from autotune.backends import VLLMBackend

    return VLLMBackend(
        str(models / "target"), timeout_s=900.0, ignore_eos=True, env=ENGINE_ENV, cpu_kv_cache_gib=1,
        dtype=ENGINE["dtype"], max_model_len=ENGINE["max_model_len"], engine_extra=ENGINE["engine_extra"],
    )


def _environment() -> dict[str, Any]:
    from autotune.environment import detect_environment

    env = detect_environment()
    env["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    env["cpu_count"] = os.cpu_count()
    return env


def _save(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _measure_entry(backend: Any, config: SpecConfig, workload: Workload, concurrency: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    t = time.perf_counter()
    m = backend.measure(config, workload, scenario_for(concurrency))
    m.log_tail = None
    return {"concurrency": concurrency, "key": config_key(config), "config": config.to_dict(),
            "measurement": m.to_dict(), "launch_s": time.perf_counter() - t,
            "loadavg_1min": [load_before[0], os.getloadavg()[0]]}


def _entry_line(entry: Mapping[str, Any]) -> str:
    m = entry["measurement"]
    value = f"{m['output_tokens_per_s']:.1f} tok/s" if m.get("ok", True) else f"FAILED {m.get('failure_reason')}"
    return f"c={entry['concurrency']} {entry['key']}: {value} ({entry['launch_s']:.0f} s, load {entry['loadavg_1min']})"


def measure_profiles_with_baseline(models: Path, workload_path: Path, out: Path) -> None:
    """Profile both drafters again with the shared no-speculation launch (``profile(baseline=True)``: 3 launches),
    so the cost model knows what a step costs without the drafter; stored as ``profiles_baseline``."""
    from autotune.profiling import profile

    workload = load_workload(workload_path)
    data = json.loads(out.read_text())
    if data.get("profiles_baseline"):
        return
    paths = [str((models / d).resolve()) for d in DRAFTERS]
    t = time.perf_counter()
    results = profile(
        str(models / "target"), paths, workload, concurrencies=CONCURRENCIES, max_k=K_MAX, method="draft_model",
        parallel_drafting=True, num_prompts=PROFILE_PROMPTS, ignore_eos=True, timeout_s=1200.0, baseline=True,
        dtype=ENGINE["dtype"], max_model_len=ENGINE["max_model_len"], engine_extra=ENGINE["engine_extra"],
        env=ENGINE_ENV, progress=lambda line: print(line, flush=True),
    )
    if not all(r.ok for r in results):
        raise SystemExit("; ".join(f"{r.drafter}: {r.failure_kind}: {r.failure_reason}" for r in results if not r.ok))
    data["profiles_baseline"] = {d: {**r.to_dict(), "engine_launches": 1} for d, r in zip(DRAFTERS, results,
                                                                                      strict=True)}
    data["profiles_baseline_launches"] = len(DRAFTERS) + 1
    data["profiles_baseline_s"] = time.perf_counter() - t
    _save(out, data)


def measure_grid(models: Path, workload_path: Path, out: Path, passes: int = 1) -> None:
    from autotune.profiling import profile

    workload = load_workload(workload_path)
    paths = {d: str((models / d).resolve()) for d in DRAFTERS}
    space = fixture_space(paths)
    data: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    if data.get("workload_hash") not in (None, workload.content_hash()):
        raise SystemExit(f"{out} holds a grid of another workload; move it away first.")
    data.setdefault("environment", _environment())
    data.update(
        workload=str(workload_path), workload_hash=workload.content_hash(), models=str(models),
        settings={"engine": ENGINE, "env": ENGINE_ENV, "ignore_eos": True, "num_prompts": NUM_PROMPTS,
                  "max_num_seqs": MAX_NUM_SEQS, "backend": "vllm offline (one fresh engine per config)",
                  "profile": {"max_k": K_MAX, "concurrencies": list(CONCURRENCIES), "num_prompts": PROFILE_PROMPTS}},
        space=space.to_dict(),
    )
    data.setdefault("measurements", [])
    data.setdefault("profiles", {})
    started = time.perf_counter()
    for d in DRAFTERS:
        if d in data["profiles"]:
            continue
        print(f"profiling {d} (one launch)", flush=True)
        t = time.perf_counter()
        [result] = profile(
            str(models / "target"), [paths[d]], workload, concurrencies=CONCURRENCIES, max_k=K_MAX,
            method="draft_model", parallel_drafting=True, num_prompts=PROFILE_PROMPTS, ignore_eos=True,
            timeout_s=1200.0, dtype=ENGINE["dtype"], max_model_len=ENGINE["max_model_len"],
            engine_extra=ENGINE["engine_extra"], env=ENGINE_ENV,
        )
        if not result.ok:
            raise SystemExit(f"profile of {d} failed: {result.failure_kind}: {result.failure_reason}\n"
                             f"{result.log_tail}")
        record = result.to_dict()
        record["launch_s"] = time.perf_counter() - t
        data["profiles"][d] = record
        _save(out, data)
    backend = _vllm_backend(models)
    done = {(m["concurrency"], m["key"], m.get("pass", 0)) for m in data["measurements"]}
    for n in range(passes):
        todo = [(c, cfg) for c in CONCURRENCIES for cfg in space.grid()]
        random.Random(n).shuffle(todo)  # spread slow drifts of the shared machine over the grid
        for i, (c, cfg) in enumerate(todo, start=1):
            if (c, config_key(cfg), n) in done:
                continue
            entry = {**_measure_entry(backend, cfg, workload, c), "pass": n}
            data["measurements"].append(entry)
            _save(out, data)
            print(f"[pass {n}: {i}/{len(todo)}] {_entry_line(entry)}", flush=True)
    # Repeats: no speculation and the two best configs per concurrency once more, for the measurement noise.
    data.setdefault("repeats", [])
    for c in CONCURRENCIES:
        rows = sorted(((float(e["measurement"]["output_tokens_per_s"] or 0), e["key"], e["config"])
                       for e in data["measurements"] if e["concurrency"] == c), reverse=True)
        picks = [r for r in rows if r[1] == "none"] + [r for r in rows if r[1] != "none"][:2]
        for _, key, cfg_dict in picks:
            if any(r["concurrency"] == c and r["key"] == key for r in data["repeats"]):
                continue
            entry = _measure_entry(backend, SpecConfig.from_dict(cfg_dict), workload, c)
            data["repeats"].append(entry)
            _save(out, data)
            print(f"[repeat] {_entry_line(entry)}", flush=True)
    data["measure_s"] = data.get("measure_s", 0.0) + time.perf_counter() - started
    _save(out, data)
    print(f"wrote {out}")


# ------------------------------------------------------------------------------------------------------- replay


class GridReplayBackend(Backend):
    """Returns the measured grid's figures for a config (a lookup of real vLLM measurements, not a prediction).

    The config is matched by drafter directory name, K and parallel drafting at the scenario's concurrency; a config
    outside the grid fails as ``invalid_config``. Every call counts as one engine launch (``launches``).
    """

    name = "vllm"

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.table: dict[tuple[int, str], dict[str, Any]] = {
            (int(e["concurrency"]), str(e["key"])): e["measurement"] for e in best_entries(data)
        }
        self.launches = 0

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        self.launches += 1
        entry = self.table.get((scenario.concurrency, config_key(config)))
        if entry is None:
            return Measurement.failed(config, scenario, Provenance(kind="measured", backend="vllm", device="cpu"),
                                      "invalid_config",
                                      f"{config_key(config)} at concurrency {scenario.concurrency} is not in the grid")
        m = Measurement.from_dict(entry)
        return m.__class__(**{**m.__dict__, "config": config, "scenario": scenario})


def best_entries(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (concurrency, config) the fastest of its launches (grid passes and repeats): other processes on the shared
    machine only ever slow a launch down, so the fastest is the least disturbed measurement of the config."""
    best: dict[tuple[int, str], dict[str, Any]] = {}
    for e in [*data["measurements"], *data.get("repeats", [])]:
        key = (int(e["concurrency"]), str(e["key"]))
        value = float(e["measurement"].get("output_tokens_per_s") or 0.0) if e["measurement"].get("ok", True) else 0.0
        held = best.get(key)
        if held is None or value > float(held["measurement"].get("output_tokens_per_s") or 0.0):
            best[key] = e
    return list(best.values())


def launch_spread(data: Mapping[str, Any]) -> list[float]:
    """Per config measured more than once: (fastest - slowest) / fastest of its tokens/s."""
    values: dict[tuple[int, str], list[float]] = {}
    for e in [*data["measurements"], *data.get("repeats", [])]:
        if e["measurement"].get("ok", True):
            values.setdefault((e["concurrency"], e["key"]), []).append(float(e["measurement"]["output_tokens_per_s"]))
    return [(max(v) - min(v)) / max(v) for v in values.values() if len(v) > 1]



class NoisyReplay(GridReplayBackend):
    """`GridReplayBackend` with each looked-up tokens/s multiplied by exp(N(0, sigma)) per (config, concurrency),
    drawn once per seed: what a strategy sees when every launch is as noisy as ``sigma`` (relative)."""

    def __init__(self, data: Mapping[str, Any], sigma: float, seed: int) -> None:
        super().__init__(data)
        rng = random.Random(seed)
        self.factor = {key: rng.lognormvariate(0.0, sigma) for key in sorted(self.table)}

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        m = super().measure(config, workload, scenario)
        f = self.factor.get((scenario.concurrency, config_key(config)), 1.0)
        if m.ok and m.output_tokens_per_s is not None:
            m.output_tokens_per_s *= f
            m.tpot_ms_p50 = None if m.tpot_ms_p50 is None else m.tpot_ms_p50 / f
        return m


class _Recorder(Backend):
    """Counts launches per concurrency and remembers their order (the replayed backend does the lookups)."""

    name = "vllm"

    def __init__(self, inner: GridReplayBackend) -> None:
        self.inner = inner
        self.calls: dict[int, list[str]] = {}

    def measure(self, config: SpecConfig, workload: Workload, scenario: Scenario) -> Measurement:
        self.calls.setdefault(scenario.concurrency, []).append(config_key(config))
        return self.inner.measure(config, workload, scenario)


def _profile_provider(data: Mapping[str, Any], which: str = "profiles") -> Any:
    from autotune.profiling import predictor_from_profile
    from autotune.search import DrafterProfile

    def provide(ctx: Any, drafter: DrafterChoice) -> DrafterProfile:
        record = data[which][Path(drafter.name).name]
        acceptance, cost = predictor_from_profile(record)
        return DrafterProfile(drafter.name, acceptance, cost, f"profile of {Path(drafter.name).name} (grid file)",
                              None, int(record.get("engine_launches", 1)))

    return provide


def _true_values(data: Mapping[str, Any], concurrency: int) -> dict[str, float]:
    return {e["key"]: float(e["measurement"]["output_tokens_per_s"] or 0.0) for e in best_entries(data)
            if e["concurrency"] == concurrency and e["measurement"].get("ok", True)}


def run_strategy(data: Mapping[str, Any], models: Path, workload: Workload, strategy_name: str, seed: int,
                 sigma: float = 0.0) -> dict[int, dict[str, Any]]:
    """One replayed search of every concurrency with one strategy; per concurrency: launches to reach 98% of the
    grid's best (profiling included), launches until the search ended, the recommended config's true share."""
    import optuna

    from autotune.search import ModelGuidedStrategy, Search, make_strategy
    from store import Store

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    paths = {d: str((models / d).resolve()) for d in DRAFTERS}
    space = fixture_space(paths)
    inner = NoisyReplay(data, sigma, seed) if sigma > 0 else GridReplayBackend(data)
    backend = _Recorder(inner)
    n_grid = len(space.grid())
    trials = {"blackbox": n_grid - 1, "random": n_grid, "grid": n_grid}.get(strategy_name)
    guided = strategy_name.startswith("model-guided")
    which = "profiles_baseline" if strategy_name == "model-guided+baseline" else "profiles"
    strategy = ModelGuidedStrategy() if guided else make_strategy(strategy_name)
    profiles = _profile_provider(data, which) if guided else None
    out: dict[int, dict[str, Any]] = {}
    for c in CONCURRENCIES:
        store = Store("sqlite://")
        search = Search(store=store, backend=backend, model=str(models / "target"), device="cpu", workload=workload,
                        space=space, strategy=strategy, n_trials=trials, seed=seed,
                        study_prefix=f"bench-{strategy_name}-{seed}", profiles=profiles)
        result = search.run_scenario(scenario_for(c))
        truth = _true_values(data, c)
        best_key, best = max(truth.items(), key=lambda kv: kv[1])
        profile_launches = 0
        if which == "profiles_baseline" and guided:
            profile_launches = int(data["profiles_baseline_launches"])
        elif guided:
            profile_launches = sum(int(r.get("engine_launches", 1)) for r in data["profiles"].values())
        reached = None
        seen: list[tuple[float, str]] = []  # (value the strategy saw, key)
        for i, key in enumerate(backend.calls.get(c, []), start=1):
            measured = truth.get(key, 0.0) * (inner.factor.get((c, key), 1.0) if isinstance(inner, NoisyReplay) else 1)
            seen.append((measured, key))
            chosen = max(seen)[1]
            if reached is None and truth.get(chosen, 0.0) >= TARGET_FRACTION * best:
                reached = i + profile_launches
        out[c] = {
            "reached": reached,
            "total": len(backend.calls.get(c, [])) + profile_launches,
            "share": truth.get(config_key(result.best.config), 0.0) / best,
            "best_key": best_key,
            "chosen": config_key(result.best.config),
            "profile_launches": profile_launches,
            "stop": result.strategy_report.get("stop_reason"),
        }
        store.close() if hasattr(store, "close") else None
    return out


def _summary(values: Sequence[int | None], budget: int) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"never (0/{len(values)})"
    text = f"{statistics.mean(got):.1f} / {statistics.median(got):g} / {max(got)}"
    if len(got) < len(values):
        text += f" (not reached in {len(values) - len(got)}/{len(values)})"
    return text


def replay(data: Mapping[str, Any], seeds: int, models: Path = DEFAULT_MODELS,
           workload_path: Path | None = None, sigmas: Sequence[float] = (0.0, 0.03),
           strategies: Sequence[str] | None = None) -> str:
    workload = load_workload(workload_path or Path(data["workload"]))
    paths = {d: str((models / d).resolve()) for d in DRAFTERS}
    n_grid = len(fixture_space(paths).grid())
    lines = [_grid_table(data), ""]
    for sigma in sigmas:
        title = "exact replay" if sigma == 0 else f"replay with {sigma:.0%} lognormal noise per launch (new per seed)"
        lines += [f"### Launches to reach {TARGET_FRACTION:.0%} of the grid's best: {title}", "",
                  f"{seeds} seeds; grid = {n_grid} launches per concurrency ({n_grid * len(CONCURRENCIES)} for both). "
                  "Launches: mean / median / max over seeds, profiling included for model-guided "
                  "(one launch per drafter, shared by both concurrencies). Recommended: the true (replayed) tokens/s "
                  "of the config each search recommends, as a share of the grid's best (mean / min).", "",
                  "| strategy | c | launches to 98% | launches until stop | recommended: share of best | "
                  "goal (<= 20% of grid) |", "|---|---|---|---|---|---|"]
        joint: dict[str, list[int | None]] = {}
        names = ["model-guided", "blackbox", "random", "grid"]
        if data.get("profiles_baseline"):
            names.insert(1, "model-guided+baseline")
        names = [n for n in names if strategies is None or n in strategies]
        for name in names:
            runs = [run_strategy(data, models, workload, name, seed, sigma) for seed in range(seeds)]
            for c in CONCURRENCIES:
                reached = [r[c]["reached"] for r in runs]
                total = [r[c]["total"] for r in runs]
                share = [r[c]["share"] for r in runs]
                ok = all(v is not None and v <= 0.2 * n_grid for v in reached)
                label = "blackbox (TPE)" if name == "blackbox" else name
                lines.append(f"| {label} | {c} | {_summary(reached, n_grid)} | {statistics.mean(total):.1f} | "
                             f"{statistics.mean(share):.3f} / {min(share):.3f} | "
                             f"{'yes' if ok else 'no'} (<= {0.2 * n_grid:.1f}) |")
            pl = runs[0][CONCURRENCIES[0]]["profile_launches"]
            joint[name] = [
                None if any(r[c]["reached"] is None for c in CONCURRENCIES)
                else sum(int(r[c]["reached"]) - r[c]["profile_launches"] for c in CONCURRENCIES) + pl
                for r in runs
            ]
        budget = n_grid * len(CONCURRENCIES)
        lines += ["", f"Both concurrencies together (grid: {budget} launches; 20% = {0.2 * budget:.1f}; model-guided "
                  "counts its profile launches once):", "", "| strategy | launches to 98% at both | goal |",
                  "|---|---|---|"]
        for name, values in joint.items():
            ok = all(v is not None and v <= 0.2 * budget for v in values)
            lines.append(f"| {name} | {_summary(values, budget)} | {'yes' if ok else 'no'} |")
        lines.append("")
    return "\n".join(lines)


def _grid_table(data: Mapping[str, Any]) -> str:
    env = data.get("environment", {})
    spread = launch_spread(data)
    rows = ["### The measured grid (output tokens/s; vLLM, one fresh engine per launch; fastest launch per config)",
            "",
            f"Device {env.get('device')} ({env.get('cpu_count')} CPUs), vLLM {env.get('vllm_version')}, torch "
            f"{env.get('torch_version')}, measured {env.get('date')}; workload {Path(str(data.get('workload'))).name} "
            f"({NUM_PROMPTS} prompts per config, ignore_eos), max_num_seqs {MAX_NUM_SEQS}. "
            f"{len(data['measurements']) + len(data.get('repeats', []))} launches for {len(_true_values(data, 1)) * 2} "
            f"configs; launches of the same config differed by {statistics.median(spread):.0%} (median) and up to "
            f"{max(spread):.0%} (fastest - slowest) / fastest.", ""]
    keys = sorted({e["key"] for e in data["measurements"]}, key=lambda k: (k != "none", k))
    rows += ["| config | " + " | ".join(f"c={c}" for c in CONCURRENCIES) + " |",
             "|---|" + "---|" * len(CONCURRENCIES)]
    best = {c: max(_true_values(data, c).values()) for c in CONCURRENCIES}
    for key in keys:
        cells = []
        for c in CONCURRENCIES:
            v = _true_values(data, c).get(key)
            cells.append("-" if v is None else (f"**{v:.1f}**" if v == best[c] else f"{v:.1f}"))
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def live(data: Mapping[str, Any], models: Path, workload_path: Path, db: Path | None = None) -> str:
    """One model-guided search on the real engine at every concurrency: profiles each drafter (one launch each, in
    a fresh database, so nothing is reused), verifies the best predictions, stops by the rule. Compared with the
    measured grid."""
    import tempfile

    from autotune.search import ModelGuidedStrategy, Search
    from store import Store

    workload = load_workload(workload_path)
    paths = {d: str((models / d).resolve()) for d in DRAFTERS}
    space = fixture_space(paths)
    backend = _vllm_backend(models)
    db = db or Path(tempfile.mkdtemp(prefix="bench-search-")) / "peagle.db"
    strategy = ModelGuidedStrategy()
    search = Search(store=Store(f"sqlite:///{db}"), backend=backend, model=str(models / "target"), device="cpu",
                    workload=workload, space=space, strategy=strategy, study_prefix="live",
                    profile_concurrencies=CONCURRENCIES)
    started = time.perf_counter()
    env = _environment()
    rows = ["### Live model-guided run (real engine)", "",
            f"Device {env['device']} ({env['cpu_count']} CPUs), vLLM {env['vllm_version']}, {env['date']}; same engine "
            "settings and workload as the grid; fresh database, so each drafter was profiled (one launch each).", "",
            "| c | recommended | measured tok/s (live) | grid tok/s of it | grid best | share of grid best | "
            "launches (profiling + trials) | grid launches | stop |", "|---|---|---|---|---|---|---|---|---|"]
    for c in CONCURRENCIES:
        t = time.perf_counter()
        result = search.run_scenario(scenario_for(c))
        truth = _true_values(data, c)
        best_key, best = max(truth.items(), key=lambda kv: kv[1])
        key = config_key(result.best.config)
        rows.append(
            f"| {c} | {key} | {result.best.output_tokens_per_s:.1f} | {truth.get(key, float('nan')):.1f} | "
            f"{best_key} {best:.1f} | {truth.get(key, 0.0) / best:.3f} | {result.engine_launches} "
            f"({result.profile_launches} + {result.n_measurements}) | {len(space.grid())} | "
            f"{result.strategy_report.get('stop_reason')} |"
        )
        trace = result.strategy_report.get("trace", [])
        print(f"c={c}: {key} in {time.perf_counter() - t:.0f} s; trace: {json.dumps(trace, default=str)}", flush=True)
    rows += ["", f"Wall time {time.perf_counter() - started:.0f} s (profiling and trials)."]
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--measure-grid", action="store_true", help="measure the full grid and the profiles (vLLM)")
    mode.add_argument("--replay", action="store_true", help="replay the measured grid for every strategy")
    mode.add_argument("--live", action="store_true", help="one model-guided search on the real engine")
    mode.add_argument("--profile-baseline", action="store_true",
                      help="profile both drafters again with the no-speculation launch (3 launches)")
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--passes", type=int, default=1, help="--measure-grid: measure the grid this many times")
    parser.add_argument("--strategies", default=None, help="--replay: comma-separated subset of the strategies")
    parser.add_argument("--out", type=Path, default=None, help="write the tables (markdown) here")
    args = parser.parse_args(argv)
    if args.measure_grid:
        measure_grid(args.models, args.workload, args.data, args.passes)
        return 0
    if args.profile_baseline:
        measure_profiles_with_baseline(args.models, args.workload, args.data)
        return 0
    data = json.loads(args.data.read_text())
    if args.replay:
        text = replay(data, args.seeds, args.models, args.workload,
                      strategies=args.strategies.split(",") if args.strategies else None)
    else:
        text = live(data, args.models, args.workload)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
