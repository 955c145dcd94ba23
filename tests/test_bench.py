"""`peagle-tune bench` without an engine: what it would run (the server as exported, vLLM's benchmark on the
search's workload at its concurrency), how vLLM's result file becomes our figures, and how `show` puts a stored
benchmark beside the recommendation and compares two recommendations."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.bench import compare, dataset_rows, figures_from_result, plan_bench
from autotune.cli import main
from autotune.export import serve_args
from autotune.workloads import load_workload
from store import Store

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "examples" / "workloads" / "fixture.jsonl"
BEST = {"method": "draft_model", "drafter": "./drafter", "num_speculative_tokens": 2, "parallel_drafting": False,
        "max_num_seqs": 4}
#: What `vllm bench serve --save-result` writes (keys of vllm/benchmarks/serve.py 1278-1300 and its percentiles).
VLLM_RESULT = {"output_throughput": 40.0, "request_throughput": 0.9, "median_tpot_ms": 20.0, "p99_tpot_ms": 31.0,
               "median_ttft_ms": 150.0, "p99_ttft_ms": 400.0, "completed": 8, "failed": 0, "duration": 9.6,
               "total_output_tokens": 384, "date": "20261207-120000"}


def _rec(store: Store, **metrics: Any) -> int:
    work = load_workload(WORKLOAD)
    return store.add_recommendation(
        "./target", gpu="cpu", objective="throughput", best_config=BEST, scenario={"concurrency": 4},
        metrics={"output_tokens_per_s": 50.0, "max_model_len": 512, **metrics},
        provenance={"kind": "measured", "backend": "vllm"}, workload_name=work.name,
        workload_hash=work.content_hash())


def test_the_dataset_is_the_workload_interleaved_with_each_request_s_max_tokens() -> None:
    work = load_workload(WORKLOAD)
    rows, chat = dataset_rows(work, 4)
    expected = [r for _, r in work.requests()[:4]]
    assert not chat
    assert rows == [{"prompt": r.prompt, "output_tokens": r.max_tokens} for r in expected]
    assert {c for c, _ in work.requests()[:2]} == set(work.class_names)  # both classes in any prefix


def test_the_plan_serves_the_exported_arguments_and_benchmarks_at_the_searched_concurrency(tmp_path: Path) -> None:
    work = load_workload(WORKLOAD)
    rec = {"id": 3, "model": "./target", "gpu": "cpu", "best_config": BEST, "scenario": {"concurrency": 4},
           "metrics": {"max_model_len": 512}}
    plan = plan_bench(rec, work, mode="static", port=8123, run_dir=tmp_path, server_args=serve_args(rec),
                      num_prompts=6, memory_fraction=0.5, extra=["--dtype", "float32"])
    serve = shlex.join(plan.serve)
    assert "serve ./target --host 127.0.0.1 --port 8123 --max-num-seqs 4" in serve
    assert "--max-model-len 512 --tensor-parallel-size 1 --gpu-memory-utilization 0.5 --dtype float32" in serve
    bench = plan.bench[plan.bench.index("bench"):]
    pairs = dict(zip(bench[2::2], bench[3::2], strict=False))
    assert bench[:2] == ["bench", "serve"]
    assert "--max-concurrency 4" in shlex.join(bench) and "--num-prompts 6" in shlex.join(bench)
    assert pairs["--dataset-path"] == str(tmp_path / "workload.jsonl")
    assert "--custom-output-len -1" in shlex.join(bench)  # each request's own max_tokens
    adaptive = plan_bench(rec, work, mode="adaptive", port=8123, run_dir=tmp_path, server_args={})
    assert adaptive.serve[1:] == ["-m", "autotune.cli", "serve", "--model", "./target", "--recommendation", "3",
                                  "--host", "127.0.0.1", "--port", "8123", "--no-record"]


def test_vllm_s_result_becomes_our_figures_and_the_error_is_against_the_measured() -> None:
    figures = figures_from_result(VLLM_RESULT)
    assert figures["output_tokens_per_s"] == 40.0 and figures["tpot_ms_p99"] == 31.0
    assert figures["completed"] == 8 and "date" not in figures
    errors = {e.name: e.error for e in compare({"output_tokens_per_s": 50.0, "tpot_ms_p50": 18.0}, figures)}
    # (stored - measured) / measured: 50 promised, 40 measured -> +25%; 18 ms against 20 ms -> -10%.
    assert errors == {"output_tokens_per_s": pytest.approx(0.25), "tpot_ms_p50": pytest.approx(-0.10)}


def test_show_puts_the_measured_figure_beside_the_searched_one(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    with Store(db) as store:
        rid = _rec(store)
        store.add_benchmark(rid, mode="static", concurrency=4, num_prompts=8, figures=figures_from_result(VLLM_RESULT),
                            provenance={"kind": "measured", "backend": "vllm bench serve", "device": "cpu",
                                        "vllm_version": "0.32.0", "date": "2026-12-07T12:00:00+00:00",
                                        "deployment": "vllm serve (static)"})
    result = CliRunner().invoke(main, ["--db", db, "show", "--recommendation", str(rid)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if line.startswith("output tok/s"))
    assert row.split() == ["output", "tok/s", "50.0", "40.0", "+25.0%"]
    assert "Measured by vllm bench serve on cpu, vLLM 0.32.0, 2026-12-07" in result.output
    shown = json.loads(CliRunner().invoke(main, ["--db", db, "show", "--recommendation", str(rid), "--json"]).output)
    bench = shown["recommendations"][0]["benchmarks"][0]
    assert bench["figures"]["output_tokens_per_s"] == 40.0
    assert bench["comparison"][0] == {"name": "output_tokens_per_s", "measured": 40.0, "stored": 50.0, "error": 0.25}


def test_show_compare_lists_both_configs_and_marks_what_differs(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    work = load_workload(WORKLOAD)
    with Store(db) as store:
        first = _rec(store)
        second = store.add_recommendation(
            "./target", gpu="NVIDIA H200", objective="throughput", best_config={**BEST, "num_speculative_tokens": 3},
            scenario={"concurrency": 4}, metrics={"output_tokens_per_s": 900.0},
            provenance={"kind": "predicted", "backend": "model"}, workload_name=work.name,
            workload_hash=work.content_hash())
    result = CliRunner().invoke(main, ["--db", db, "show", "--compare", str(first), str(second)],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "* differs: GPU, config, figures, output tok/s." in " ".join(result.output.split())
    model_line = next(line for line in result.output.splitlines() if line.startswith("model"))
    assert not model_line.rstrip().endswith("*")
    data = json.loads(CliRunner().invoke(main, ["--db", db, "show", "--compare", str(first), str(second),
                                                "--json"]).output)
    assert [r["id"] for r in data["compare"]["recommendations"]] == [first, second]
    assert data["compare"]["differs"] == ["GPU", "config", "figures", "output tok/s"]


def test_bench_dry_run_prints_both_commands_and_refuses_a_workload_of_other_content(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    with Store(db) as store:
        rid = _rec(store)
    result = CliRunner().invoke(main, ["--db", db, "bench", "--recommendation", str(rid), "--workload-file",
                                       str(WORKLOAD), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# server\n" in result.output and " bench serve " in result.output
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "hello", "max_tokens": 8}\n')
    refused = CliRunner().invoke(main, ["--db", db, "bench", "--recommendation", str(rid), "--workload-file",
                                        str(other), "--dry-run"])
    assert refused.exit_code == 2
    assert "is not the workload recommendation #1 was searched on" in refused.output


def test_show_compare_takes_study_names_at_the_other_s_concurrency(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    with Store(db) as store:
        ids = {}
        for study, gpu in (("on-h100", "NVIDIA H100"), ("on-h200", "NVIDIA H200")):
            for level in (1, 8):
                ids[study, level] = store.add_recommendation(
                    "./target", gpu=gpu, objective="throughput", best_config=BEST, scenario={"concurrency": level},
                    metrics={"output_tokens_per_s": 100.0 * level}, study=study)
    data = json.loads(CliRunner().invoke(main, ["--db", db, "show", "--compare", str(ids["on-h100", 1]), "on-h200",
                                                "--json"]).output)
    assert [r["id"] for r in data["compare"]["recommendations"]] == [ids["on-h100", 1], ids["on-h200", 1]]
    assert data["compare"]["differs"] == ["GPU"]
    both = json.loads(CliRunner().invoke(main, ["--db", db, "show", "--compare", "on-h100", "on-h200",
                                                "--json"]).output)
    # Neither names a concurrency: the first study's highest, then the second's at that concurrency.
    assert [r["id"] for r in both["compare"]["recommendations"]] == [ids["on-h100", 8], ids["on-h200", 8]]
    missing = CliRunner().invoke(main, ["--db", db, "show", "--compare", "1", "no-such-study"])
    assert missing.exit_code == 3 and "neither a recommendation id nor a study" in missing.output
