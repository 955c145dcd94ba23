"""Every export carries the memory arguments the search's fit check assumed (issue 42 item 5): --max-model-len,
--tensor-parallel-size and, on a GPU, --gpu-memory-utilization; the JSON-only forms (vllm-json, schedule) and the
policy file say them in their description, since their format has no place for them."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from autotune.export import FORMATS, describe, render
from autotune.fit import DEFAULT_GPU_MEMORY_UTILIZATION

BEST = {"method": "draft_model", "drafter": "./drafter", "num_speculative_tokens": 3, "parallel_drafting": False,
        "max_num_seqs": 8, "tensor_parallel_size": 2}


def _rec(gpu: str, **metrics: Any) -> dict[str, Any]:
    return {"id": 1, "model": "m", "gpu": gpu, "objective": "throughput", "best_config": BEST,
            "scenario": {"concurrency": 8}, "metrics": {"max_model_len": 4096, **metrics},
            "provenance": {"kind": "predicted", "backend": "model"},
            "schedule": [{"batch_min": 1, "batch_max": 8, "k": 3}], "class_policy": {}}


def test_vllm_args_and_yaml_carry_what_the_fit_check_assumed_on_a_gpu() -> None:
    rec = _rec("NVIDIA H200")
    words = shlex.split(render("vllm-args", rec)[0])
    flags = dict(zip(words[3::2], words[4::2], strict=False))
    # The fit check sized the KV cache with vLLM's default utilization (0.92), the workload's length, TP 2.
    assert flags["--max-model-len"] == "4096" and flags["--tensor-parallel-size"] == "2"
    assert flags["--gpu-memory-utilization"] == f"{DEFAULT_GPU_MEMORY_UTILIZATION:g}" == "0.92"
    doc = yaml.safe_load(render("yaml", rec)[0])
    assert (doc["max-model-len"], doc["tensor-parallel-size"], doc["gpu-memory-utilization"]) == (4096, 2, 0.92)
    stored = yaml.safe_load(render("yaml", _rec("NVIDIA H200", gpu_memory_utilization=0.85))[0])
    assert stored["gpu-memory-utilization"] == 0.85  # a utilization the search recorded wins


def test_a_cpu_recommendation_leaves_the_ram_share_to_the_launch() -> None:
    words = render("vllm-args", _rec("cpu"))[0]
    assert "--gpu-memory-utilization" not in words
    assert "--max-model-len 4096" in words and "--tensor-parallel-size 2" in words


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_says_the_memory_arguments(fmt: str) -> None:
    rec = _rec("NVIDIA H200")
    line = "Launch with --max-model-len 4096 --tensor-parallel-size 2 --gpu-memory-utilization 0.92, as the fit " \
        "check assumed."
    text, _warnings = render(fmt, rec)
    if fmt in ("vllm-json", "schedule"):  # the speculative config only: the CLI prints `describe` on stderr
        assert line in describe(rec)
    else:
        assert line in text or "--gpu-memory-utilization 0.92" in text
