"""The simulator's acceptance model: exact marginals, prefix consistency, autocorrelation, trace replay."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autotune.errors import UsageError
from autotune.simulate import (
    AcceptanceModel,
    RequestTrace,
    SimRequest,
    autocorrelation_statistic,
    fit_autocorrelation,
    load_traces,
)
from policies import AcceptanceProfile

PROFILE = AcceptanceProfile(1000, (800, 600, 300))
"""Survival [0.8, 0.6, 0.3]: AL(1) = 1.8, AL(2) = 2.4, AL(3) = 2.7 (the worked example of policies._acceptance)."""


def draws(model: AcceptanceModel, depth: int, requests: int, steps: int) -> np.ndarray:
    out = np.empty((requests, steps))
    for i in range(requests):
        stream = model.stream(SimRequest(i, "c", 1, 1))
        out[i] = [stream.accepted(depth) for _ in range(steps)]
    return out


@pytest.mark.parametrize("rho", [0.0, 0.9])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_mean_accepted_reproduces_the_profile_for_any_autocorrelation(rho: float, depth: int) -> None:
    model = AcceptanceModel({"c": PROFILE}, 3, autocorrelation=rho, seed=1)
    a = draws(model, depth, 400, 50)
    expected = PROFILE.acceptance_length(depth) - 1.0
    # Standard error: per-draw sd <= depth / 2; correlated draws within a request count as one per ~1/(1-rho)
    # steps, so the effective sample is at least 400 * 50 * (1 - rho) / (1 + rho).
    n_eff = 400 * 50 * (1 - rho) / (1 + rho)
    assert abs(a.mean() - expected) < 4 * (depth / 2) / math.sqrt(n_eff)


def test_survival_beyond_the_profile_is_extrapolated_geometrically() -> None:
    model = AcceptanceModel({"c": PROFILE}, 4)
    assert model.survival("c") == pytest.approx([0.8, 0.6, 0.3, 0.15])
    assert model.acceptance_length("c", 4) == pytest.approx(2.85)


def test_first_draw_is_prefix_consistent_across_depths() -> None:
    # The same request's first step: verifying K drafts accepts min(R, K) for one run length R.
    model = AcceptanceModel({"c": PROFILE}, 3, seed=5)
    for i in range(200):
        req = SimRequest(i, "c", 1, 1)
        full = model.stream(req).accepted(3)
        assert [model.stream(req).accepted(k) for k in (0, 1, 2, 3)] == [min(full, k) for k in (0, 1, 2, 3)]


def test_streams_are_reproducible_and_per_request() -> None:
    a = draws(AcceptanceModel({"c": PROFILE}, 3, seed=2), 3, 5, 30)
    b = draws(AcceptanceModel({"c": PROFILE}, 3, seed=2), 3, 5, 30)
    c = draws(AcceptanceModel({"c": PROFILE}, 3, seed=3), 3, 5, 30)
    assert (a == b).all()
    assert not (a == c).all()


def test_autocorrelation_shows_in_consecutive_steps_and_is_recovered_by_the_fit() -> None:
    def traces(rho: float, seed: int) -> list[RequestTrace]:
        model = AcceptanceModel({"c": PROFILE}, 3, autocorrelation=rho, seed=seed)
        a = draws(model, 3, 60, 40).astype(int)
        return [RequestTrace("c", tuple((3, int(x)) for x in row)) for row in a]

    iid, _ = autocorrelation_statistic(traces(0.0, 11))
    assert abs(iid) < 0.05
    measured = traces(0.8, 12)
    stat, pairs = autocorrelation_statistic(measured)
    assert pairs == 60 * 39 and stat > 0.3
    rho, _ = fit_autocorrelation(measured, {"c": PROFILE}, 3, seed=99)
    assert rho == pytest.approx(0.8, abs=0.08)


def test_trace_replay_is_exact_where_the_trace_decided_and_sampled_beyond_censoring() -> None:
    trace = RequestTrace("c", ((4, 2), (4, 4), (2, 0), (0, 0)))
    model = AcceptanceModel({"c": AcceptanceProfile.from_survival([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])}, 6,
                            traces=[trace])
    req = SimRequest(0, "c", 1, 1)
    shallow = model.stream(req)
    assert [shallow.accepted(k) for k in (1, 3, 1)] == [1, 3, 0]
    for seed_request in range(50):
        s = model.stream(SimRequest(seed_request, "c", 1, 1))  # one trace: every request replays it
        assert s.accepted(6) == 2  # rejected at position 2 whatever the depth
        beyond = s.accepted(6)  # all 4 recorded drafts accepted: 4..6
        assert 4 <= beyond <= 6
        assert s.accepted(5) == 0
        assert 0 <= s.accepted(3) <= 3  # a depth-0 record says nothing: drawn from the profile


def test_load_traces_reads_plugin_stats_json(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"version": 1, "traces": [{"class": "code", "phase": "p0", "steps": [[4, 1], [4, 4]]}]}))
    assert load_traces(path) == [RequestTrace("code", ((4, 1), (4, 4)), "p0")]
    path.write_text(json.dumps({"version": 1}))
    with pytest.raises(UsageError, match="no traces"):
        load_traces(path)
    with pytest.raises(UsageError, match="accepted"):
        RequestTrace("code", ((2, 3),))


def test_describe_names_the_source_and_the_correlation() -> None:
    assert AcceptanceModel({"c": PROFILE}, 3, source="published AL").describe() == "published AL, i.i.d. (rho=0)"
    traced = AcceptanceModel({"c": PROFILE}, 3, autocorrelation=0.5, traces=[RequestTrace("c", ((1, 1),))])
    assert traced.describe() == "1 recorded traces, then profile, autocorrelated (rho=0.50)"
