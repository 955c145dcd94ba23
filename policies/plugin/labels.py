"""Request labels: what a request tells the plugin through vLLM's ``SamplingParams.extra_args``, and how the plugin
turns them into a bounded (class, phase) and the controller's `RequestView` (`RequestLabeler`).

Keys a client may set per request (``vllm serve`` takes them as ``vllm_xargs``):

- ``peagle_class`` (`CLASS_KEY`): the class the request asks for. Under an operator policy (what ``peagle-tune
  serve`` runs) it is a request, not a fact: `policies.RequestPolicy.resolve` takes it only if clients may request
  that class and it does not raise the request's cap; an unknown label leaves the request in its assigned class.
  Without a policy (peagle-tune's own measuring harness, which labels its requests itself) the label is the class.
- ``peagle_phase`` (`PHASE_KEY`): a label that keeps the statistics of measured phases apart, e.g. "warmup" or "c4"
  (`DEFAULT_PHASE` without it).
- ``peagle_speculate`` (`SPECULATE_KEY`): false opts the request out of speculation (depth 0 in every mode).
- ``peagle_max_k`` (`MAX_K_KEY`): the request's own depth cap; it only ever lowers the depth.

One key only the operator's API-server middleware sets (`autotune.serving.PeagleClassMiddleware`):

- ``peagle_route`` (`ROUTE_KEY`): ``"<class>|<mac>"``, the class the operator's policy gave the request (served model
  name, prompt), authenticated by an HMAC-SHA256 under the per-launch key in ``PEAGLE_LABEL_KEY`` (`LABEL_KEY_ENV`,
  `route_stamp`). The engine sees token ids, not the model name or the prompt, so this is how the operator's
  assignment reaches it. A missing, forged or unverifiable stamp leaves the request in the policy's default class;
  the middleware drops any stamp a client sent. (Anyone who can read the key, or a stamp in a request log, can
  claim that stamp's class, i.e. what choosing that served model name gives anyway.)

Bounds, so nothing a client sends grows the engine's state: a label is a string of 1..`MAX_LABEL_CHARS` printable
characters (anything else counts as no label); at most `MAX_CLASSES` class labels and `MAX_PHASES` phase labels are
kept apart per engine, and later new ones fold into `OTHER_LABEL` (`LabelBook`). Under a policy the class is one of
its `known_classes` anyway.

vLLM's OpenAI server validates ``vllm_xargs`` values as str/int/float, so a JSON ``false`` reaches the engine as
``0``; `normalize_extra_args` turns such values back into booleans before anything reads them.

Example::

    >>> request_label({"peagle_class": "code"}), request_label({"peagle_class": "x" * 500})
    (('code', 'default'), ('default', 'default'))
    >>> normalize_extra_args({"peagle_speculate": 0}), opted_out({"peagle_speculate": "false"})
    ({'peagle_speculate': False}, True)
    >>> book = LabelBook(2)
    >>> [book.admit(x) for x in ("a", "b", "c", "a")]
    ['a', 'b', 'other', 'a']
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from policies import (
    CLASS_KEY,
    MAX_CLASSES,
    MAX_K_KEY,
    SPECULATE_KEY,
    RequestPolicy,
    RequestView,
    client_depth_cap,
)

__all__ = [
    "CLASS_KEY",
    "DEFAULT_CLASS",
    "DEFAULT_PHASE",
    "LABEL_KEY_ENV",
    "MAX_CLASSES",
    "MAX_K_KEY",
    "MAX_LABEL_CHARS",
    "MAX_PHASES",
    "OTHER_LABEL",
    "PHASE_KEY",
    "ROUTE_KEY",
    "SPECULATE_KEY",
    "LabelBook",
    "Labeled",
    "RequestLabeler",
    "normalize_extra_args",
    "opted_out",
    "request_label",
    "route_stamp",
    "stamped_class",
    "valid_label",
]

PHASE_KEY = "peagle_phase"
"""``extra_args`` key of a request's measurement phase."""
ROUTE_KEY = "peagle_route"
"""``extra_args`` key of the middleware's authenticated class stamp (see the module docstring)."""
LABEL_KEY_ENV = "PEAGLE_LABEL_KEY"
"""Environment variable with the per-launch secret that authenticates ``peagle_route`` stamps; ``peagle-tune serve``
sets a fresh random one for each server (the API server and the engine core inherit it)."""
DEFAULT_CLASS = "default"
"""Class label of a request that names none (in the plugin's statistics without a policy, and in workload files)."""
DEFAULT_PHASE = "default"
"""Phase label of a request that names none."""
OTHER_LABEL = "other"
"""Where labels beyond the tracked ones go (`LabelBook`)."""
MAX_LABEL_CHARS = 64
"""Longest class or phase label taken from a request; a longer one counts as no label."""
MAX_PHASES = 32
"""Distinct phase labels the plugin keeps apart per engine (profiling uses one per concurrency level plus warmup)."""

