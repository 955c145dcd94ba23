"""Validate the simulator on the CPU fixtures: simulated vs measured tok/s of every config (a script, not a test).

Usage::

    # 1. measure: runs benchmarks.bench_runtime (needs vLLM and a QUIET machine; ~15 min on 2 cores) ...
    python -m benchmarks.validate_simulate --engine --bundle validate.json [--rounds 3] [--workdir DIR]
    #    ... or take the bundle from a bench_runtime run already made (its --workdir)
    python -m benchmarks.validate_simulate --runtime-workdir DIR --bundle validate.json
    # 2. simulate and compare (no engine; seconds)
    python -m benchmarks.validate_simulate --bundle validate.json [--out FILE]

The measurements are those of ``benchmarks.bench_runtime`` (one offline ``vllm.LLM`` engine per config, all
resident, configs interleaved in rounds; shifting and stationary workloads closed-loop at each concurrency, at c=1
the first ``--c1-requests`` of each phase one at a time): its profile of the drafter (``autotune.profiling.profile``,
one launch at K_max with the depth plan plus one without speculation: acceptance per class, the fitted step-cost
model and, recorded by the scheduler plugin, per-request traces of verified and accepted drafts per step), and every
config: no speculation, static K = 1..K_max, vLLM's batch-size schedule, the adaptive controller with drafter-width
control off (trimming) and as shipped (drafter width on). Each figure is the median over rounds.

Step 2 simulates the same requests (prompt tokens = bytes + <bos>; output lengths = those the no-speculation run
generated, which every greedy config reproduces) with `autotune.simulate`: the profile's fitted step-cost model, its
acceptance per class, the recorded traces, and the acceptance autocorrelation fitted to the traces; the adaptive
configs run the real `policies` controller, drafter-width control with the off-step mode its engine recorded
(``catch_up`` for the fixtures' token-only drafter: a step where every depth is 0 skips the drafter, prompt steps
too, and a request replays what it missed when it drafts again). Steps are priced at the profile launches' per-shape
*mean* step times (the stored fit is made of medians, a run pays the mean: `autotune.simulate.mean_cost_model` of the
``step_means`` collected from the profile's plugin-stats.json; ``--fit-only`` keeps the stored fit and drops every
term below). Beyond the fit (`autotune.simulate.profile_terms`):
a skipped drafter's step costs what the profile measured (speculative launch's drafter-off steps minus the
no-speculation launch's), the drafter's prompt tokens and catch-up replay cost the fit's per-token time times
r/(1+r), r the drafter/target weight ratio (from the two models' config.json), and each adaptive config adds the
scheduler plugin's own host time per step measured in its run (``overhead_ms / steps`` of its plugin statistics);
and the engine core's draft fetch after each drafting step at its mean in the profile's speculative launch (runs whose
plugin did not time it: 0 unless ``--draft-fetch-ms`` gives it); prompt tokens at the target's price
measured on the profile's no-speculation steps with prompts (`autotune.simulate.prompt_token_costs`). And, with or
without the terms, vLLM's prefix cache as the benchmark's engines have it (on, 128-token blocks on the CPU backend,
emptied at the start of each round, the runs of a round in the bench's order: `round_caches`; each figure the mean
of the two round orders; ``--no-prefix-cache`` leaves it out).
The table gives, per concurrency, config and workload, measured and simulated tok/s and the error, twice: with the
cost model as fitted, and with every step time multiplied by one scale fitted on the no-speculation config alone at
that concurrency (the profile and the measured runs are different engine launches); the other configs are then
predictions. The issue's goal: every config within 10%.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import round_tokens_per_s

NO_SPEC = "no speculation"
CPU_BLOCK_SIZE = 128
"""vLLM's KV-cache block size on its CPU backend (``vllm/platforms/cpu.py``), the unit of its prefix cache."""


