"""What the depth controller sees of a running batch, and what it answers.

`RequestView`: one running request as the controller needs it (class, cap, floor, opt-out), built by
`RequestPolicy.view`. Requests with the same (class, floor, cap, speculate) form a *cohort*; the controller prices a
cohort once, whatever its size. `TrackedBatch`: the running batch kept up to date by the scheduler's add/remove, so a
decision costs O(classes * max_k) instead of O(B). `Decision`: the controller's answer for one step, a depth per class
turned into a depth per request by `Decision.depth_for` (class depth clamped to the request's floor and cap, 0 when it
opted out).

Example: a request capped at 2 in a class planned at depth 4 verifies 2 drafts; with a floor of 3 and a plan of 1 it
verifies 3; opted out, 0::

    >>> d = Decision({"code": 4, "chat": 1}, default_depth=2, max_k=8, batch_depth=4, predicted_goodput=0.0,
    ...              predicted_step_ms=0.0, batch=())
    >>> d.depth_for(RequestView("a", "code", max_k=2)), d.depth_for(RequestView("b", "chat", min_k=3))
    (2, 3)
    >>> d.depth_for(RequestView("c", "code", speculate=False)), d.depth_for(RequestView("d", "math"))
    (0, 2)
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter

__all__ = ["Cohort", "Decision", "RequestView", "StepTally", "TrackedBatch", "cohort_of"]

Cohort = tuple[str, int, int | None, bool]
"""(class, floor, cap, speculate): requests the controller treats alike."""
cohort_of = attrgetter("cohort")


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the controller needs to know about one running request (built by `RequestPolicy.view`).

    ``max_k``: the request's cap (None: the controller's max_k). ``min_k``: its floor (verified depth it always
    gets when it speculates). ``speculate``: False opts the request out (depth 0).
    """

    request_id: str
    cls: str
    max_k: int | None = None
    min_k: int = 0
    speculate: bool = True
    cohort: Cohort = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"Request {self.request_id!r}: max_k (cap) must be >= 0, but got {self.max_k}.")
        if self.min_k < 0:
            raise ValueError(f"Request {self.request_id!r}: min_k (floor) must be >= 0, but got {self.min_k}.")
        object.__setattr__(self, "cohort", (self.cls, self.min_k, self.max_k, self.speculate))


class TrackedBatch:
    """The running batch kept up to date with `add`/`remove`, so `DepthController.decide` costs O(classes * max_k)
    per step instead of O(B): the scheduler calls `add` when a request starts decoding and `remove` when it
    finishes or is preempted. Iterating yields the `RequestView`s.
    """

    _versions = itertools.count(1)  # global, so two batches never share a (batch, version) cache key

    def __init__(self, views: Iterable[RequestView] = ()) -> None:
        self._views: dict[str, RequestView] = {}
        self._counts: dict[Cohort, int] = {}
        self._members: dict[Cohort, dict[str, None]] = {}
        self.version = next(self._versions)
        self.changes = 0
        """Adds plus removes so far (the controller measures churn with it)."""
        for v in views:
            self.add(v)

    def add(self, view: RequestView) -> None:
        """Add (or replace) a request. O(1)."""
        if view.request_id in self._views:
            self.remove(view.request_id)
        self._views[view.request_id] = view
        c = view.cohort
        self._counts[c] = self._counts.get(c, 0) + 1
        self._members.setdefault(c, {})[view.request_id] = None
        self.version = next(self._versions)
        self.changes += 1

    def remove(self, request_id: str) -> None:
        """Remove a request (no error if absent). O(1)."""
        view = self._views.pop(request_id, None)
        if view is None:
            return
        c = view.cohort
        left = self._counts[c] - 1
        if left:
            self._counts[c] = left
            del self._members[c][request_id]
        else:
            del self._counts[c]
            del self._members[c]
        self.version = next(self._versions)
        self.changes += 1

    def sync(self, views: Iterable[RequestView]) -> None:
        """Make the batch hold exactly ``views`` (adds and removes the difference). O(B)."""
        wanted = {v.request_id: v for v in views}
        for rid in [r for r in self._views if r not in wanted]:
            self.remove(rid)
        for rid, v in wanted.items():
            current = self._views.get(rid)
            if current is not v and current != v:  # views are cached per request: mostly the same object
                self.add(v)

    @property
    def counts(self) -> Mapping[Cohort, int]:
        """Requests per cohort (class, floor, cap, speculate). Read-only view."""
        return self._counts

    def first_of(self, cohort: Cohort) -> str | None:
        members = self._members.get(cohort)
        return next(iter(members)) if members else None

    def get(self, request_id: str) -> RequestView | None:
        return self._views.get(request_id)

    def __len__(self) -> int:
        return len(self._views)

    def __iter__(self) -> Iterator[RequestView]:
        return iter(self._views.values())

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._views


