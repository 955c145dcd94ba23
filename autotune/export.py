"""Render a recommendation in the forms vLLM takes.

- ``vllm-json``: the ``--speculative-config`` JSON (also what ``LLM(speculative_config=...)`` takes);
- ``vllm-args``: a ``vllm serve`` command line;
- ``yaml``: a file for ``vllm serve --config FILE.yaml`` (vLLM turns nested dicts into JSON arguments);
- ``schedule``: the speculative config with vLLM's ``num_speculative_tokens_per_batch_size`` ranges;
- ``policy``: the file ``peagle-tune serve`` and the runtime controller read.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from autotune.config import SpecConfig
from autotune.exceptions import UsageError

FORMATS = ("vllm-json", "vllm-args", "yaml", "schedule", "policy")

#: vLLM 0.32 mishandles per-batch-size schedules together with parallel drafting (vLLM issue #45695).
SCHEDULE_PD_WARNING = (
    "vLLM 0.32 mishandles num_speculative_tokens_per_batch_size together with parallel_drafting "
    "(vLLM issue #45695); with a P-EAGLE drafter serve through `peagle-tune serve`, which applies the "
    "schedule by trimming drafts in its scheduler instead."
)


def serve_options(model: str, config: SpecConfig) -> dict[str, Any]:
    """`vllm serve` options (long-option names without dashes) for a config; the speculative config as a dict."""
    opts: dict[str, Any] = {"model": model, "max-num-seqs": config.max_num_seqs}
    if config.max_num_batched_tokens is not None:
        opts["max-num-batched-tokens"] = config.max_num_batched_tokens
    spec = config.speculative_config()
    if spec is not None:
        opts["speculative-config"] = spec
    return opts


def render(fmt: str, recommendation: dict[str, Any]) -> tuple[str, list[str]]:
    """Render `recommendation` (a stored recommendation's dict) in `fmt`. Returns (text, warnings)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, but got {fmt!r}.")
    model = recommendation["model"]
    config = SpecConfig.from_dict(recommendation["best_config"])
    warnings: list[str] = []
    if fmt == "vllm-json":
        spec = config.speculative_config()
        if spec is None:
            warnings.append("The recommendation is to serve WITHOUT speculation; there is no speculative config.")
            return "null\n", warnings
        return json.dumps(spec, indent=2) + "\n", warnings
    if fmt == "vllm-args":
        opts = serve_options(model, config)
        args = ["vllm", "serve", opts.pop("model")]
        for key, value in opts.items():
            args += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
        return shlex.join(args) + "\n", warnings
    if fmt == "yaml":
        return yaml.safe_dump(serve_options(model, config), sort_keys=False), warnings
    if fmt == "schedule":
        spec = config.speculative_config()
        schedule = recommendation.get("schedule") or []
        if spec is None or not schedule:
            raise UsageError(
                "This recommendation has no batch-size schedule (it serves without speculation or was made "
                "before schedules existed). Re-run `peagle-tune search` to get one."
            )
        # vLLM requires the schedule's depths <= num_speculative_tokens; K is the drafter's depth.
        spec["num_speculative_tokens"] = max(max(e["k"] for e in schedule), 1)
        spec["num_speculative_tokens_per_batch_size"] = [[e["batch_min"], e["batch_max"], e["k"]] for e in schedule]
        if config.parallel_drafting:
            warnings.append(SCHEDULE_PD_WARNING)
        return json.dumps(spec, indent=2) + "\n", warnings
    # policy
    return yaml.safe_dump(policy_document(recommendation), sort_keys=False), warnings


def policy_document(recommendation: dict[str, Any]) -> dict[str, Any]:
    """The runtime policy file (format version 1) for a recommendation."""
    config = SpecConfig.from_dict(recommendation["best_config"])
    class_policy = recommendation.get("class_policy") or {}
    doc: dict[str, Any] = {
        "version": 1,
        "model": recommendation["model"],
        "static_k": config.k,
        "max_k": max([config.k, *(c.get("max_k", 0) for c in class_policy.values())]),
        "classes": {name: dict(values) for name, values in sorted(class_policy.items())},
        "default_class": "chat" if "chat" in class_policy else next(iter(sorted(class_policy)), "default"),
    }
    if recommendation.get("schedule"):
        doc["schedule"] = [dict(e) for e in recommendation["schedule"]]
    doc["source"] = {
        "recommendation_id": recommendation.get("id"),
        "provenance": recommendation.get("provenance"),
    }
    return doc
