"""Request labels as the plugin reads them: bounded, checked, and the middleware's stamp the only way to a class
the operator (not the client) chose."""

from __future__ import annotations

from typing import Any

import pytest

from policies import MAX_CLASSES, AcceptanceEstimator, ClassPolicy, RequestPolicy
from policies.plugin import LABEL_KEY_ENV, OTHER_LABEL, PluginStats, route_stamp
from policies.plugin.labels import MAX_PHASES, LabelBook, RequestLabeler, stamped_class, valid_label

POLICY = RequestPolicy(static_k=1, max_k=8, default_class="chat",
                       classes={"chat": ClassPolicy(max_k=1), "code": ClassPolicy(max_k=8, min_k=2)})


@pytest.mark.parametrize(
    ("value", "ok"),
    [("c4", True), ("long context", True), ("x" * 64, True), ("x" * 65, False), ("", False), ("a\nb", False),
     ("\x1b[31m", False), (3, False), (None, False), (["a"], False)],
)
def test_a_label_is_a_short_printable_string(value: Any, ok: bool) -> None:
    assert valid_label(value) is ok


def test_a_label_book_keeps_the_first_labels_and_folds_the_rest() -> None:
    book = LabelBook(3, fixed=("default",))
    assert [book.admit(x) for x in ("a", "b", "c", "a", "default")] == ["a", "b", OTHER_LABEL, "a", "default"]
    assert len(book) == 3 and book.folded == 1


def test_stamps_verify_only_under_the_launch_key() -> None:
    stamp = route_stamp("code", "k1")
    assert stamped_class({"peagle_route": stamp}, "k1") == "code"
    assert stamped_class({"peagle_route": stamp}, "k2") is None
    assert stamped_class({"peagle_route": stamp}, None) is None
    assert stamped_class({"peagle_route": "code|" + "0" * 32}, "k1") is None
    assert stamped_class({"peagle_route": stamp.replace("code", "chat")}, "k1") is None
    for junk in (3, "", "|", "code", "x" * 10_000, ["code"]):
        assert stamped_class({"peagle_route": junk}, "k1") is None


def test_under_a_policy_only_a_stamp_gives_a_deeper_class() -> None:
    labeler = RequestLabeler.from_env(POLICY, {LABEL_KEY_ENV: "k"})
    asks = labeler.label("a", {"peagle_class": "code"})
    assert (asks.cls, asks.view.max_k) == ("chat", 1)
    unknown = labeler.label("b", {"peagle_class": "no-such-class", "peagle_phase": "p1"})
    assert (unknown.cls, unknown.view.max_k, unknown.phase) == ("chat", 1, "p1")
    given = labeler.label("c", {"peagle_route": route_stamp("code", "k")})
    assert (given.cls, given.view.min_k, given.view.max_k) == ("code", 2, 8)
    lowered = labeler.label("d", {"peagle_route": route_stamp("code", "k"), "peagle_max_k": 1})
    assert (lowered.cls, lowered.view.min_k, lowered.view.max_k) == ("code", 1, 1)
    opted = labeler.label("e", {"peagle_route": route_stamp("code", "k"), "peagle_speculate": 0})
    assert opted.bound(8) == 0
    stranger = labeler.label("f", {"peagle_route": route_stamp("not-in-policy", "k")})  # stamped, but unknown
    assert stranger.cls == "chat"


def test_unreadable_values_drop_the_clients_labels_but_keep_the_stamp() -> None:
    labeler = RequestLabeler(POLICY, route_key="k")
    odd = labeler.label("a", {"peagle_route": route_stamp("code", "k"), "peagle_speculate": "maybe"})
    assert (odd.cls, odd.view.speculate, odd.view.max_k) == ("code", True, 8)
    odd = labeler.label("b", {"peagle_max_k": "lots", "peagle_class": "code"})
    assert (odd.cls, odd.view.max_k) == ("chat", 1)  # never the default class's *deeper* neighbour
    assert labeler.rejected == 2 and "peagle_max_k" in str(labeler.last_rejection)


def test_without_a_policy_labels_are_taken_as_given_but_bounded() -> None:
    labeler = RequestLabeler()
    seen = {labeler.label(f"r{i}", {"peagle_class": f"c{i}", "peagle_phase": f"p{i}"}) for i in range(1000)}
    # "default" holds one of the places (no request here uses it): MAX - 1 labels kept, plus "other".
    assert len({x.cls for x in seen}) == MAX_CLASSES and len({x.phase for x in seen}) == MAX_PHASES
    assert labeler.folded == {"classes": 1000 - (MAX_CLASSES - 1), "phases": 1000 - (MAX_PHASES - 1)}
    own = labeler.label("x", {"peagle_class": "c1", "peagle_max_k": 2})
    assert (own.cls, own.bound(4), own.bound(1)) == ("c1", 2, 1)


def test_stats_and_estimator_stay_bounded_on_their_own() -> None:
    stats = PluginStats(max_classes=4, max_phases=2)
    for i in range(100):
        stats.observe_step(step_ms=1.0, prompt_tokens=0, drafting_depth=2, requests=[(f"c{i}", f"p{i}", 2, 1)])
    assert stats.classes() == sorted(["c0", "c1", "c2", "c3", OTHER_LABEL])
    assert stats.phases() == sorted(["p0", "p1", OTHER_LABEL])
    assert stats.to_dict()["info"]["folded_labels"] == {"classes": 96, "phases": 98}
    est = AcceptanceEstimator(4, max_classes=2)
    for i in range(10):
        est.observe(f"c{i}", 4, 4)
    assert est.classes() == ["c0", "c1"]
    assert list(est.conditional("c9")) == list(est.global_conditional())  # an untracked class: the global estimate
