"""Batch-size schedules and exports in vLLM's forms."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.errors import UsageError
from autotune.export import SCHEDULE_PD_WARNING, render
from autotune.search import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule
from autotune.spec import SpecConfig


def test_best_depth_falls_as_batch_grows_for_a_verification_bound_cost() -> None:
    # tokens/s = B * AL(K) / T(B, K) with AL(K) = 1 + 0.8 + ... (geometric a=0.8) and T = 10 + 0.05*B*(K+1) ms.
    def goodput(b: int, k: int) -> float:
        al = sum(0.8**i for i in range(k + 1))
        return b * al / (10 + 0.05 * b * (k + 1))

    best = best_depth_per_batch(goodput, [1, 16, 256, 1024], list(range(0, 9)))
    assert best[1] >= best[16] >= best[256] >= best[1024]
    assert best[1] == 8  # at B=1 verification is nearly free (10.45 ms at K=8 vs 10.05 ms at K=0)
    assert best[1024] == 0  # 1024*(K+1)*0.05 ms dominates; any K adds more time than tokens


def test_merge_covers_every_batch_size_once() -> None:
    entries = merge_schedule({1: 5, 2: 5, 4: 3, 8: 3, 16: 0}, 32)
    assert entries == [ScheduleEntry(1, 3, 5), ScheduleEntry(4, 15, 3), ScheduleEntry(16, 32, 0)]
    covered = [b for e in entries for b in range(e.batch_min, e.batch_max + 1)]
    assert covered == list(range(1, 33))


def test_default_batch_sizes() -> None:
    assert default_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert default_batch_sizes(1) == [1]


def _rec(config: SpecConfig, **extra: object) -> dict[str, object]:
    return {"id": 1, "model": "openai/gpt-oss-120b", "best_config": config.to_dict(), **extra}


PEAGLE = SpecConfig(
    method="eagle3", drafter="amazon/gpt-oss-120b-p-eagle", num_speculative_tokens=5, parallel_drafting=True,
    max_num_seqs=64,
)


def test_vllm_json_is_the_speculative_config() -> None:
    text, warnings = render("vllm-json", _rec(PEAGLE))
    assert json.loads(text) == {
        "method": "eagle3", "model": "amazon/gpt-oss-120b-p-eagle", "num_speculative_tokens": 5,
        "parallel_drafting": True,
    }
    assert warnings == []


def test_vllm_args_parse_back_to_the_same_options() -> None:
    text, _ = render("vllm-args", _rec(PEAGLE))
    argv = shlex.split(text)
    assert argv[:3] == ["vllm", "serve", "openai/gpt-oss-120b"]
    opts = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert json.loads(opts["--speculative-config"])["num_speculative_tokens"] == 5
    assert opts["--max-num-seqs"] == "64"


def test_yaml_nests_the_speculative_config_the_way_vllm_serve_config_reads_it() -> None:
    text, _ = render("yaml", _rec(PEAGLE))
    doc = yaml.safe_load(text)
    assert doc["model"] == "openai/gpt-oss-120b"
    assert doc["speculative-config"]["parallel_drafting"] is True


def test_exports_pass_the_max_model_len_the_search_stored() -> None:
    # Without --max-model-len vLLM sizes for the model's 131,072 tokens and may not start where the search's launches
    # (which passed the workload's) did (issue 39.5).
    rec = _rec(PEAGLE, metrics={"max_model_len": 4096})
    argv = shlex.split(render("vllm-args", rec)[0])
    assert dict(zip(argv[3::2], argv[4::2], strict=True))["--max-model-len"] == "4096"
    assert yaml.safe_load(render("yaml", rec)[0])["max-model-len"] == 4096
    # A recommendation stored before the search recorded it exports without one, as it did.
    assert "--max-model-len" not in render("vllm-args", _rec(PEAGLE))[0]


def test_a_search_stores_the_max_model_len_its_export_passes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from autotune.cli import main
    from autotune.fit import max_model_len_of
    from autotune.workloads import load_workload

    db = str(tmp_path / "p.db")
    runner = CliRunner()
    searched = runner.invoke(main, ["search", "--model", "gpt-oss-120b", "--gpu", "h200", "--backend", "model",
                                    "--concurrency", "1", "--max-k", "2", "--trials", "4", "--db", db])
    assert searched.exit_code == 0, searched.output
    exported = runner.invoke(main, ["export", "--format", "vllm-args", "--db", db])
    assert exported.exit_code == 0, exported.output
    argv = shlex.split(exported.stdout.strip().splitlines()[-1])
    # mt-bench's longest prompt and max_tokens, as a launch of the search would pass them.
    assert dict(zip(argv[3::2], argv[4::2], strict=True))["--max-model-len"] == \
        str(max_model_len_of(load_workload("mt-bench")))


def test_peagle_tune_serve_passes_it_too_unless_the_user_does(tmp_path: Path) -> None:
    from autotune.serving import build_launch, resolve_tuned_config
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    store.add_recommendation(
        "my-org/tiny-target", gpu="cpu", objective="throughput", workload_name="fixture", scenario={"concurrency": 4},
        best_config={"method": "draft_model", "drafter": "my-org/tiny-drafter", "num_speculative_tokens": 3,
                     "parallel_drafting": False, "max_num_seqs": 16},
        metrics={"acceptance_length": 2.0, "output_tokens_per_s": 500.0, "max_model_len": 4096},
        provenance={"kind": "measured", "backend": "vllm", "device": "cpu"},
    )
    tuned = resolve_tuned_config(store, "my-org/tiny-target", device="cpu")
    argv = list(build_launch(tuned, run_dir=tmp_path / "run").argv)
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    argv = list(build_launch(tuned, run_dir=tmp_path / "run", extra_args=["--max-model-len", "8192"]).argv)
    assert argv.count("--max-model-len") == 1 and argv[argv.index("--max-model-len") + 1] == "8192"


def test_no_spec_recommendation_exports_null_with_a_warning() -> None:
    text, warnings = render("vllm-json", _rec(SpecConfig(max_num_seqs=64)))
    assert json.loads(text) is None
    assert "WITHOUT speculation" in warnings[0]


def test_schedule_export_warns_about_parallel_drafting_and_keeps_k_at_the_top_depth() -> None:
    schedule = [{"batch_min": 1, "batch_max": 7, "k": 6}, {"batch_min": 8, "batch_max": 64, "k": 2}]
    text, warnings = render("schedule", _rec(PEAGLE, schedule=schedule))
    spec = json.loads(text)
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 6], [8, 64, 2]]
    assert spec["num_speculative_tokens"] == 6
    assert warnings == [SCHEDULE_PD_WARNING]


def test_schedule_export_without_schedule_says_what_to_do() -> None:
    with pytest.raises(UsageError, match="Re-run `peagle-tune search`"):
        render("schedule", _rec(PEAGLE))


def test_unknown_format() -> None:
    with pytest.raises(UsageError, match="--format must be one of"):
        render("toml", _rec(PEAGLE))


# ------------------------------------------------------------------------- exports of a real (predicted) search


@pytest.fixture(scope="module")
def recommendation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A stored recommendation from a grid search on the mixed workload (chat, code, math) at concurrency 8."""
    from autotune.backends.model import ModelBackend
    from autotune.search import DrafterChoice, GridStrategy, Search, SearchSpace
    from autotune.spec import Scenario
    from autotune.workloads import load_workload
    from store import Store

    db = tmp_path_factory.mktemp("export") / "peagle.db"
    backend = ModelBackend("gpt-oss-120b", "h200")
    search = Search(
        store=Store(f"sqlite:///{db}"),
        backend=backend,
        model="openai/gpt-oss-120b",
        device=backend.device,
        workload=load_workload("mixed"),
        space=SearchSpace(
            drafters=(DrafterChoice("amazon/gpt-oss-120b-p-eagle", "eagle3", 4, True, recommended_k=5),),
            k_max=8,
            max_num_seqs=(8,),
        ),
        strategy=GridStrategy(),
        study_prefix="export",
    )
    result = search.run_scenario(Scenario(concurrency=8))
    rid = search.recommend(result, {"vllm_version": None})
    assert rid is not None
    return search.store.get_recommendation(rid).to_dict()


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_policy_export_loads_with_the_runtime_loader(
    recommendation: dict[str, Any], tmp_path: Path, suffix: str
) -> None:
    from policies import load_policy

    text, _ = render("policy", recommendation, as_json=suffix == ".json")
    path = tmp_path / f"policy{suffix}"
    path.write_text(text)
    policy = load_policy(path)
    best = SpecConfig.from_dict(recommendation["best_config"])
    caps = {name: v["max_k"] for name, v in recommendation["class_policy"].items()}
    assert set(caps) == {"chat", "code", "math"}
    assert policy.static_k == best.k
    assert policy.max_k == max([best.k, *caps.values()])
    assert {name: policy.limits(name)[1] for name in caps} == caps
    assert policy.model == "openai/gpt-oss-120b"


