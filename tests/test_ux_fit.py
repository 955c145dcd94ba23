"""Fit before trials (issue 33, item 5; issue 39, item 5), at 80 columns on the model backend: a model vLLM would
not start is refused once, before any trial, in one line naming what fits instead (--tensor-parallel-size, other
GPUs), exit 2 (a usage error: the options must change); the check is `autotune.fit`'s, the one the vllm path runs."""

from __future__ import annotations

import json
from pathlib import Path

from ux_cli import cli, columns_80  # noqa: F401  (tests/ is on sys.path; columns_80: autouse)

from autotune.backends.model import ModelBackend
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import load_workload

SEARCH = ["search", "--model", "gpt-oss-120b", "--backend", "model", "--max-k", "4", "--trials", "10"]


def test_a_model_that_does_not_fit_is_refused_before_any_trial(tmp_path: Path) -> None:
    # gpt-oss-120b's 65.2 GB of weights + 14.0 GB of MXFP4 MoE overhead (autotune.fit) do not fit in 0.92 x 48 GB =
    # 44.2 GB of an L40S; nor at TP 2 (32.6 GB + 12.2 GiB = 45.7 GB per GPU); at TP 4 (16.3 + 13.1 GB) they do.
    db = str(tmp_path / "peagle.db")
    result = cli(*SEARCH, "--gpu", "l40s", "--concurrency", "8,1", "--db", db)
    assert result.exit_code == 2, result.output
    (error,) = result.stderr.splitlines()  # one line
    assert error.startswith("Error: Not searched, every trial at c=8 would fail: openai/gpt-oss-120b (65.2 GB")
    assert "so vLLM refuses to start: needs --tensor-parallel-size 4" in error
    # The GPUs of the catalog that hold it on their own are named (an H200 has 141 GB); not the L40S itself.
    others = error.split(", or --gpu ", 1)[1]
    assert "h200" in others and "l40s" not in others
    assert error.count("--tensor-parallel-size") == 1  # said once, not per failed trial
    # Nothing was tried: no study, no trial, no recommendation.
    shown = json.loads(cli("show", "--studies", "--json", "--db", db).stdout)
    assert not shown["studies"]
    # What it names works.
    ok = cli(*SEARCH, "--gpu", "l40s", "--concurrency", "8,1", "--tensor-parallel-size", "4", "--db", db)
    assert ok.exit_code == 0, ok.output
    assert cli(*SEARCH, "--gpu", "h200", "--concurrency", "8,1", "--db", db).exit_code == 0


def test_the_model_backend_checks_fit_with_autotune_fit() -> None:
    """One memory-fit check: the model backend's verdict is `autotune.fit.check_gpu_fit`'s on the catalog's sizes,
    at the workload's max_model_len (what a launch passes)."""
    from autotune.fit import check_gpu_fit, max_model_len_of

    backend = ModelBackend("gpt-oss-120b", "h100")
    workload = load_workload("mt-bench")
    config = SpecConfig(max_num_seqs=64)
    memory = backend.workload_fit(config, workload, Scenario(concurrency=64))
    model = backend.model
    target_config = {"num_hidden_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
                     "num_key_value_heads": model.num_kv_heads, "head_dim": model.head_dim,
                     "sliding_window": model.sliding_window,
                     "layer_types": ["sliding_attention", "full_attention"] * (model.num_layers // 2),
                     "quantization_config": {"quant_method": "mxfp4"}, "num_local_experts": model.num_experts}
    tokens = max_model_len_of(workload)
    same = check_gpu_fit(model=model.name, target_weight_bytes=int(model.weight_bytes()), target_config=target_config,
                         max_model_len=tokens, max_num_seqs=64, device_memory_bytes=80 * 10**9,
                         device_name=backend.base_gpu.display_name)
    assert (memory.fits, memory.per_device_need, memory.per_device_budget) == \
        (same.fits, same.per_device_need, same.per_device_budget)
    m = backend.measure(config, workload, Scenario(concurrency=64))
    assert m.ok == memory.fits