@dataclass(frozen=True)
class Decision:
    """The depth plan for one step. Query a request's depth with `depth_for` (O(1)) or all of them with `depths`.

    ``plan``: depth per class before each request's cap/floor. ``default_depth``: depth for a class not in the plan.
    ``batch_depth``: the deepest depth any request of the batch gets (what the drafter must propose).
    ``predicted_goodput``: tokens/s and ``predicted_step_ms``: ms, both predicted. ``explore``: request ids that verify
    at their cap this step to keep measuring deep positions. ``fallback``: True when this is the static fallback;
    ``reason`` says why. ``batch`` is the object passed to `decide`; for a `TrackedBatch` that keeps changing, read
    `depths` in the same step (or use `depth_for`).
    """

    plan: Mapping[str, int]
    default_depth: int
    max_k: int
    batch_depth: int
    predicted_goodput: float
    predicted_step_ms: float
    batch: Collection[RequestView] = field(repr=False)
    explore: frozenset[str] = frozenset()
    fallback: bool = False
    reason: str = ""

    def depth_for(self, view: RequestView) -> int:
        """Verified depth for this request: its class depth, clamped to its floor and cap; 0 if it opted out."""
        if not view.speculate:
            return 0
        hi = self.max_k if view.max_k is None else min(view.max_k, self.max_k)
        if view.request_id in self.explore:
            return hi
        k = self.plan.get(view.cls, self.default_depth)
        return max(min(view.min_k, hi), min(k, hi))

    @cached_property
    def depths(self) -> dict[str, int]:
        """Depth per request id for the whole batch (built on first use)."""
        return {v.request_id: self.depth_for(v) for v in self.batch}


class StepTally:
    """One engine step's request outcomes counted per (class, phase): ``outcomes[(cls, phase)][(drafted, accepted)]``
    = requests. The scheduler plugin builds it once per step and the controller, the statistics and the metrics
    consume it, so their work per step grows with the distinct outcomes (a few per class), not with the batch.

    ``size``: requests in the step; ``verified``: tokens verified, sum of (drafted + 1); ``deepest``: the most drafts
    any request verified; ``prompt_tokens``: prompt tokens computed in the step (a step with any is not a decode step).

    Example: two "code" requests verified 2 drafts and accepted 2 and 1, a "chat" one verified none::

        >>> t = StepTally()
        >>> for cls, d, a in (("code", 2, 2), ("code", 2, 1), ("chat", 0, 0)):
        ...     t.add(cls, "p", d, a)
        >>> t.size, t.verified, t.deepest, t.outcomes[("code", "p")]
        (3, 7, 2, {(2, 2): 1, (2, 1): 1})
        >>> t.by_class()["chat"]
        {(0, 0): 1}
    """

    __slots__ = ("outcomes", "size", "verified", "deepest", "prompt_tokens")

    def __init__(self) -> None:
        self.outcomes: dict[tuple[str, str], dict[tuple[int, int], int]] = {}
        self.size = 0
        self.verified = 0
        self.deepest = 0
        self.prompt_tokens = 0

    def add(self, cls: str, phase: str, drafted: int, accepted: int, count: int = 1) -> None:
        """``count`` requests of (cls, phase) that verified ``drafted`` drafts and accepted the first ``accepted``."""
        key = (cls, phase)
        outcomes = self.outcomes.get(key)
        if outcomes is None:
            outcomes = self.outcomes[key] = {}
        pair = (drafted, accepted)
        outcomes[pair] = outcomes.get(pair, 0) + count
        self.size += count
        self.verified += (drafted + 1) * count
        if drafted > self.deepest:
            self.deepest = drafted

    def by_class(self) -> dict[str, dict[tuple[int, int], int]]:
        """Outcomes per class, phases merged."""
        out: dict[str, dict[tuple[int, int], int]] = {}
        for (cls, _phase), outcomes in self.outcomes.items():
            merged = out.get(cls)
            if merged is None:
                out[cls] = dict(outcomes)
                continue
            for pair, m in outcomes.items():
                merged[pair] = merged.get(pair, 0) + m
        return out