def test_policy_of_a_no_speculation_recommendation_loads(tmp_path: Path) -> None:
    from policies import load_policy

    text, _ = render("policy", _rec(SpecConfig(max_num_seqs=64)))
    (tmp_path / "p.yaml").write_text(text)
    policy = load_policy(tmp_path / "p.yaml")
    assert (policy.static_k, policy.max_k) == (0, 0)


def test_exports_use_vllm_speculative_config_field_names(recommendation: dict[str, Any]) -> None:
    pytest.importorskip("vllm")
    import dataclasses

    from vllm.config import SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    spec = json.loads(render("vllm-json", recommendation)[0])
    assert set(spec) <= fields
    served = yaml.safe_load(render("yaml", recommendation)[0])
    assert set(served["speculative-config"]) <= fields
    args = shlex.split(render("vllm-args", recommendation)[0])
    assert set(json.loads(args[args.index("--speculative-config") + 1])) <= fields

    scheduled = json.loads(render("schedule", recommendation)[0])
    assert set(scheduled) <= fields
    ranges = scheduled["num_speculative_tokens_per_batch_size"]
    assert validate_and_normalize_dynamic_sd_schedule(ranges) == [tuple(r) for r in ranges]
    # vLLM's per-step lookup over 1..max_num_seqs gives each batch size its scheduled K (none capped by K).
    max_seqs = recommendation["best_config"]["max_num_seqs"]
    lookup = build_dynamic_sd_schedule_lookup(ranges, max_seqs, scheduled["num_speculative_tokens"])
    expected = {b: k for start, end, k in ranges for b in range(start, end + 1)}
    assert lookup[1:] == [expected[b] for b in range(1, max_seqs + 1)]


def test_schedule_export_rejects_a_schedule_vllm_would_reject() -> None:
    gap_at_start = [{"batch_min": 2, "batch_max": 8, "k": 3}]
    with pytest.raises(UsageError, match="must start at batch size 1"):
        render("schedule", _rec(PEAGLE, schedule=gap_at_start))
    overlapping = [{"batch_min": 1, "batch_max": 8, "k": 3}, {"batch_min": 8, "batch_max": 16, "k": 2}]
    with pytest.raises(UsageError, match="non-overlapping"):
        render("schedule", _rec(PEAGLE, schedule=overlapping))
    never = [{"batch_min": 1, "batch_max": 64, "k": 0}]
    with pytest.raises(UsageError, match="never speculates"):
        render("schedule", _rec(PEAGLE, schedule=never))


def test_hypothetical_recommendations_warn_in_every_vllm_format() -> None:
    rec = _rec(PEAGLE.with_(drafter="amazon/gpt-oss-120b-p-eagle:2-layer", drafter_layers=2),
               metrics={"hypothetical_drafter": True})
    for fmt in ("vllm-json", "vllm-args", "yaml"):
        _, warnings = render(fmt, rec)
        assert any("HYPOTHETICAL" in w for w in warnings), fmt
