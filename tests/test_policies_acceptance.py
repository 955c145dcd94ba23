"""Acceptance math: survival, AL(K), the geometric fit of published ALs, intervals, combining and mixing."""

from __future__ import annotations

import pytest

from policies import AcceptanceProfile, acceptance_length, acceptance_lengths, conditional_rates, mix

# The worked example of the module docstring: 100 drafts, 80 had position 0 accepted, 60 positions 0-1, 30 all three.
EXAMPLE = AcceptanceProfile(100, (80, 60, 30))


def test_worked_example_survival_conditional_and_al() -> None:
    # s_i = count_i / 100; a_0 = s_0, a_1 = 0.6/0.8 = 0.75, a_2 = 0.3/0.6 = 0.5.
    assert EXAMPLE.survival().tolist() == pytest.approx([0.8, 0.6, 0.3])
    assert EXAMPLE.conditional().tolist() == pytest.approx([0.8, 0.75, 0.5])
    # AL(K) = 1 + sum_{i<K} s_i: 1, 1.8, 2.4, 2.7.
    assert [EXAMPLE.acceptance_length(k) for k in range(4)] == pytest.approx([1.0, 1.8, 2.4, 2.7])
    assert acceptance_length([0.8, 0.6, 0.3], 2) == pytest.approx(2.4)
    assert EXAMPLE.max_k == 3


def test_al_beyond_measured_depth_extrapolates_with_last_conditional_rate() -> None:
    # Last conditional rate 0.5: s_3 = 0.3 * 0.5 = 0.15, s_4 = 0.075 -> AL(4) = 2.85, AL(5) = 2.925.
    assert EXAMPLE.acceptance_length(4) == pytest.approx(2.85)
    assert EXAMPLE.acceptance_length(5) == pytest.approx(2.925)
    assert acceptance_lengths([0.8, 0.6, 0.3], 5).tolist() == pytest.approx([1, 1.8, 2.4, 2.7, 2.85, 2.925])


def test_conditional_rate_after_a_zero_survival_is_zero_not_nan() -> None:
    # Nothing survives position 1, so there is no evidence at position 2; reported as 0 (AL does not depend on it).
    assert conditional_rates([0.5, 0.0, 0.0]).tolist() == [0.5, 0.0, 0.0]


@pytest.mark.parametrize(
    ("num_drafts", "counts", "message"),
    [
        (100, (60, 80), "non-increasing"),
        (100, (120,), "exceeds num_drafts=100"),
        (100, (-1,), ">= 0"),
        (0, (0,), "num_drafts must be >= 1"),
        (100, (), "at least one position"),
        (100, (1.5,), "integer count"),
    ],
)
def test_invalid_counts_are_rejected_with_the_values(num_drafts: int, counts: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AcceptanceProfile(num_drafts, counts)


def test_geometric_fit_round_trips_published_al() -> None:
    # gpt-oss-120b P-EAGLE on MT-Bench: AL = 2.68 at K = 5 (bonus token included).
    profile = AcceptanceProfile.from_acceptance_length(2.68, 5)
    # Pseudo-counts over 100_000 drafts round each s_i by <= 0.5e-5, so AL(5) is exact to 5 * 0.5e-5.
    assert profile.acceptance_length(5) == pytest.approx(2.68, abs=2.5e-5)
    # The conditional rate is one constant a with a + a^2 + ... + a^5 = 1.68. By hand: a = 0.6568 gives
    # 0.6568 + 0.43139 + 0.28334 + 0.18609 + 0.12223 = 1.67985, so a = 0.6568 to 3 decimals.
    rates = profile.conditional()
    assert rates.tolist() == pytest.approx([0.6568] * 5, abs=1e-3)
    # Deeper than the published K: max_k extends the same geometric curve.
    deeper = AcceptanceProfile.from_acceptance_length(2.68, 5, max_k=8)
    assert deeper.max_k == 8
    assert deeper.acceptance_length(5) == pytest.approx(2.68, abs=4e-5)
    assert deeper.acceptance_length(8) > 2.68


def test_geometric_fit_edges_and_out_of_range() -> None:
    # AL = 1: nothing accepted (a = 0); AL = K + 1: everything accepted (a = 1).
    assert AcceptanceProfile.from_acceptance_length(1.0, 3).survival().tolist() == [0.0, 0.0, 0.0]
    assert AcceptanceProfile.from_acceptance_length(4.0, 3).survival().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"must be in \[1, 6\]"):
        AcceptanceProfile.from_acceptance_length(6.5, 5)
    with pytest.raises(ValueError, match=r"must be in \[1, 6\]"):
        AcceptanceProfile.from_acceptance_length(0.9, 5)