# ================================================================================================= step 1: measure
def _find_traces(root: Path) -> list[dict[str, Any]]:
    """Traces of the speculative profile launch: the plugin-stats.json files under ``root`` that hold any."""
    traces: list[dict[str, Any]] = []
    for path in sorted(root.rglob("plugin-stats.json")):
        data = json.loads(path.read_text())
        if (data.get("info") or {}).get("num_speculative_tokens"):
            traces += data.get("traces") or []
    return traces


def _step_means(root: Path, profile: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The profile launches' decode steps as per-shape *means* (``PluginStats.step_samples(statistic="mean")`` of
    each plugin-stats.json under ``root``, over the measured phases of ``profile``, else every phase but the warm-up):
    {"speculative": [...], "baseline": [...]} as sample dicts; a kind is missing when no launch of it recorded
    statistics."""
    from policies.plugin import PluginStats

    phases = [str(p["name"]) for p in profile.get("phases") or () if p.get("name")] or None
    sequential = bool((profile.get("cost_model") or {}).get("sequential"))
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(root.rglob("plugin-stats.json")):
        stats = PluginStats.load(path)
        kind = "speculative" if stats.info.get("num_speculative_tokens") else "baseline"
        measured = phases if phases is not None else [p for p in stats.phases() if p != "warmup"]
        samples = stats.step_samples(measured, sequential=sequential, statistic="mean")
        out.setdefault(kind, []).extend(
            {"batch_size": x.batch_size, "depth": x.depth, "step_ms": x.step_ms, "n": x.n,
             "verified_tokens": x.verified_tokens, "drafter_ran": x.drafter_ran} for x in samples
        )
    return out


def _prompt_steps(root: Path) -> dict[str, list[dict[str, Any]]]:
    """The profile launches' steps with prompt tokens, per phase and whether the drafter ran (``mixed_step_costs`` of
    each plugin-stats.json under ``root``, the warm-up left out): {"speculative": [...], "baseline": [...]}."""
    from policies.plugin import PluginStats

    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(root.rglob("plugin-stats.json")):
        stats = PluginStats.load(path)
        kind = "speculative" if stats.info.get("num_speculative_tokens") else "baseline"
        out.setdefault(kind, []).extend(e for e in stats.prompt_steps() if e["phase"] != "warmup")
    return out


def _draft_fetch(root: Path) -> dict[str, Any]:
    """The mean time of the engine core's draft fetch in the profile's speculative launch(es), ms (the plugin times
    it, ``draft_fetch`` in plugin-stats.json): {"draft_fetch_ms", "draft_fetch_n"}, or {} when no
    launch recorded one."""
    n, total = 0, 0.0
    for path in sorted(root.rglob("plugin-stats.json")):
        data = json.loads(path.read_text())
        if (data.get("info") or {}).get("num_speculative_tokens"):
            fetch = data.get("draft_fetch") or {}
            n, total = n + int(fetch.get("n", 0)), total + float(fetch.get("sum_ms", 0.0))
    return {"draft_fetch_ms": total / n, "draft_fetch_n": n} if n else {}


def _plugin_host_time(workdir: Path, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per adaptive config, the plugin's own host time in its measured run: ``overhead_ms / steps`` of the plugin
    statistics bench_runtime wrote (adaptive-new-stats.json with drafter width, adaptive-trim-stats.json without)."""
    out: dict[str, dict[str, Any]] = {}
    for label, meta in configs.items():
        if meta.get("kind") != "adaptive":
            continue
        name = "new" if meta.get("drafter_width", True) else "trim"
        path = workdir / f"adaptive-{name}-stats.json"
        if not path.is_file():
            continue
        stats = json.loads(path.read_text())
        steps = int(stats.get("steps") or 0)
        if steps:
            overhead = float(stats.get("overhead_ms") or 0.0)
            out[label] = {"overhead_ms": overhead, "steps": steps, "ms_per_step": overhead / steps,
                          "source": path.name}
    return out


