"""`peagle-tune search` answers the P-EAGLE question (issue 11, part 2) and re-runs do not duplicate (issue 13.3):

- every scenario's JSON has `per_drafter`, one row per drafter variant searched (drafter, layers, parallel drafting,
  hypothetical) with its best config, tokens/s and speedups -- the figures are the best of that variant's own trials;
- on the model backend the catalog's hypothetical 2-layer P-EAGLE variants are searched by default, labelled, and
  recommended only when no released drafter qualifies;
- re-running a finished search reports the stored recommendation instead of storing it again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from autotune.cli import main
from autotune.search import DrafterChoice, Objective, SearchSpace
from autotune.search.result import pick_released, tie_margin
from autotune.search.trials import ATTR
from autotune.spec import Scenario, SpecConfig

REQUIRED = {"drafter", "layers", "parallel_drafting", "hypothetical", "best_config", "output_tokens_per_s",
            "speedup_vs_no_spec"}


def search(db: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["search", "--backend", "model", "--gpu", "h200", "--db", str(db), *args])


def run_json(db: Path, *args: str) -> dict[str, Any]:
    result = search(db, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def trials_of(db: Path, study: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["show", "--trials", study, "--json", "--db", str(db)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["trials"]


@pytest.fixture(scope="module")
def grid_120b(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A grid search of gpt-oss-120b at c=1 and c=8, K <= 3: every config of every variant is predicted."""
    db = tmp_path_factory.mktemp("ux-search") / "peagle.db"
    doc = run_json(db, "--model", "gpt-oss-120b", "--concurrency", "1,8", "--max-k", "3", "--strategy", "grid")
    return db, doc


def _variant(config: dict[str, Any], hypothetical: bool) -> tuple[Any, ...]:
    return (config["drafter"], config["drafter_layers"], config["parallel_drafting"], hypothetical)


def test_per_drafter_rows_are_each_variants_best_trial(grid_120b: tuple[Path, dict[str, Any]]) -> None:
    db, doc = grid_120b
    for scenario in doc["scenarios"]:
        rows = scenario["per_drafter"]
        assert rows and all(REQUIRED <= set(r) for r in rows)
        # The best trial of each variant, from the study's own trials (duplicates excluded by the store's copy).
        best: dict[tuple[Any, ...], dict[str, Any]] = {}
        for t in trials_of(db, scenario["study"]):
            config = t["config"]
            if t["status"] != "complete" or config["method"] == "none":
                continue
            key = _variant(config, config["drafter"].endswith("-layer"))
            if key not in best or t["metrics"]["output_tokens_per_s"] > best[key]["output_tokens_per_s"]:
                best[key] = t["metrics"]
        assert {_variant(r["best_config"], r["hypothetical"]) for r in rows} == set(best)
        for r in rows:
            config = r["best_config"]
            assert (config["drafter"], config["drafter_layers"], config["parallel_drafting"]) == (
                r["drafter"], r["layers"], r["parallel_drafting"])
            # The variant's best, or a simpler config tied with it within the tie rule's margin (the spread of the
            # best's prediction, as stored with its metrics).
            top = best[_variant(config, r["hypothetical"])]
            margin = tie_margin(top["prediction_log_sigma"])
            assert top["output_tokens_per_s"] * (1 - margin) <= r["output_tokens_per_s"] \
                <= top["output_tokens_per_s"] * (1 + 1e-9)
        assert [r["output_tokens_per_s"] for r in rows] == sorted((r["output_tokens_per_s"] for r in rows),
                                                                  reverse=True)


def test_2_vs_4_layers_and_eagle3_are_compared_by_default(grid_120b: tuple[Path, dict[str, Any]]) -> None:
    _, doc = grid_120b
    assert any("HYPOTHETICAL" in note and "layer ablation" in note for note in doc["notes"])
    for scenario in doc["scenarios"]:
        rows = scenario["per_drafter"]
        layers = {r["layers"] for r in rows if r["drafter"].startswith("amazon/gpt-oss-120b-p-eagle")}
        assert layers == {2, 4}
        assert all(r["hypothetical"] == r["drafter"].endswith(":2-layer") for r in rows)
        # The EAGLE-3 reference: the released sequential EAGLE-3 head, at its best K, divides every row.
        eagle3 = [r for r in rows if "Eagle3" in r["drafter"]]
        assert len(eagle3) == 1 and eagle3[0]["speedup_vs_eagle3"] == pytest.approx(1.0)
        for r in rows:
            assert r["speedup_vs_eagle3"] == pytest.approx(r["output_tokens_per_s"] / eagle3[0]["output_tokens_per_s"])
        # The recommendation is the fastest released variant's best config.
        released = [r for r in rows if not r["hypothetical"]]
        assert scenario["best_config"] == released[0]["best_config"]


