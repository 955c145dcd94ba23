"""The offline measurement job: ``python -m autotune.engine._offline JOB.json RESULT.json`` (see `_harness`).

Job keys besides the harness's: ``classes`` ({class: [request dicts]}), ``warmup_requests``, ``ignore_eos``,
``return_outputs``. Result: ``"classes": {class: {"wall_s", "num_requests", "output_tokens", "prompt_tokens",
"ttft_ms", "tpot_ms", "max_gap_s", "spec", "outputs"?}}`` and the timings ``warmup_s`` and ``measure_s``.

Per request (``RequestOutput.metrics``, engine-core clock): TTFT = ``first_token_ts - scheduled_ts`` (all prompts
are queued at once, so waiting for a free slot is excluded); TPOT = ``(last_token_ts - first_token_ts) /
(generated tokens - 1)``. Speculative counters are deltas of ``LLM.get_metrics()`` around each class's measured
sub-phase; ``max_gap_s`` is the longest time without an engine step (a stall above the bound,
`autotune.engine._stall.stall_in`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from autotune.engine._constants import WARMUP_MAX_TOKENS
from autotune.engine._counters import snapshot_from_metrics, spec_delta
from autotune.engine._harness import EngineSession, enter, request_from_dict, request_latencies, worker_main
from autotune.engine._watchdog import raise_if_aborted
from autotune.workloads import WorkloadRequest


def measure_classes(job: Mapping[str, Any], session: EngineSession) -> dict[str, Any]:
    """Warm up, then run each class's requests with ``LLM.generate`` as one measured sub-phase."""
    from vllm import SamplingParams

    llm, timings = session.llm, session.timings
    classes = {c: [request_from_dict(r) for r in reqs] for c, reqs in job["classes"].items()}
    ignore_eos = bool(job.get("ignore_eos", False))

    def params(r: WorkloadRequest, max_tokens: int | None = None) -> Any:
        return SamplingParams(temperature=r.temperature, max_tokens=max_tokens or r.max_tokens, ignore_eos=ignore_eos)

    enter("warmup")
    t = time.perf_counter()
    warm = [r for reqs in classes.values() for r in reqs][: int(job.get("warmup_requests", 0))]
    if warm:
        llm.generate(
            [session.prompt(r) for r in warm],
            [params(r, min(r.max_tokens, WARMUP_MAX_TOKENS)) for r in warm],
            use_tqdm=False,
        )
        # The measured phase must prefill its prompts, not hit the cache the warm-up filled.
        llm.reset_prefix_cache()
    timings["warmup_s"] = time.perf_counter() - t

    enter("measure")
    per_class: dict[str, Any] = {}
    for name, reqs in classes.items():
        before = snapshot_from_metrics(llm.get_metrics())
        t = time.perf_counter()
        session.progress.mark()
        outs = llm.generate([session.prompt(r) for r in reqs], [params(r) for r in reqs], use_tqdm=False)
        wall = time.perf_counter() - t
        max_gap_s = session.progress.gap_s()
        raise_if_aborted(llm, outs, f"class {name!r}")  # an engine stopped under them returns them cut short
        after = snapshot_from_metrics(llm.get_metrics())
        lat = [request_latencies(o) for o in outs]
        entry: dict[str, Any] = {
            "wall_s": wall,
            "num_requests": len(outs),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in outs),
            "ttft_ms": [x for x, _ in lat if x is not None],
            "tpot_ms": [y for _, y in lat if y is not None],
            "max_gap_s": max_gap_s,
            "spec": spec_delta(before, after),
        }
        if job.get("return_outputs"):
            entry["outputs"] = [{"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text} for o in outs]
        per_class[name] = entry
    timings["measure_s"] = sum(c["wall_s"] for c in per_class.values())
    return {"classes": per_class}


if __name__ == "__main__":  # the guard vLLM needs: its engine core is spawned and re-imports __main__
    sys.exit(worker_main("autotune.engine._offline", sys.argv[1:], measure_classes))
