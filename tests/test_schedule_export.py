"""Batch-size schedules and exports in vLLM's forms."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from autotune.config import SpecConfig
from autotune.exceptions import UsageError
from autotune.export import SCHEDULE_PD_WARNING, render
from autotune.schedule import ScheduleEntry, best_depth_per_batch, default_batch_sizes, merge_schedule


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