def test_the_table_shows_the_comparison_within_80_columns(grid_120b: tuple[Path, dict[str, Any]]) -> None:
    db, _ = grid_120b
    result = search(db, "--model", "gpt-oss-120b", "--concurrency", "1,8", "--max-k", "3", "--strategy", "grid")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Each drafter at its best config" in text and "p-eagle 2L*" in text and "ref" in text
    lines = text[text.index("gpt-oss-120b on h200"):text.index("Rule:")].splitlines()
    assert lines and max(len(line) for line in lines) <= 80


def test_rerunning_a_finished_search_reports_the_stored_recommendations(
    grid_120b: tuple[Path, dict[str, Any]]
) -> None:
    db, first = grid_120b
    again = run_json(db, "--model", "gpt-oss-120b", "--concurrency", "1,8", "--max-k", "3", "--strategy", "grid")
    assert [s["recommendation_id"] for s in again["scenarios"]] == [s["recommendation_id"] for s in first["scenarios"]]
    assert all(s["stored_before"] for s in again["scenarios"])
    shown = CliRunner().invoke(main, ["show", "--json", "--db", str(db)])
    assert len(json.loads(shown.stdout)["recommendations"]) == 2  # still one per concurrency
    text = search(db, "--model", "gpt-oss-120b", "--concurrency", "1,8", "--max-k", "3", "--strategy", "grid").stdout
    assert "Already stored by an earlier run" in " ".join(text.split())


def test_a_changed_result_is_stored_anew(grid_120b: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    # Same inputs but another study name: a new study, so a new recommendation (dedup is per study).
    db, first = grid_120b
    other = run_json(db, "--model", "gpt-oss-120b", "--concurrency", "1", "--max-k", "3", "--strategy", "grid",
                     "--study", "other")
    assert other["scenarios"][0]["stored_before"] is False
    assert other["scenarios"][0]["recommendation_id"] not in {s["recommendation_id"] for s in first["scenarios"]}


def test_named_drafters_are_searched_as_named(tmp_path: Path) -> None:
    doc = run_json(tmp_path / "p.db", "--model", "gpt-oss-120b", "--concurrency", "1", "--max-k", "2",
                   "--strategy", "grid", "--drafter", "amazon/gpt-oss-120b-p-eagle")
    assert {r["hypothetical"] for r in doc["scenarios"][0]["per_drafter"]} == {False}


def test_a_faster_hypothetical_head_is_shown_not_recommended(tmp_path: Path) -> None:
    # Llama-3.1-8B: the P-EAGLE heads are the paper's (no checkpoint), the EAGLE-3 head is released. The model
    # backend predicts P-EAGLE faster at c=1, but only the released head can be served.
    db = tmp_path / "llama.db"
    args = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--concurrency", "1", "--max-num-seqs", "1",
            "--strategy", "grid"]
    scenario = run_json(db, *args)["scenarios"][0]
    rows = scenario["per_drafter"]
    assert rows[0]["hypothetical"] and rows[0]["drafter"].startswith("p-eagle-paper/")
    assert scenario["best_config"]["drafter"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert scenario["hypothetical"] is None and scenario["recommendation_id"] is not None
    text = " ".join(search(db, *args).stdout.split())
    assert "is predicted" in text and "faster" in text and "not recommended: no checkpoint exists" in text


# -------------------------------------------------------------------------------------- the picking rule, alone


def _trial(number: int, config: SpecConfig, tps: float) -> Any:
    import optuna

    return optuna.trial.create_trial(
        value=tps, user_attrs={ATTR: {"config": config.to_dict(), "metrics": {"output_tokens_per_s": tps}}},
    )


def test_pick_prefers_a_released_drafter_unless_only_hypothetical_ones_were_searched() -> None:
    from autotune.search.trials import trial_config

    real = DrafterChoice("org/real", "eagle3", 1, False, recommended_k=3)
    paper = DrafterChoice("org/paper", "eagle3", 4, True, recommended_k=5, hypothetical=True)
    space = SearchSpace(drafters=(real, paper), k_max=4, max_num_seqs=(8,))
    base = SpecConfig(max_num_seqs=8)
    fast_paper = SpecConfig(method="eagle3", drafter="org/paper", num_speculative_tokens=3, parallel_drafting=True,
                            drafter_layers=4, max_num_seqs=8)
    real_k2 = SpecConfig(method="eagle3", drafter="org/real", num_speculative_tokens=2, drafter_layers=1,
                         max_num_seqs=8)
    trials = [_trial(0, base, 100.0), _trial(1, fast_paper, 180.0), _trial(2, real_k2, 130.0)]

    def config_of(t: Any) -> SpecConfig | None:
        return trial_config(space, t)

    chosen, ok = pick_released(Objective(), trials, [], Scenario(concurrency=8), space, config_of)
    assert ok and config_of(chosen) == real_k2
    # Without a released drafter among the trials, the hypothetical one is recommended (labelled by the caller).
    chosen, ok = pick_released(Objective(), trials[:2], [], Scenario(concurrency=8), space, config_of)
    assert ok and config_of(chosen) == fast_paper