_MAC_HEX = 32  # 128 bits of HMAC-SHA256
_MAX_STAMP_CHARS = 512
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})
_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})


def valid_label(value: Any) -> TypeGuard[str]:
    """A usable class/phase label: a string of 1..`MAX_LABEL_CHARS` printable characters (no control characters,
    no newlines).

    Example: ``valid_label("c4")`` -> True; ``valid_label("a\\nb")``, ``valid_label(3)`` -> False.
    """
    return isinstance(value, str) and 0 < len(value) <= MAX_LABEL_CHARS and value.isprintable()


def request_label(extra: Mapping[str, Any] | None) -> tuple[str, str]:
    """(class, phase) as the request names them in ``extra_args``; a missing or invalid (`valid_label`) value gives
    the default. Unbounded on its own: the plugin passes labels through `RequestLabeler`."""
    cls, phase = DEFAULT_CLASS, DEFAULT_PHASE
    if extra:
        value = extra.get(CLASS_KEY)
        if valid_label(value):
            cls = value
        value = extra.get(PHASE_KEY)
        if valid_label(value):
            phase = value
    return cls, phase


def normalize_extra_args(extra: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``extra_args`` with ``peagle_speculate`` as a bool when it arrived as a number or a word.

    0/1 and true/false/yes/no/on/off (any case) become booleans; anything else is left for `RequestPolicy.speculate`
    to reject. Returns ``extra`` itself when nothing changes.

    Example: ``normalize_extra_args({"peagle_speculate": 0})`` -> ``{"peagle_speculate": False}``.
    """
    if not extra or SPECULATE_KEY not in extra:
        return extra or {}
    value = extra[SPECULATE_KEY]
    if isinstance(value, bool):
        return extra
    flag: bool | None = None
    if isinstance(value, int | float) and value in (0, 1):
        flag = bool(value)
    elif isinstance(value, str) and value.strip().lower() in _FALSE_WORDS | _TRUE_WORDS:
        flag = value.strip().lower() in _TRUE_WORDS
    if flag is None:
        return extra
    return {**extra, SPECULATE_KEY: flag}


def opted_out(extra: Mapping[str, Any] | None) -> bool:
    """True when ``extra_args`` opt the request out of speculation (``peagle_speculate`` false, 0 or "false")."""
    return normalize_extra_args(extra).get(SPECULATE_KEY, True) is False


# ---- the middleware's stamp ----------------------------------------------------------------------------------------
def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


def _mac(cls: str, key: bytes) -> str:
    return hmac.new(key, cls.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:_MAC_HEX]


def route_stamp(cls: str, key: str | bytes) -> str:
    """The ``peagle_route`` value that tells the engine the operator put the request in ``cls``.

    Example: ``route_stamp("code", "k")`` -> ``"code|<32 hex digits>"``; `stamped_class` verifies it.
    """
    return f"{cls}|{_mac(cls, _key_bytes(key))}"


def stamped_class(extra: Mapping[str, Any] | None, key: str | bytes | None) -> str | None:
    """The class in ``extra_args["peagle_route"]`` if its stamp verifies under ``key`` (None: no key, no stamp, or a
    stamp that does not verify). Constant-time comparison."""
    if not key or not extra:
        return None
    value = extra.get(ROUTE_KEY)
    if not isinstance(value, str) or len(value) > _MAX_STAMP_CHARS or "|" not in value:
        return None
    cls, mac = value.rsplit("|", 1)
    if not cls or not hmac.compare_digest(mac.encode("ascii", "replace"), _mac(cls, _key_bytes(key)).encode()):
        return None
    return cls


# ---- bounded labels ------------------------------------------------------------------------------------------------
class LabelBook:
    """Keeps at most ``limit`` distinct labels apart: a new label beyond them is answered with `OTHER_LABEL`.

    Labels already admitted stay themselves, so the first ``limit`` labels (e.g. the classes a workload really has)
    are never folded by a later flood. ``fixed``: labels admitted up front (they count towards the limit).
    """

    def __init__(self, limit: int, fixed: Iterable[str] = ()) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, but got {limit}.")
        self.limit = limit
        self._seen: set[str] = set()
        self.folded = 0
        """How many times a label was answered with `OTHER_LABEL` (for the stats info)."""
        for label in fixed:
            self.admit(label)

    def admit(self, label: str) -> str:
        """``label`` if it is known or there is room for it, else `OTHER_LABEL`. O(1)."""
        seen = self._seen
        if label in seen:
            return label
        if len(seen) >= self.limit:
            self.folded += 1
            return OTHER_LABEL
        seen.add(label)
        return label

    def __len__(self) -> int:
        return len(self._seen)


@dataclass(frozen=True, slots=True)
class Labeled:
    """A request as the plugin keeps it: the controller's view (class, cap, floor, opt-out) and its phase."""

    view: RequestView
    phase: str

    @property
    def cls(self) -> str:
        return self.view.cls

    def bound(self, depth: int) -> int:
        """``depth`` as this request may verify it: 0 when it opted out, else at most its cap."""
        view = self.view
        if not view.speculate:
            return 0
        return depth if view.max_k is None else min(depth, view.max_k)


class RequestLabeler:
    """Turns each request's ``extra_args`` into a bounded `Labeled` (what the scheduler plugin keeps per request).

    ``policy``: the operator's `RequestPolicy` (serve). With it, the class is `RequestPolicy.view` of the labels,
    starting from the middleware's verified stamp (`stamped_class` under ``route_key``) or the policy's default class;
    without it (the measuring harness), the class is the request's own label. Either way the phase, and without a
    policy the class, pass through a `LabelBook`. A request whose ``peagle_speculate`` / ``peagle_max_k`` cannot be
    read loses its own labels (it stays in its assigned class, speculating), counted in ``rejected``.

    Example: a policy whose default class is capped at 1; a client asks for "code" (capped at 8)::

        >>> from policies import ClassPolicy
        >>> policy = RequestPolicy(static_k=1, max_k=8, default_class="chat",
        ...                        classes={"chat": ClassPolicy(max_k=1), "code": ClassPolicy(max_k=8)})
        >>> RequestLabeler(policy).label("r1", {"peagle_class": "code", "peagle_phase": "p"})
        Labeled(view=RequestView(request_id='r1', cls='chat', max_k=1, min_k=0, speculate=True), phase='p')
        >>> stamp = route_stamp("code", "secret")  # what the middleware adds for a served model mapped to "code"
        >>> RequestLabeler(policy, route_key="secret").label("r2", {"peagle_route": stamp}).view.max_k
        8
    """

    def __init__(
        self,
        policy: RequestPolicy | None = None,
        *,
        route_key: str | bytes | None = None,
        max_classes: int = MAX_CLASSES,
        max_phases: int = MAX_PHASES,
    ) -> None:
        self.policy = policy
        self._route_key = route_key or None
        self._classes = LabelBook(max_classes, (DEFAULT_CLASS,))
        self._phases = LabelBook(max_phases, (DEFAULT_PHASE,))
        self.rejected = 0
        """Requests whose own labels were dropped because a value could not be read."""
        self.last_rejection: str | None = None

    @classmethod
    def from_env(cls, policy: RequestPolicy | None, environ: Mapping[str, str] | None = None) -> RequestLabeler:
        """A labeler that verifies stamps with the key in ``PEAGLE_LABEL_KEY`` (none: no stamp verifies)."""
        env = os.environ if environ is None else environ
        return cls(policy, route_key=env.get(LABEL_KEY_ENV) or None)

    @property
    def folded(self) -> dict[str, int]:
        """How many labels were folded into `OTHER_LABEL`, per kind."""
        return {"classes": self._classes.folded, "phases": self._phases.folded}

    def label(self, request_id: str, extra: Mapping[str, Any] | None) -> Labeled:
        """The request's `Labeled`; never raises on any value a client can send."""
        extra = normalize_extra_args(extra)
        phase = extra.get(PHASE_KEY)
        phase = self._phases.admit(phase) if valid_label(phase) else DEFAULT_PHASE
        policy = self.policy
        if policy is not None:
            assigned = self._assigned(policy, extra)
            try:
                view = policy.view(request_id, extra, assigned=assigned)
            except ValueError as exc:
                self._reject(exc)
                view = policy.view(request_id, None, assigned=assigned)
            return Labeled(view, phase)
        cls = extra.get(CLASS_KEY)
        cls = self._classes.admit(cls) if valid_label(cls) else DEFAULT_CLASS
        try:
            cap = client_depth_cap(extra)
        except ValueError as exc:
            self._reject(exc)
            cap = None
        return Labeled(RequestView(request_id, cls, max_k=cap, speculate=not opted_out(extra)), phase)

    def _assigned(self, policy: RequestPolicy, extra: Mapping[str, Any]) -> str | None:
        cls = stamped_class(extra, self._route_key)
        return cls if cls is not None and cls in policy.known_classes else None

    def _reject(self, exc: ValueError) -> None:
        self.rejected += 1
        self.last_rejection = str(exc)[:200]
