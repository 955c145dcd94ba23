"""The drafter-width protocol shared by the engine core and the workers: the names of the handshake and of the
attributes the scheduler sets on a `SchedulerOutput`, the settings the engine core sends (`DrafterWidthSettings`),
each worker's answer (`WorkerStatus`), and the per-request bookkeeping of skipped steps (`DrafterSync`). Pure Python:
no vLLM import. `policies.plugin.drafter_width` is the public module; it re-exports all of this.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from policies._off_steps import MAX_CATCH_UP_TOKENS, OFF_STEP_MODES, REPLAY_MODES

__all__ = [
    "COUNTERS_METHOD",
    "DRAFTER_WIDTH_STATES",
    "DRAFTING_ATTR",
    "FAULT_EXIT_CODE",
    "HANDSHAKE_METHOD",
    "PROTOCOL_VERSION",
    "SKIP_ATTR",
    "WORKER_EXTENSION_CLS",
    "DrafterSync",
    "DrafterWidthFault",
    "DrafterWidthSettings",
    "WorkerStatus",
    "drafting_slots",
    "fault_action",
    "fault_message",
    "logger",
]

WORKER_EXTENSION_CLS = "policies.plugin.drafter_width.DrafterWidthExtension"
"""What to pass as vLLM's ``worker_extension_cls`` (``LLM(worker_extension_cls=...)`` or
``vllm serve --worker-extension-cls``)."""
HANDSHAKE_METHOD = "peagle_drafter_width_handshake"
"""``collective_rpc`` method that installs the patch in a worker and returns its `WorkerStatus` as a dict."""
COUNTERS_METHOD = "peagle_drafter_width_counters"
"""``collective_rpc`` method returning a worker's counters (lowered / skipped / caught-up steps, faults)."""
SKIP_ATTR = "peagle_skip_drafter"
"""Attribute the scheduler sets on a `SchedulerOutput` (pickled to the workers with it) to skip the drafter."""
DRAFTING_ATTR = "peagle_drafting_reqs"
"""Attribute the scheduler sets on a `SchedulerOutput` when only some requests are planned above depth 0: the ids of
those that are. Only they replay their missed tokens in this step's drafter pass; the others keep their holes until
they draft (their drafts this step are not verified)."""
PROTOCOL_VERSION = 1
DRAFTER_WIDTH_STATES: tuple[str, ...] = (
    "active", "disabled", "no_speculation", "v2_runner", "unsupported", "install_failed", "fell_back",
)
"""Whether drafter-width control is in effect, and if not which fallback and why (bounded: a metric label value and
``info["drafter_width"]["state"]`` of the plugin's stats). ``active``: every worker drafts only the planned width
(lowering; off-steps skip the drafter where the drafter allows it). Otherwise depth is applied by trimming the
verified drafts: ``disabled`` (``drafter_width.enabled: false`` in the plugin config), ``no_speculation`` (K = 0),
``v2_runner`` (vLLM's V2 model runner, which this patch does not know: start the engine with
``VLLM_USE_V2_MODEL_RUNNER=0``, as `policies.plugin.config.engine_env` does), ``unsupported`` (a worker's drafter or
runner is not one the patch handles), ``install_failed`` (no worker extension, no executor reachable, or the
handshake failed in a worker), ``fell_back`` (the workers stopped drafting the planned width while serving)."""
_FAULTS: tuple[str, ...] = ("propose", "skip", "handshake")

logger = logging.getLogger("vllm.peagle_drafter_width")


class DrafterWidthFault(RuntimeError):
    """Raised on purpose by the ``fault`` test hook of `DrafterWidthSettings`."""


