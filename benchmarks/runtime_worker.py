"""One configuration of `benchmarks.bench_runtime`, as a job on the engine worker harness
(`autotune.engine.worker_main`, which loads the ``vllm.LLM``): ``python -m benchmarks.runtime_worker JOB RESULT``.

Job keys besides the harness's (``model``, ``engine_kwargs``): ``run_dir``, ``workloads`` ({name: [phase: [request
dicts with "prompt", "max_tokens", "class"]]}), ``warmup`` (requests), ``rounds``, ``concurrencies``,
``c1_requests``. The engine warms up and writes ``ready.json`` in ``run_dir``; then, for each round r, it waits for
the parent's ``go-<r>`` file, runs every workload at every concurrency and writes ``round-<r>.json``: {"c<c>:<name>":
[per phase {"phase", "wall_s", "output_tokens", "outputs" (token ids, first round only)}]}. A ``stop`` file in
``run_dir`` ends it between rounds. Requests carry their class and phase as the plugin's labels
(`policies.plugin.CLASS_KEY`, `PHASE_KEY`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.engine import POLL_S, EngineSession, enter, worker_main
from policies.plugin import CLASS_KEY, PHASE_KEY

SETTLE_S = 1.5
"""Seconds an engine waits before its round: vLLM's shared-memory readers busy-poll for 1 s after their last read
(``SpinCondition.busy_loop_s``), so the engine that ran before still takes a core that long."""
FLUSH_S = 3.0
"""Idle time after the last round: the plugin writes its statistics file when the engine goes idle."""


def _write(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: the parent never reads half a file


def run_rounds(job: Mapping[str, Any], session: EngineSession) -> dict[str, Any]:
    """Warm up, then one round per ``go-<r>`` file (module docstring); returns the number of rounds run."""
    from vllm import SamplingParams

    llm, run_dir = session.llm, Path(job["run_dir"])

    def params(r: Mapping[str, Any], phase: str, max_tokens: int | None = None) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens or r["max_tokens"],
                              extra_args={CLASS_KEY: r["class"], PHASE_KEY: phase})

    def burst(max_tokens: int) -> None:
        warm = job["warmup"]
        llm.generate([r["prompt"] for r in warm], [params(r, "warmup", max_tokens) for r in warm], use_tqdm=False)

    # Warm-up: every request of one mixed phase, cut to 16 tokens, so every batch shape has run once; and one request
    # alone (batch 1).
    enter("warmup")
    burst(16)
    first = job["warmup"][0]
    llm.generate([first["prompt"]], [params(first, "warmup", 16)], use_tqdm=False)
    llm.reset_prefix_cache()
    _write(run_dir / "ready.json", {"ok": True, "load_s": session.timings.get("load_s")})

    enter("measure")
    concurrencies: list[int] = list(job["concurrencies"])
    names = list(job["workloads"])
    done = 0
    for rnd in range(int(job["rounds"])):
        while not (run_dir / f"go-{rnd}").exists():
            if (run_dir / "stop").exists():
                return {"rounds": done}
            time.sleep(POLL_S)
        # The engine that ran before keeps its worker spinning for SETTLE_S after its last request, and this engine's
        # pages and caches are cold: settle, then an untimed burst (a first timed phase after a switch runs slower).
        time.sleep(SETTLE_S)
        burst(8)
        llm.reset_prefix_cache()
        out: dict[str, Any] = {}
        # Alternate the order of concurrencies and workloads between rounds.
        for c in concurrencies if rnd % 2 == 0 else concurrencies[::-1]:
            for name in names if rnd % 2 == 0 else names[::-1]:
                entries = []
                for i, reqs in enumerate(job["workloads"][name]):
                    phase = f"c{c}:{name}:{i}"
                    t = time.perf_counter()
                    if c == 1:
                        outs = []
                        for r in reqs[: int(job["c1_requests"])]:
                            outs += llm.generate([r["prompt"]], [params(r, phase)], use_tqdm=False)
                    else:
                        outs = llm.generate([r["prompt"] for r in reqs], [params(r, phase) for r in reqs],
                                            use_tqdm=False)
                    wall = time.perf_counter() - t
                    entries.append({
                        "phase": phase,
                        "wall_s": wall,
                        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                        "outputs": [list(o.outputs[0].token_ids) for o in outs] if rnd == 0 else None,
                    })
                out[f"c{c}:{name}"] = entries
        _write(run_dir / f"round-{rnd}.json", out)
        done += 1
    time.sleep(FLUSH_S)
    return {"rounds": done}


if __name__ == "__main__":  # the guard vLLM needs: its engine core is spawned and re-imports __main__
    sys.exit(worker_main("benchmarks.runtime_worker", sys.argv[1:], run_rounds))