def test_survival_interval_contains_estimate_and_narrows_with_more_drafts() -> None:
    small = AcceptanceProfile(100, (80, 60, 30))
    large = AcceptanceProfile(10_000, (8000, 6000, 3000))  # same survival, 100x the drafts
    for pos, s in enumerate([0.8, 0.6, 0.3]):
        lo_s, hi_s = small.survival_interval(pos)
        lo_l, hi_l = large.survival_interval(pos)
        assert lo_s < s < hi_s and lo_l < s < hi_l
        # Binomial widths scale like 1/sqrt(n): 100x the drafts -> ~10x narrower; 5x is a safe margin.
        assert hi_l - lo_l < (hi_s - lo_s) / 5
    # Exact (Clopper-Pearson) endpoints at the boundaries: 0 successes -> lower 0, all successes -> upper 1.
    assert AcceptanceProfile(20, (0,)).survival_interval(0)[0] == 0.0
    assert AcceptanceProfile(20, (20,)).survival_interval(0)[1] == 1.0
    # Higher confidence -> wider.
    lo90, hi90 = small.survival_interval(0, confidence=0.9)
    lo99, hi99 = small.survival_interval(0, confidence=0.99)
    assert hi99 - lo99 > hi90 - lo90


def test_al_interval_contains_estimate_narrows_and_stays_in_range() -> None:
    small = AcceptanceProfile(100, (80, 60, 30))
    large = AcceptanceProfile(10_000, (8000, 6000, 3000))
    for k in (1, 2, 3, 5):
        lo_s, hi_s = small.acceptance_length_interval(k)
        lo_l, hi_l = large.acceptance_length_interval(k)
        assert lo_s < small.acceptance_length(k) < hi_s
        assert lo_l < large.acceptance_length(k) < hi_l
        assert hi_l - lo_l < (hi_s - lo_s) / 5
        assert 1.0 <= lo_s and hi_s <= k + 1
    assert small.acceptance_length_interval(0) == (1.0, 1.0)
    # Every draft fully accepted: the estimate sits at the top (k+1) but the interval is not a point.
    lo, hi = AcceptanceProfile(10, (10, 10)).acceptance_length_interval(2)
    assert lo < 3.0 and hi == 3.0


def test_combine_pools_counts_and_handles_different_depths() -> None:
    other = AcceptanceProfile(100, (90, 70))
    # Same positions add: 80+90, 60+70 over 200 drafts; the third position only EXAMPLE measured -> truncated.
    assert EXAMPLE.combine(other) == AcceptanceProfile(200, (170, 130))
    # extend=True keeps it with EXAMPLE's conditional rate at position 2 (0.5): round(130 * 0.5) = 65.
    assert EXAMPLE.combine(other, extend=True) == AcceptanceProfile(200, (170, 130, 65))
    assert EXAMPLE.combine(EXAMPLE) == AcceptanceProfile(200, (160, 120, 60))


def test_dict_round_trip_and_unknown_keys() -> None:
    assert AcceptanceProfile.from_dict(EXAMPLE.to_dict()) == EXAMPLE
    assert EXAMPLE.to_dict() == {"num_drafts": 100, "accepted_per_position": [80, 60, 30]}
    with pytest.raises(ValueError, match="exactly the keys"):
        AcceptanceProfile.from_dict({"num_drafts": 1, "accepted_per_position": [1], "k": 1})


def test_from_survival_validates_probabilities() -> None:
    assert AcceptanceProfile.from_survival([0.8, 0.6], num_drafts=10) == AcceptanceProfile(10, (8, 6))
    with pytest.raises(ValueError, match="non-increasing"):
        AcceptanceProfile.from_survival([0.5, 0.6])
    with pytest.raises(ValueError, match=r"probability in \[0, 1\]"):
        AcceptanceProfile.from_survival([1.2])


def test_mix_gives_the_expected_al_of_a_class_mix() -> None:
    code = AcceptanceProfile.from_survival([0.9, 0.8])  # AL(2) = 2.7
    chat = AcceptanceProfile.from_survival([0.5, 0.2])  # AL(2) = 1.7
    mixed = mix({"code": code, "chat": chat}, {"code": 3, "chat": 1})
    # Weights normalise to 0.75 / 0.25: survival 0.75*[0.9, 0.8] + 0.25*[0.5, 0.2] = [0.8, 0.65].
    assert mixed.survival().tolist() == pytest.approx([0.8, 0.65])
    # AL is linear in survival, so the mix's AL is the weighted AL: 0.75*2.7 + 0.25*1.7 = 2.45 (and at K=1: 1.8).
    assert mixed.acceptance_length(2) == pytest.approx(2.45)
    assert mixed.acceptance_length(1) == pytest.approx(0.75 * 1.9 + 0.25 * 1.5)
    with pytest.raises(ValueError, match="without a profile"):
        mix({"code": code}, {"math": 1.0})
    with pytest.raises(ValueError, match="must be > 0"):
        mix({"code": code}, {"code": 0.0})
