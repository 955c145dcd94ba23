"""What `peagle-tune bench` runs, decided without starting anything: the server and ``vllm bench serve`` argv.

The server is the recommendation as it will be served: plain ``vllm serve`` with the exported arguments
(`autotune.export.serve_args`: the config, --max-model-len, --tensor-parallel-size and, on a GPU,
--gpu-memory-utilization as the fit check assumed them), or ``peagle-tune serve --recommendation ID`` for the
adaptive controller. The client is vLLM's own benchmark (``vllm/benchmarks/serve.py``) on the search's workload,
written as its ``custom`` dataset (``vllm/benchmarks/datasets/datasets.py`` 2425-2548: one {"prompt",
"output_tokens"} per line, ``--custom-output-len -1`` keeps each request's max_tokens), at the searched concurrency.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.engine import ENGINE_CLI, LOOPBACK, safe_draft_model_path, serve_command
from autotune.errors import UsageError
from autotune.workloads import Workload

Mode = Literal["static", "adaptive"]

#: The file ``vllm bench serve --save-result`` writes into the run directory.
RESULT_FILE = "bench.json"
#: The custom dataset the benchmark reads (vLLM takes only ``.jsonl`` there).
DATASET_FILE = "workload.jsonl"
#: What ``vllm bench serve`` reports per request, as median and p99 (``--percentile-metrics``,
#: ``--metric-percentiles``): the latency figures a recommendation stores.
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


@dataclass(frozen=True)
class BenchPlan:
    """Everything one benchmark of a recommendation runs; `serve` and `bench` are argv lists."""

    recommendation_id: int
    mode: Mode
    model: str
    concurrency: int
    num_prompts: int
    port: int
    serve: list[str]
    bench: list[str]
    dataset: list[dict[str, Any]]
    """The rows of the custom dataset file, in the order sent (classes interleaved, as `Workload.requests`)."""
    notes: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def dataset_rows(workload: Workload, num_prompts: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    """(rows, chat) of the custom dataset for `workload`: each request's prompt and its max_tokens as
    ``output_tokens``, the first `num_prompts` of `Workload.requests` (classes interleaved). Chat requests keep
    their last user message (the server applies the chat template, `chat` True); raw prompts go as they are."""
    requests = workload.requests()[:num_prompts] if num_prompts else workload.requests()
    if not requests:
        raise UsageError(f"The workload {workload.name} has no requests to benchmark.")
    chat = any(r.is_chat for _, r in requests)
    rows = []
    for _, request in requests:
        if request.is_chat:
            users = [m.get("content", "") for m in request.messages or () if m.get("role", "user") == "user"]
            prompt = users[-1] if users else request.text()
        else:
            prompt = request.text()
        rows.append({"prompt": prompt, "output_tokens": request.max_tokens})
    return rows, chat


def plan_bench(
    recommendation: Mapping[str, Any],
    workload: Workload,
    *,
    mode: Mode,
    port: int,
    run_dir: Path,
    server_args: Mapping[str, Any],
    num_prompts: int | None = None,
    memory_fraction: float | None = None,
    extra: Sequence[str] = (),
) -> BenchPlan:
    """The benchmark of `recommendation` (a stored recommendation's dict) on `workload` at its concurrency.

    `server_args`: the ``vllm serve`` arguments in ``LLM`` keyword names (`autotune.export.serve_args`);
    `memory_fraction`: ``--gpu-memory-utilization`` for vLLM's CPU build (the share of RAM it reserves), None on a
    GPU; `extra`: what the user passes through to the server. In adaptive mode ``peagle-tune serve`` reads the
    recommendation from the database its environment names (PEAGLE_DB: no password on a command line).
    """
    concurrency = (recommendation.get("scenario") or {}).get("concurrency")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"Recommendation #{recommendation.get('id')} stores no concurrency to benchmark at; re-run "
                         "`peagle-tune search` to store one.")
    rows, chat = dataset_rows(workload, num_prompts)
    model = str(recommendation["model"])
    rid = int(recommendation["id"])
    notes: list[str] = []
    if mode == "static":
        args = dict(server_args)
        spec = args.get("speculative_config")
        if isinstance(spec, Mapping) and spec.get("method") == "draft_model":  # as every launch hands it to vLLM
            args["speculative_config"] = {**spec, "model": safe_draft_model_path(str(spec["model"]))}
        if memory_fraction is not None:
            args.pop("gpu_memory_utilization", None)  # on CPU it is the share of RAM: chosen from free memory
        serve = serve_command(model, args, program=ENGINE_CLI, host=LOOPBACK, port=port,
                              memory_fraction=memory_fraction, extra=extra)
    else:
        serve = [sys.executable, "-m", "autotune.cli", "serve",
                 "--model", model, "--recommendation", str(rid), "--host", LOOPBACK, "--port", str(port),
                 "--no-record", *(["--", *extra] if extra else [])]
    temperatures = {r.temperature for _, r in workload.requests()[:len(rows)]}
    if len(temperatures) > 1:
        notes.append(f"The workload samples at temperatures {sorted(temperatures)}; vllm bench serve sends one, "
                     f"{min(temperatures):g}.")
    if chat and any(not r.is_chat for _, r in workload.requests()[:len(rows)]):
        notes.append("The workload mixes chat and raw prompts; vllm bench serve sends all of them as chat.")
    bench = [
        *ENGINE_CLI, "bench", "serve",
        "--backend", "openai-chat" if chat else "openai",
        "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
        "--base-url", f"http://{LOOPBACK}:{port}", "--model", model,
        "--dataset-name", "custom", "--dataset-path", str(run_dir / DATASET_FILE), "--custom-output-len", "-1",
        "--skip-chat-template", "--disable-shuffle", "--no-oversample",
        "--num-prompts", str(len(rows)), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--temperature", f"{min(temperatures):g}", "--seed", "0",
        "--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(run_dir), "--result-filename", RESULT_FILE,
    ]
    return BenchPlan(recommendation_id=rid, mode=mode, model=model, concurrency=concurrency, num_prompts=len(rows),
                     port=port, serve=serve, bench=bench, dataset=rows, notes=notes)
