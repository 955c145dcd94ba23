"""The numbers behind the report figures: what a user reads off each plot must follow from the stored records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_report_render import MODEL, add_derived_profile, add_multi_objective_study, step_ms

from autotune.report import (
    GoodputData,
    acceptance_from_profile,
    goodput_from_profile,
    plot_goodput,
    slos_of,
    step_cost_from_profile,
    study_data,
)
from store import ProfileRecord, Store


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(str(tmp_path / "s.db")) as s:
        yield s


def _profile(store: Store, **changes: object) -> ProfileRecord:
    pid = add_derived_profile(store)
    p = store.get_profile(pid)
    return ProfileRecord(**{**p.__dict__, **changes})


def test_acceptance_reads_back_the_measured_survival_with_intervals_around_it(store: Store) -> None:
    data, notes = acceptance_from_profile(_profile(store))
    assert data is not None and notes == []
    assert data.measured and "vLLM 0.32.0" in data.caption and "on cpu" in data.caption
    chat = next(c for c in data.classes if c.name == "chat")
    # round(4000 * 0.6^(i+1)) / 4000: 0.6, 0.36, 0.216
    assert chat.survival[:3] == pytest.approx([0.6, 0.36, 0.216])
    assert all(lo <= s <= hi for s, lo, hi in zip(chat.survival, chat.survival_low, chat.survival_high, strict=True))
    # AL(2) = 1 + 0.6 + 0.36
    assert chat.acceptance_length[2] == pytest.approx(1.96)
    # The catalog publishes MT-Bench AL 2.68 at K=5 for this drafter; class "chat" maps to MT-Bench.
    assert chat.references == [(5, 2.68, "published mt-bench")]


def test_class_without_drafts_is_skipped_with_a_note(store: Store) -> None:
    p = _profile(store)
    broken = {**p.acceptance, "math": {"num_drafts": 0, "accepted_per_position": [0, 0]}}
    data, notes = acceptance_from_profile(ProfileRecord(**{**p.__dict__, "acceptance": broken}))
    assert data is not None and sorted(c.name for c in data.classes) == ["chat", "code"]
    assert len(notes) == 1 and "'math'" in notes[0]


def test_goodput_is_batch_times_pooled_al_over_step_time(store: Store) -> None:
    data = goodput_from_profile(_profile(store))
    assert data is not None and data.source == "profile"
    assert data.ks == list(range(7))  # the profile's measured depth, 6
    # B=1, K=0: 1 token per step / T(1, 0) = 4 + 0.3 + 0.02 = 4.32 ms -> 231.48 tokens/s
    assert data.tokens_per_s[1][0] == pytest.approx(1000 / 4.32, rel=1e-6)
    # B=16, K=1: pooled survival at position 1 = (2400 + 3200) / 8000 = 0.7, AL = 1.7; T(16, 1) from step_ms.
    assert data.tokens_per_s[16][1] == pytest.approx(16 * 1.7 / step_ms(16, 1) * 1000, rel=1e-6)


def test_best_k_takes_the_smaller_depth_within_a_tenth_of_a_percent() -> None:
    # K=2 gains 0.05% over K=1: a tie by the search's rule, so the smaller K is best; K=0 is far below.
    data = GoodputData("t", "c", "profile", [0, 1, 2], {8: [100.0, 110.0, 110.055]})
    assert data.best_k(8) == 1
    data = GoodputData("t", "c", "profile", [0, 1, 2], {8: [100.0, 110.0, 111.0]})
    assert data.best_k(8) == 2


def test_step_cost_without_a_stored_model_is_fitted_and_says_so(store: Store) -> None:
    data = step_cost_from_profile(_profile(store, cost_model=None))
    assert data is not None
    assert "fitted here to the samples (none stored)" in data.model_label
    assert len(data.samples) == 3 * 7  # 3 batch sizes x depths 0..6
    # The fit reproduces the exact linear costs at a measured point: T(4, 3) = 4 + 1.2 + 0.32 + 1.7 = 7.22 ms.
    assert dict(data.model_lines[3])[4] == pytest.approx(7.22, rel=1e-6)


def test_pareto_front_keeps_the_trials_nothing_beats_on_both_objectives(store: Store) -> None:
    add_multi_objective_study(store)
    data = study_data("mo-study", store.list_trials("mo-study"))
    assert data.objectives == ["throughput", "tpot_ms_p99"]
    assert data.directions == {"throughput": "maximize", "tpot_ms_p99": "minimize"}
    # (150 tok/s, 30 ms) is beaten by (200 tok/s, 20 ms); the others each win somewhere.
    assert [t.number for t in data.pareto()] == [0, 1, 3]
    assert data.best() is not None and data.best().number == 3  # type: ignore[union-attr]
    assert "Measured on cpu, vLLM 0.32.0, 2026-01-02" in data.caption


def test_latency_study_best_is_the_lowest_value(store: Store) -> None:
    for number, tpot in enumerate([5.0, 3.0, 4.0]):
        store.add_trial("lat", number=number, model=MODEL, backend="model", values={"latency": tpot},
                        config={"method": "none", "max_num_seqs": 1}, created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    best = study_data("lat", store.list_trials("lat")).best()
    assert best is not None and best.number == 1


def test_goodput_plot_writes_a_png(tmp_path: Path) -> None:
    data = GoodputData("t", "Predicted from nothing in particular.", "profile", [0, 1, 2],
                       {1: [100.0, 150.0, 140.0], 8: [500.0, float("nan"), 520.0]})
    path = plot_goodput(data, tmp_path / "g.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_starred_trial_is_the_recommended_config_or_the_searchs_tie_rule(store: Store) -> None:
    def config(k: int) -> dict[str, object]:
        return {"method": "eagle3", "drafter": "d", "num_speculative_tokens": k, "parallel_drafting": True,
                "max_num_seqs": 8, "drafter_layers": None, "max_num_batched_tokens": None}

    # K=3 is 0.05% above K=2: tied by the search's 0.1% rule, so the smaller K is the pick.
    for number, (k, tps) in enumerate([(3, 1000.0), (2, 999.5), (1, 900.0)]):
        store.add_trial("tie", number=number, model=MODEL, backend="model", values={"throughput": tps},
                        config=config(k), scenario={"concurrency": 8})
    trials = store.list_trials("tie")
    assert study_data("tie", trials).best().k == 2  # type: ignore[union-attr]
    # A stored recommendation wins: its config's trial is starred.
    assert study_data("tie", trials, recommended=config(1)).best().k == 1  # type: ignore[union-attr]


def test_slos_come_from_the_recommendations_objective(store: Store) -> None:
    rid = store.add_recommendation(
        MODEL, gpu="cpu", objective="pareto", best_config={"method": "none", "max_num_seqs": 4},
        metrics={"objective": {"name": "pareto", "slo_tpot_p99_ms": 12.0, "slo_ttft_p99_ms": None}},
    )
    assert slos_of(store.get_recommendation(rid)) == {"tpot_ms_p99": 12.0}