@dataclass(frozen=True)
class DrafterWidthSettings:
    """What the engine core asks of the workers in the handshake (sent as a dict)."""

    off_steps: str = "catch_up"
    """How a step whose planned depth is 0 for every request treats the drafter: ``catch_up`` skips it and replays
    the missed tokens when the request drafts again (token-only drafters, synchronous scheduling; otherwise
    ``sync_pass``), ``sync_pass`` runs it over one slot to keep its KV cache, ``holes`` skips without replay."""
    skip_sampler: bool = True
    """Use the plain sampler on steps that verify no draft (the rejection sampler would only sample bonus tokens),
    and build their spec-decode metadata by the short path (`zero_draft_metadata`)."""
    max_catch_up_tokens: int = MAX_CATCH_UP_TOKENS
    """Replay at most this many tokens per request; a longer gap stays unwritten (acceptance may drop, outputs
    never change)."""
    defer_idle_prompts: bool = True
    """Under ``catch_up``: in a drafting step, a request planned at depth 0 passes only the last token of its prompt
    to the drafter; the rest is replayed when it drafts (within ``max_catch_up_tokens``, else read now)."""
    prefix_cache_guard: bool = True
    """Under vLLM's prefix caching, leave prompts out of the drafter all the same, because the engine core keeps the
    blocks they fill out of the prefix cache (`policies.plugin.prefix_guard`; the scheduler sends True only when it
    runs the guard). False: under prefix caching the drafter reads every prompt (``catch_up_decode``)."""
    fault: str | None = None
    """Test hook: ``propose`` raises in the first lowered drafting call, ``skip`` in the first skipped step,
    ``handshake`` in the handshake itself."""

    def __post_init__(self) -> None:
        if self.off_steps not in OFF_STEP_MODES:
            raise ValueError(f"off_steps must be one of {OFF_STEP_MODES}, but got {self.off_steps!r}.")
        if self.fault is not None and self.fault not in _FAULTS:
            raise ValueError(f"fault must be None or one of {_FAULTS}, but got {self.fault!r}.")
        if isinstance(self.max_catch_up_tokens, bool) or not isinstance(self.max_catch_up_tokens, int) \
                or self.max_catch_up_tokens < 0:
            raise ValueError(f"max_catch_up_tokens must be an integer >= 0, but got {self.max_catch_up_tokens!r}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DrafterWidthSettings:
        data = dict(data or {})
        unknown = sorted(set(data) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise ValueError(f"unknown drafter-width settings {unknown}; known: {sorted(cls.__dataclass_fields__)}.")
        return cls(**data)


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer to the handshake."""

    installed: bool
    """The patch is live in this worker."""
    reason: str | None = None
    """Why not (or what was reduced), in a sentence."""
    rank: int = 0
    protocol: int = PROTOCOL_VERSION
    k_max: int = 0
    """The engine's configured K (``num_speculative_tokens``)."""
    method: str = ""
    parallel: bool = False
    lower_width: bool = False
    """0 < k < K drafts k slots (parallel drafting) or k passes (sequential, vLLM's own behaviour)."""
    off_steps: str = "sync_pass"
    """What a step with k = 0 does here: ``catch_up`` / ``holes`` skip the drafter, ``sync_pass`` runs one slot."""
    state: str = ""
    """One of `DRAFTER_WIDTH_STATES`: "active" when installed, else why not ("" from a worker of an older version:
    read as "unsupported")."""

    @property
    def skips_drafter(self) -> bool:
        return self.installed and self.off_steps in (*REPLAY_MODES, "holes")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerStatus:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


FAULT_EXIT_CODE = 70
"""Exit status of a worker that ends itself after a drafter-width fault under tensor parallelism (EX_SOFTWARE)."""


def fault_action(tensor_parallel_size: int) -> str:
    """What a worker does when its drafter-width patch raises: ``"fall_back"`` or ``"fail_engine"``.

    The width a rank drafts is a function of the `SchedulerOutput` alone (``num_spec_tokens_to_schedule``,
    `SKIP_ATTR`, `DRAFTING_ATTR`), which every rank receives identically, as long as no rank has fallen back. A
    fault is local: one rank's exception is not seen by the others, which are already inside this step's drafter
    forward at the planned width, whose tensor-parallel all-reduces then wait for the faulted rank forever (NCCL has
    no timeout there). A rank alone cannot make the others switch in the same step without a collective of its own,
    and the fault may have struck mid-forward, so with ``tensor_parallel_size > 1`` the engine fails instead.
    Raising is not enough: vLLM's multiprocess worker only reports an exception from the output rank (TP rank 0 of
    the last pipeline stage) and logs it on any other rank (`v1/executor/multiproc_executor.py` 1048-1067), so the
    engine core would wait ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s) for the stuck output rank. The faulted
    worker therefore ends its process (`FAULT_EXIT_CODE`), and the executor's monitor fails the engine at once
    (``monitor_workers``, same file 306-325). With one rank the fault falls back to vLLM's own widths.

    Example: ``fault_action(1) == "fall_back"``; ``fault_action(2) == "fail_engine"``.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size >= 1 must hold, but got {tensor_parallel_size=}.")
    return "fall_back" if tensor_parallel_size == 1 else "fail_engine"


def fault_message(where: str, exc: BaseException, tensor_parallel_size: int, rank: int) -> str:
    """The one line a worker logs before it ends the engine after a fault (`fault_action`)."""
    return (
        f"peagle drafter width: error in {where} on rank {rank} ({type(exc).__name__}: {exc}); with "
        f"tensor_parallel_size={tensor_parallel_size} the ranks cannot fall back together, so this worker exits "
        f"(status {FAULT_EXIT_CODE}) and the engine fails instead of hanging. Serve with drafter_width.enabled: "
        "false in the plugin config (depth is then applied by trimming) and report the error."
    )


def drafting_slots(k: int, k_max: int, parallel: bool) -> int:
    """Slots per request of the parallel drafter's single pass when k drafts are planned (K = `k_max`).

    k = 0 still needs one slot: a pass that only writes the drafter KV of the step's tokens (vLLM's own k = 0
    behaviour, minus K - 1 slots). A sequential drafter always uses one slot per pass.

    Example: ``drafting_slots(2, 4, True) == 2``; ``drafting_slots(0, 4, True) == 1``;
    ``drafting_slots(3, 4, False) == 1``.
    """
    if not 0 <= k <= k_max:
        raise ValueError(f"0 <= k <= k_max must hold, but got ({k=}, {k_max=}).")
    return max(k, 1) if parallel else 1


@dataclass
class DrafterSync:
    """Per request, the first position whose drafter KV a skipped step left unwritten (pure bookkeeping).

    A step that drafts for a request with query start q writes the drafter KV of positions q .. q+a (its accepted
    tokens) and q+a+1 (the bonus token, the next query's start). So after a drafting step the KV is complete up to
    and including the next query's first position; a skipped step with query start q leaves q+1 onwards unwritten.

    Example: drafting steps, then skips at query starts 40 and 41, then a drafting step at 43:
    ``mark_skipped("r", 40)``, ``mark_skipped("r", 41)`` -> ``take("r", 43) == 41`` (replay positions 41, 42).
    A request whose prompt step (query start 0) was skipped: ``mark_skipped("p", 0, fresh=True)`` -> the replay
    starts at 0 (the whole prompt).
    """

    holes: dict[str, int] = field(default_factory=dict)

    def mark_skipped(self, req_id: str, query_start: int, fresh: bool = False) -> None:
        """``fresh``: the request's first step (new, or resumed after preemption): no drafter pass wrote its query
        start either, so the hole starts there."""
        self.holes.setdefault(req_id, query_start if fresh else query_start + 1)

    def gap(self, req_id: str, query_start: int, fresh: bool, query_end: int) -> int:
        """Tokens a catch-up would replay for this request if this step (query ``query_start`` .. ``query_end``)
        skipped the drafter too."""
        return query_end - self.holes.get(req_id, query_start if fresh else query_start + 1)

    def take(self, req_id: str, query_start: int) -> int | None:
        """The first position to replay before `query_start`, or None (nothing missing); forgets the hole."""
        hole = self.holes.pop(req_id, None)
        if hole is None or hole >= query_start:
            return None  # nothing missing (or the request was recomputed from an earlier position)
        return hole

    def pending(self, req_id: str) -> bool:
        return req_id in self.holes

    def prune(self, live: Iterable[str]) -> None:
        keep = set(live)
        self.holes = {r: h for r, h in self.holes.items() if r in keep}