def _off_steps(workdir: Path, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Per drafter-width config, the off-step mode its engine's workers agreed on at the handshake (``catch_up``,
    ``sync_pass`` or ``holes``: ``info["drafter_width"]["off_steps"]`` of adaptive-new-stats.json), when recorded."""
    out: dict[str, str] = {}
    for label, meta in configs.items():
        if meta.get("kind") != "adaptive" or not meta.get("drafter_width", True):
            continue
        path = workdir / "adaptive-new-stats.json"
        if path.is_file():
            mode = ((json.loads(path.read_text()).get("info") or {}).get("drafter_width") or {}).get("off_steps")
            if mode:
                out[label] = str(mode)
    return out


def _model_configs(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's target and drafter config.json (local fixture directories), for the drafter's token cost."""
    from autotune.simulate import model_config

    return {"target": model_config(profile.get("model")), "drafter": model_config(profile.get("drafter"))}


def bundle_from_runtime(workdir: Path) -> dict[str, Any]:
    """The bundle of a finished ``bench_runtime --workdir DIR`` run (its bench.json, profile.json, rounds.json,
    the profile launch's recorded traces, the adaptive configs' plugin host time and the two models' configs)."""
    missing = [n for n in ("bench.json", "profile.json", "rounds.json") if not (workdir / n).is_file()]
    if missing:
        raise SystemExit(f"{workdir} lacks {missing}: is it the --workdir of a finished bench_runtime run?")
    bench = json.loads((workdir / "bench.json").read_text())
    profile = json.loads((workdir / "profile.json").read_text())
    return {
        "date": bench["date"],
        "load_average": {"before": bench["load_before"], "after": bench["load_after"]},
        "concurrencies": bench["concurrencies"],
        "max_k": bench["max_k"],
        "c1_requests": bench["c1_requests"],
        "profile": profile,
        "traces": _find_traces(workdir / "profile"),
        "workloads": bench["workloads"],
        "configs": bench["configs"],
        "runs": json.loads((workdir / "rounds.json").read_text()),
        "plugin_host_time": _plugin_host_time(workdir, bench["configs"]),
        "off_steps": _off_steps(workdir, bench["configs"]),
        "model_configs": _model_configs(profile),
        "step_means": _step_means(workdir / "profile", profile),
        "prompt_steps": _prompt_steps(workdir / "profile"),
        **_draft_fetch(workdir / "profile"),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmarks.bench_runtime (profile + every config in ``args.rounds`` interleaved rounds); its bundle."""
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peagle-validate-simulate-"))
    argv = ["--workdir", str(workdir), "--rounds", str(args.rounds), "--out", str(workdir / "runtime.md")]
    from benchmarks import bench_runtime

    if bench_runtime.main(argv) != 0:
        raise SystemExit("benchmarks.bench_runtime failed; see its output above.")
    return bundle_from_runtime(workdir)


# ================================================================================================= step 2: compare
def bundle_phases(
    workloads: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    outputs: Mapping[str, Any] | None,
    limit: int | None = None,
) -> dict[str, list[Any]]:
    """The bundle's requests as simulator phases: prompt tokens = UTF-8 bytes + <bos> (the fixtures' byte-level
    tokenizer); output tokens = what the no-speculation run generated (``outputs[name][phase]["outputs"]``), else
    ``max_tokens``. ``limit``: only the first requests of each phase (the c=1 runs send that many)."""
    from autotune.simulate import Phase, SimRequest

    out: dict[str, list[Any]] = {}
    index = 0
    for name, phases in workloads.items():
        converted = []
        for p, reqs in enumerate(phases):
            generated = outputs[name][p]["outputs"] if outputs is not None else None
            requests = []
            for i, r in enumerate(reqs[:limit]):
                n_out = len(generated[i]) if generated is not None else int(r["max_tokens"])
                requests.append(SimRequest(index, str(r["class"]), len(str(r["prompt"]).encode()) + 1, max(n_out, 1),
                                           prompt_key=_prompt_key(str(r["prompt"]))))
                index += 1
            converted.append(Phase(f"{name}:{p}", tuple(requests)))
        out[name] = converted
    return out


def _prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def round_caches(bundle: Mapping[str, Any]) -> dict[tuple[int, str], list[set[str]]]:
    """Per (concurrency, workload), the prompts vLLM's prefix cache holds when that run starts, once per round order:
    bench_runtime empties the cache at the start of each round, then runs the concurrencies and workloads in its
    job's order in even rounds and in reverse in odd ones (c=1 runs the first ``c1_requests`` of each phase). The
    measured figure is a median over rounds of both orders."""
    concurrencies = [int(c) for c in bundle["concurrencies"]]
    names = list(bundle["workloads"])
    limit = bundle.get("c1_requests")
    out: dict[tuple[int, str], list[set[str]]] = {}
    for parity in (0, 1):
        seen: set[str] = set()
        for c in concurrencies if parity == 0 else concurrencies[::-1]:
            for name in names if parity == 0 else names[::-1]:
                out.setdefault((c, name), []).append(set(seen))
                for phase in bundle["workloads"][name]:
                    seen.update(_prompt_key(str(r["prompt"])) for r in phase[: limit if c == 1 else None])
    return out


def _sim_config(meta: Mapping[str, Any], setup: Any, plugin_ms: float = 0.0, off_steps: str | None = None) -> Any:
    from autotune.search.schedule import ScheduleEntry
    from autotune.simulate import Adaptive, BatchSizeSchedule, NoSpeculation, StaticDepth
    from policies import RequestPolicy

    kind = meta["kind"]
    if kind == "none":
        return NoSpeculation()
    if kind == "static":
        return StaticDepth(int(meta["k"]))
    if kind == "schedule":
        return BatchSizeSchedule(tuple(ScheduleEntry(*e) for e in meta["entries"]),
                                 zero_depth_drafting=None if setup.parallel_drafting else 1)
    policy = RequestPolicy.from_dict(meta["policy"])
    width = bool(meta.get("drafter_width", True))  # the plugin as shipped drafts the planned width
    return Adaptive(policy, setup.controller_cost[width], dict(setup.acceptance.profiles), drafter_width=width,
                    plugin_ms_per_step=plugin_ms, off_steps=off_steps or setup.off_steps)


def _scaled(profile: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """The profile with every coefficient of its step-cost model multiplied by ``scale``."""
    cost = dict(profile["cost_model"])
    cost["coefficients"] = {k: float(v) * scale for k, v in cost["coefficients"].items()}
    return {**profile, "cost_model": cost}


def priced_profile(bundle: Mapping[str, Any], means: bool = True) -> tuple[dict[str, Any], str]:
    """The profile the simulator prices steps with, and a note saying how. ``means`` and the bundle has the profile
    launches' per-shape means (``step_means``): its step-cost model refitted on them (`autotune.simulate.
    mean_cost_model`; a run pays the mean step, the profile's samples are medians), its step and baseline samples
    replaced by the means (so the skipped-drafter step is measured on means too); else the profile as stored."""
    from autotune.simulate import mean_cost_model
    from policies import StepCostModel, StepSample

    profile = dict(bundle["profile"])
    stored = (bundle.get("step_means") or {}) if means else {}
    spec = [StepSample(**x) for x in stored.get("speculative") or ()]
    base = [StepSample(**x) for x in stored.get("baseline") or ()]
    if not (spec and base):
        return profile, "step times: the profile's fit on per-shape medians (no per-shape means in the bundle)"
    model = mean_cost_model(StepCostModel.from_dict(profile["cost_model"]), spec, base)
    profile["cost_model"] = model.to_dict()
    profile["step_samples"] = list(stored["speculative"])
    profile["baseline_samples"] = list(stored["baseline"])
    return profile, (f"step times: the profile's model refitted on per-shape means of its launches' plugin statistics "
                     f"({len(spec)} speculative, {len(base)} no-speculation shapes; the stored fit uses medians)")


def _terms(bundle: Mapping[str, Any], scale: float, profile: Mapping[str, Any] | None = None,
           draft_fetch_ms: float = 0.0, fetch_source: str = "") -> Any:
    """The step-cost terms beyond the fit for ``profile`` (default the bundle's) scaled by ``scale`` (the bundle's
    model configs, else the profile's model directories), plus ``draft_fetch_ms`` per drafting step (host time
    outside the step window, not scaled: the profile's measured fetch, or --draft-fetch-ms; ``fetch_source`` says
    which)."""
    from autotune.simulate import profile_terms, prompt_token_costs
    from policies import StepCostModel

    unscaled = profile if profile is not None else bundle["profile"]
    profile = _scaled(unscaled, scale)
    configs = bundle.get("model_configs") or _model_configs(profile)
    terms = profile_terms(profile, StepCostModel.from_dict(profile["cost_model"]), configs.get("target"),
                          configs.get("drafter"))
    # A measured difference of step times scales with them like the fit's coefficients.
    terms = replace(terms, idle_drafter_ms=terms.idle_drafter_ms * scale)
    # The bundle's prompt steps (collected from the launches' statistics files, so older runs have them too), priced
    # against the unscaled fit; measured step times scale like the fit's coefficients.
    prompt = prompt_token_costs(bundle.get("prompt_steps") or unscaled.get("prompt_steps") or {},
                                StepCostModel.from_dict(unscaled["cost_model"]))
    if prompt is not None:
        terms = replace(terms, prompt_token_ms=prompt[0] * scale, prompt_token_source=(
            f"measured in the profile: its no-speculation launch's steps with prompt tokens beyond the fit's decode "
            f"step, over {prompt[1]} prompt tokens"))
    if draft_fetch_ms > 0:
        terms = replace(terms, draft_fetch_ms=draft_fetch_ms, draft_fetch_source=fetch_source)
    return terms


def _summary(rows: Sequence[Mapping[str, Any]], key: str, what: str) -> str:
    judged = [r for r in rows if r["measured"] is not None and r["config"] != NO_SPEC]
    if not judged:
        return f"{what}: nothing to judge."
    errors = [abs(r[f"error{key}"]) for r in judged]
    simulated = f"simulated{key}"
    in_range = sum(r["measured_min"] <= r[simulated] <= r["measured_max"] for r in judged)
    return (f"{what}: {sum(e <= 0.10 for e in errors)} of {len(judged)} configs other than no speculation within "
            f"10%, {in_range} of {len(judged)} within their measured min-max, median |error| "
            f"{statistics.median(errors):.1%}, largest {max(errors):.1%} (goal: every config within 10%: "
            f"{'met' if max(errors) <= 0.10 else 'NOT met'}).")


def compare(bundle: Mapping[str, Any], *, seed: int = 0, terms: bool = True,
            draft_fetch_ms: float | None = None, prefix_cache_block: int | None = CPU_BLOCK_SIZE,
            ) -> tuple[list[str], list[dict[str, Any]]]:
    """Simulated vs measured per concurrency, config and workload; (markdown lines, rows). ``terms``: price steps
    at the profile launches' per-shape means and what the fit cannot see (skipped drafter, drafter's extra tokens,
    plugin host time); False: the stored fit alone. ``draft_fetch_ms``: host time of the draft fetch per drafting
    step (None: the bundle's ``draft_fetch_ms``, else 0; only with ``terms``). ``prefix_cache_block``: simulate vLLM's
    prefix cache with this block size, warm with the prompts run before in the round (`round_caches`; each figure
    the mean of the two round orders); None: no prefix cache."""
    from autotune.simulate import (
        PrefixCache,
        ProfileTerms,
        fit_autocorrelation,
        load_traces,
        profile_setup,
        simulate,
    )

    runs = bundle["runs"]
    profile, pricing = priced_profile(bundle, means=terms)
    fetch_ms = float((bundle.get("draft_fetch_ms") or 0.0) if draft_fetch_ms is None else draft_fetch_ms)
    fetch_source = ("host time given to the validation (--draft-fetch-ms)" if draft_fetch_ms is not None else
                    f"measured in the profile's speculative launch, mean of {bundle.get('draft_fetch_n')} fetches")
    if not terms:
        fetch_ms = 0.0
    plugin_time = (bundle.get("plugin_host_time") or {}) if terms else {}
    off_steps: Mapping[str, str] = bundle.get("off_steps") or {}  # else the profile's drafter decides (catch_up)
    base_ok = runs.get(NO_SPEC) or []
    if not base_ok:
        raise SystemExit("the bundle has no no-speculation run; its output lengths are needed.")
    tmp = Path(tempfile.mkdtemp(prefix="peagle-validate-traces-")) / "traces.json"
    tmp.write_text(json.dumps({"traces": bundle["traces"]}))
    traces = load_traces(tmp)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    off_notes: list[str] = []  # what the drafter-width configs' off-steps did in the simulation (fit as is)
    rho = statistic = 0.0
    caches = round_caches(bundle)
    for c in bundle["concurrencies"]:
        c = int(c)
        names = list(bundle["workloads"])
        outputs = {n: base_ok[0][f"c{c}:{n}"] for n in names}
        phases = bundle_phases(bundle["workloads"], outputs, bundle.get("c1_requests") if c == 1 else None)
        # step_means=False: the profile is priced here (priced_profile), a stored profile's own means not again
        plain = profile_setup(profile, phases, seed=seed, step_means=False)
        if traces:
            rho, statistic = fit_autocorrelation(traces, plain.acceptance.profiles, plain.max_k, seed=seed)

        def run(label: str, workload: str, scale: float, c: int = c, phases: Any = phases,
                rho: float = rho) -> float:
            priced = _terms(bundle, scale, profile, fetch_ms, fetch_source) if terms else ProfileTerms()
            setup = profile_setup(_scaled(profile, scale), phases, autocorrelation=rho, traces=traces, seed=seed,
                                  terms=priced, step_means=False)
            plugin_ms = float((plugin_time.get(label) or {}).get("ms_per_step", 0.0))
            config = _sim_config(bundle["configs"][label], setup, plugin_ms, off_steps.get(label))
            starts: list[PrefixCache | None] = [None] if prefix_cache_block is None else [
                PrefixCache(prefix_cache_block, set(keys)) for keys in caches[(c, workload)]]
            sims = [
                simulate(phases[workload], config, setup.cost, setup.acceptance, concurrency=c,
                         max_num_seqs=max(bundle["concurrencies"]), seed=seed, prefix_cache=cache)
                for cache in starts
            ]
            sim = sims[0]
            if scale == 1.0 and getattr(config, "drafter_width", False):
                off_notes.append(f"{label} c={c} {workload}: {sim.idle_drafter_steps} of {sim.steps} steps skipped "
                                 f"the drafter ({sim.skipped_prompt_steps} with prompt tokens), "
                                 f"{sim.catch_up_tokens} tokens replayed")
            return statistics.mean(float(x.tokens_per_s) for x in sims)

        # One scale on every step time, fitted on no speculation alone (the profile's launches and the measured ones
        # are different engines: thread placement and memory layout move every step time alike). Simulated time is
        # proportional to the scale, so it is the ratio of simulated to measured tok/s, averaged over workloads.
        scale = statistics.mean(
            run(NO_SPEC, w, 1.0) / statistics.median(round_tokens_per_s(runs[NO_SPEC], f"c{c}:{w}")) for w in phases
        )
        notes.append(f"c={c}: step-time scale fitted on no speculation alone: {scale:.3f}.")
        for label, meta in bundle["configs"].items():
            if meta.get("kind") == "idle":  # a measured ceiling (the drafter pinned at depth 0), not simulated
                continue
            for workload in phases:
                measured_all = round_tokens_per_s(runs.get(label) or [], f"c{c}:{workload}")
                row: dict[str, Any] = {"concurrency": c, "config": label, "workload": workload, "measured": None}
                if measured_all:
                    measured = statistics.median(measured_all)
                    raw = run(label, workload, 1.0)
                    calibrated = run(label, workload, scale)
                    row.update({
                        "measured": measured, "measured_min": min(measured_all), "measured_max": max(measured_all),
                        "runs": len(measured_all), "simulated_raw": raw, "error_raw": raw / measured - 1.0,
                        "simulated": calibrated, "error": calibrated / measured - 1.0,
                    })
                rows.append(row)
    lines = [
        f"Measured {bundle['date']} (load average before `{bundle['load_average']['before']}`, after "
        f"`{bundle['load_average']['after']}`); K_max {bundle['max_k']}; median of "
        f"{max((r.get('runs', 0) for r in rows), default=0)} runs per config (min-max in brackets).",
        f"Simulated from the profile's fitted step-cost model and acceptance, {len(traces)} recorded traces, "
        f"acceptance autocorrelation rho={rho:.2f} fitted to the traces (lag-1 correlation {statistic:.2f}). "
        + " ".join(notes),
        "",
        f"Beyond the fit (as is): {pricing}; "
        + (_terms(bundle, 1.0, profile, fetch_ms, fetch_source).describe() if terms else "nothing (--fit-only)")
        + "; plugin host time per step, measured in each adaptive run: "
        + (", ".join(f"{label} {v['ms_per_step']:.3f} ms ({v['overhead_ms']:.0f} ms over {v['steps']} steps, "
                     f"{v['source']})" for label, v in plugin_time.items()) or "none")
        + "; drafter-width off-steps: "
        + (", ".join(f"{label} {mode} (as its engine recorded)" for label, mode in off_steps.items())
           or "as the profile's drafter method implies")
        + ".",
        "",
        "Simulated off-steps (fit as is): " + ("; ".join(off_notes) or "none") + ".",
        "",
        "| c | config | workload | measured tok/s | simulated (fit as is) | error | simulated (scaled) | error |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        head = f"| {r['concurrency']} | {r['config']} | {r['workload']} |"
        if r["measured"] is None:
            lines.append(f"{head} failed | | | | |")
            continue
        note = " (fitted here)" if r["config"] == NO_SPEC else ""
        lines.append(
            f"{head} {r['measured']:.1f} [{r['measured_min']:.0f}-{r['measured_max']:.0f}]"
            f" | {r['simulated_raw']:.1f} | {r['error_raw']:+.1%} | {r['simulated']:.1f} | {r['error']:+.1%}{note} |"
        )
    lines += ["", _summary(rows, "_raw", "Fit as is"), "", _summary(rows, "", "Scaled")]
    return lines, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="store_true",
                        help="measure: run bench_runtime (starts vLLM engines), write --bundle")
    parser.add_argument("--runtime-workdir", type=Path, default=None,
                        help="write --bundle from the --workdir of a finished bench_runtime run")
    parser.add_argument("--bundle", type=Path, required=True, help="the JSON bundle (written by the two above)")
    parser.add_argument("--rounds", type=int, default=3, help="with --engine: rounds, each runs every config once")
    parser.add_argument("--workdir", type=Path, default=None, help="with --engine: bench_runtime's work directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit-only", action="store_true",
                        help="price steps with the profile's fit alone (no skipped-drafter, drafter-token or plugin "
                             "terms), to see what the terms change")
    parser.add_argument("--draft-fetch-ms", type=float, default=None,
                        help="host time of the engine core's draft fetch after each drafting step, ms (default: the "
                             "mean the profile's plugin statistics recorded, else 0)")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="simulate without vLLM's prefix cache (the benchmark's engines run with it on)")
    parser.add_argument("--out", type=Path, default=None, help="also write the comparison (markdown) here")
    args = parser.parse_args(argv)
    if args.engine or args.runtime_workdir is not None:
        started = time.perf_counter()
        bundle = measure(args) if args.engine else bundle_from_runtime(args.runtime_workdir)
        args.bundle.write_text(json.dumps(bundle))
        print(f"Wrote {args.bundle} ({time.perf_counter() - started:.0f} s)", flush=True)
    bundle = json.loads(args.bundle.read_text())
    lines, _ = compare(bundle, seed=args.seed, terms=not args.fit_only, draft_fetch_ms=args.draft_fetch_ms,
                       prefix_cache_block=None if args.no_prefix_cache else CPU_BLOCK_SIZE)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__: keep the guard
    sys.exit(main())
