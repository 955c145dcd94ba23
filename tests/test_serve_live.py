"""Live acceptance from plugin statistics, drift detection on plain numbers, and recording live profiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_serve_launch import ENV, MODEL, add_profile, add_recommendation

from autotune.serving import LiveRecorder, check_drift, live_acceptance, live_profile, resolve_tuned_config
from policies import AcceptanceProfile
from policies.plugin import PluginStats
from store import Store


def rows(cls: str, depth: int, accepted_counts: dict[int, int]) -> list[tuple[str, str, int, int]]:
    """Plugin rows (class, phase, drafted, accepted): ``accepted_counts[a]`` requests accepted the first a drafts."""
    return [(cls, "default", depth, a) for a, n in accepted_counts.items() for _ in range(n)]


def mixed_depth_stats() -> PluginStats:
    """Class "code": 100 drafts at depth 3 accepting 0/1/2/3 tokens 20/20/30/30 times (per position: 80, 60, 30
    accepted), and 100 drafts at depth 1 of which 60 accepted (the controller capped them)."""
    stats = PluginStats()
    for batch in (rows("code", 3, {0: 20, 1: 20, 2: 30, 3: 30}), rows("code", 1, {0: 40, 1: 60})):
        for i in range(0, len(batch), 10):  # steps of 10 requests
            stats.observe_step(step_ms=12.0, prompt_tokens=0, requests=batch[i:i + 10], drafting_depth=3)
    return stats


def test_live_acceptance_pools_depths_by_per_position_conditional_rates() -> None:
    acceptance, judged = live_acceptance(mixed_depth_stats())
    # Position 0 is judged on all 200 drafts: 80 + 60 accepted -> s0 = 0.7.
    # Position 1 only on the 80 depth-3 drafts that accepted position 0: 60 -> c1 = 0.75, s1 = 0.7 * 0.75 = 0.525.
    # Position 2 on the 60 that reached it: 30 -> c2 = 0.5, s2 = 0.2625.
    profile = acceptance["code"]
    assert profile.num_drafts == 200
    # Stored as whole-draft counts: each value within half a draft (0.5 / 200).
    assert profile.survival() == pytest.approx([0.7, 0.525, 0.2625], abs=0.5 / 200 + 1e-12)
    assert judged["code"] == [200, 80, 60]


def test_live_acceptance_of_a_single_depth_is_the_plain_ratio() -> None:
    stats = PluginStats()
    stats.observe_step(step_ms=5.0, prompt_tokens=0, requests=rows("chat", 2, {0: 5, 1: 3, 2: 2}), drafting_depth=2)
    acceptance, _ = live_acceptance(stats)
    assert acceptance["chat"] == AcceptanceProfile(10, (5, 2))


def test_a_class_capped_at_depth_one_has_no_deeper_positions() -> None:
    stats = PluginStats()
    stats.observe_step(step_ms=5.0, prompt_tokens=0, requests=rows("chat", 1, {0: 3, 1: 7}), drafting_depth=4)
    acceptance, judged = live_acceptance(stats)
    assert acceptance["chat"].max_k == 1 and judged["chat"] == [10]


def test_drift_on_plain_numbers() -> None:
    live = {"code": AcceptanceProfile(400, (200, 100)), "chat": AcceptanceProfile(400, (200, 100))}
    judged = {"code": [400, 200], "chat": [400, 50]}
    # Live AL(2) = 1 + 0.5 + 0.25 = 1.75 for both classes.
    report = check_drift(live, judged, {"code": 2.2, "chat": 2.2}, 2, threshold=0.15, min_drafts=100)
    by_class = {r["class"]: r for r in report.rows}
    assert by_class["code"]["change"] == pytest.approx(1.75 / 2.2 - 1)  # -20.5% -> drifted
    assert by_class["code"]["drifted"]
    assert not by_class["chat"]["drifted"]  # same change, but only 50 drafts judged at position 2
    assert report.drifted and "peagle-tune search --model m" in report.message("m")
    # 1.75 vs 1.9: -7.9%, within 15%.
    assert not check_drift(live, judged, {"code": 1.9}, 2, min_drafts=100).drifted


def test_drift_against_an_overall_figure_mixes_classes_by_drafts() -> None:
    live = {"code": AcceptanceProfile(300, (300, 300)), "chat": AcceptanceProfile(100, (0, 0))}
    judged = {"code": [300, 300], "chat": [100, 0]}
    # Mixed by drafts: survival (0.75, 0.75) -> AL(2) = 2.5; vs 3.0 tuned: -16.7%.
    report = check_drift(live, judged, {"*": 3.0}, 2, min_drafts=200)
    (row,) = report.rows
    assert row["live_al"] == pytest.approx(2.5) and row["judged"] == 300 and row["drifted"]


def test_live_profile_fits_step_costs_only_with_enough_shapes() -> None:
    stats = mixed_depth_stats()
    assert live_profile(stats).cost_model is None  # one batch size: the coefficients are not identifiable
    for b in (1, 2, 4, 8):
        for d in (0, 2):
            stats.observe_step(step_ms=5.0 + b * (1 + d), prompt_tokens=0,
                               requests=rows("code", d, {0: b}) if d else [("code", "default", 0, 0)] * b,
                               drafting_depth=3)
    live = live_profile(stats)
    assert live.cost_model is not None and live.cost_model.fit_error()["num_samples"] >= 4


def test_recorder_stores_live_profiles_warns_on_drift_and_feeds_the_next_launch(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    add_recommendation(store, k=3)
    measured = add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    stats_path = tmp_path / "stats.json"
    logs: list[str] = []
    recorder = LiveRecorder(store, tuned, stats_path, log=logs.append, environment=ENV, min_drafts=50)
    assert recorder.record() is None  # no stats file yet

    # "predictable" was profiled at survival (.9, .8, .7): AL(3) = 3.4. Live: 200 drafts at depth 3 accepting
    # 0 or 3 tokens half the time each -> survival (.5, .5, .5), AL(3) = 2.5: -26%, drift.
    stats = PluginStats()
    stats.observe_step(step_ms=9.0, prompt_tokens=0, requests=rows("predictable", 3, {0: 100, 3: 100}),
                       drafting_depth=5)
    stats.save(stats_path)
    first = recorder.record()
    assert first is not None
    record = store.get_profile(first)
    assert record.kind == "live" and record.device == "cpu" and record.drafter == tuned.spec.drafter
    assert record.acceptance["predictable"] == {"num_drafts": 200, "accepted_per_position": [100, 100, 100]}
    assert record.notes["recommendation_id"] == tuned.recommendation["id"]
    assert record.cost_model is not None  # carried over from the measured profile (too few shapes to refit)
    assert "carried over" in record.notes["cost_model_source"]
    assert any("drifted by more than 15%" in line and "predictable" in line for line in logs)

    assert recorder.record() is None  # nothing new since the last record
    stats.observe_step(step_ms=9.0, prompt_tokens=0, requests=rows("predictable", 3, {3: 10}), drafting_depth=5)
    stats.save(stats_path)
    second = recorder.record()
    assert second is not None and second > first
    assert sum("drifted" in line for line in logs) == 1  # the same drift is reported once

    # The next launch starts from the live profile (newest), not from the measured one.
    again = resolve_tuned_config(store, MODEL, device="cpu")
    assert again.profile is not None and again.profile["id"] == second != measured
    assert again.acceptance["predictable"].num_drafts == 210


def test_live_profiles_keep_only_the_policys_classes(tmp_path: Path) -> None:
    # A plugin without the policy (or an old stats file) saw junk class labels: they must not become stored classes,
    # which later launches would load as priors.
    store = Store(f"sqlite:///{tmp_path / 'peagle.db'}")
    add_recommendation(store, k=3)
    add_profile(store)
    tuned = resolve_tuned_config(store, MODEL, device="cpu")
    stats = PluginStats()
    junk = [row for i in range(200) for row in rows(f"junk-{i}", 2, {1: 1})]
    stats.observe_step(step_ms=9.0, prompt_tokens=0, requests=rows("predictable", 3, {3: 10}) + junk,
                       drafting_depth=3)
    stats.save(tmp_path / "stats.json")
    recorder = LiveRecorder(store, tuned, tmp_path / "stats.json", log=lambda _: None, environment=ENV)
    stored = store.get_profile(recorder.record())
    assert set(stored.acceptance) == {"predictable"} <= tuned.policy.known_classes
    assert set(stored.notes["judged_per_position"]) == {"predictable"}
