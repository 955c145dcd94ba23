"""Worker-side drafter width: the parallel drafter drafts only the planned depth, and a step with depth 0 skips it.

vLLM 0.32 (V1 model runner, which P-EAGLE and PARD always use) reads ``SchedulerOutput.num_spec_tokens_to_schedule``
(k) before it calls ``drafter.propose(num_speculative_tokens=k)``. A sequential drafter stops after k passes; the
parallel drafter's input layout is fixed at start-up (``extra_slots_per_request = K`` in
``SpecDecodeBaseProposer.__init__``), so 0 < k < K mis-shapes its output (vLLM #45695) and k = 0 still runs a K-slot
forward pass. This module patches one model runner instance (never vLLM's classes) from inside the worker process:

- ``drafter.propose``: sets the slot layout to ``max(k, 1)`` slots for the call (one pass over ``max(k, 1)`` slots
  per request instead of K), then restores it; with ``off_steps="catch_up"`` it first prepends, per request, the
  tokens whose drafter KV a skipped step left unwritten (see "Off-steps" below).
- ``runner.propose_draft_token_ids``: on a step the scheduler marks with ``peagle_skip_drafter`` (k = 0; with
  prompt tokens only under ``catch_up`` and when every request's replay stays within ``max_catch_up_tokens``,
  re-checked here) it returns no drafts without running the drafter.
- ``runner._sample``: a step that verifies no draft at all uses vLLM's plain sampler instead of the rejection
  sampler (the same tokens: with no draft the rejection sampler only samples the bonus token).
- ``runner._calc_spec_decode_metadata``: for such a step, builds the same metadata without vLLM's general
  index arithmetic (`zero_draft_metadata`; 40 us a step on this CPU, the short path 15).

It is installed through vLLM's ``worker_extension_cls`` (`WORKER_EXTENSION_CLS`): the engine core calls
`HANDSHAKE_METHOD` with ``collective_rpc`` once, which installs the patch in every worker and returns what each
one supports (`WorkerStatus`). The scheduler lowers k below K only when every worker answered ``lower_width``; an
engine without the extension answers nothing and the scheduler only trims verification.

Off-steps. A drafter keeps its own KV cache. When step s skips the drafter, the drafter KV of the tokens that step
verified stays unwritten (the bonus token of step s-1 was written by step s-1 as its bonus slot; the accepted drafts
and everything after are not). ``catch_up`` records, per request, the first position left unwritten and, on the next
step that drafts for the request, feeds the drafter the tokens from there to the step's own query in the same single
pass (positions and slot mapping follow from the block table, so nothing else changes). A token-only drafter
(``draft_model``, i.e. PARD) can replay tokens; an EAGLE head needs the target's hidden states of those positions,
which are gone, so for EAGLE (and under async scheduling, where the worker's token copy lags) off-steps run a
one-slot "sync pass" instead of skipping. ``holes`` skips without catching up (kept for measurement).
Under ``catch_up`` a step with prompt tokens is skipped too: a request whose prompt the drafter never saw replays it
with its first drafting step (one pass over prompt and output so far), so a request that never drafts never pays
for its prompt in the drafter. In a drafting step only the requests planned above depth 0 replay (`DRAFTING_ATTR`):
an exploration, one request at its cap, would otherwise replay the whole batch's prompts and outputs (measured at
c=8: 55 ms for that step against 5.3 ms for an off-step). Likewise a request planned at depth 0 whose prompt is
computed in a drafting step (a new request joining a batch that drafts) passes only its last token to the drafter
(``defer_idle_prompts``): the rest of its prompt becomes a hole, replayed if the request ever drafts, so the drafter
does not read the prompts of requests whose drafts are trimmed away. vLLM's prefix caching caches a prompt's full
blocks, drafter KV included, for later requests with the same prefix, which would read drafter KV nobody wrote
(measured on the fixtures: a request reusing a skipped prompt's blocks drafted differently from one reading the
prompt, 14 drafts with accepted [11, 6, 5, 5] against 18 with [13, 5, 2, 1]; outputs never change). So under prefix
caching prompts are left out only when the engine core runs `policies.plugin.prefix_guard` (it keeps the blocks of
prompts left out of the cache, and names shared prompts for the drafter to read, in `DRAFTING_ATTR`, even in a pass
at width 0); otherwise (``prefix_cache_guard`` false, ``catch_up_decode`` in `policies._off_steps`) the drafter reads
every prompt. Blocks of generated tokens a skipped decode step left unwritten can still be cached; only a later
request repeating that prompt and output exactly (a next chat turn) reuses them.

Failure: any exception inside the patched paths (or the ``fault`` test hook) is logged once, the patch turns itself
off in that worker and the step is re-run through vLLM's own code at depth K (0 < k < K would break vLLM) or k (0 or
K); the scheduler sees K drafts instead of k and goes back to trimming. No request fails. With tensor parallelism a
fault must hit every rank alike (a deterministic bug does); a fault on one rank only would desynchronise the ranks'
drafter shapes.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from policies._off_steps import MAX_CATCH_UP_TOKENS, OFF_STEP_MODES, REPLAY_MODES, off_step_mode

__all__ = [
    "DRAFTER_WIDTH_STATES",
    "HANDSHAKE_METHOD",
    "COUNTERS_METHOD",
    "OFF_STEP_MODES",
    "DRAFTING_ATTR",
    "SKIP_ATTR",
    "WORKER_EXTENSION_CLS",
    "DrafterSync",
    "DrafterWidthExtension",
    "DrafterWidthFault",
    "DrafterWidthSettings",
    "WorkerStatus",
    "drafting_slots",
    "install",
    "zero_draft_metadata",
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
#: Module prefixes of vLLM 0.32's V2 model runners (vllm/v1/worker/gpu/, and its CPU subclass in vllm/v1/worker/cpu/).
_V2_RUNNER_MODULES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")
_FAULTS: tuple[str, ...] = ("propose", "skip", "handshake")
_METHODS_WITH_SLOTS = ("DraftModelProposer", "EagleProposer")

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


# --------------------------------------------------------------------------------------------- the patch
class _Patch:
    """The patched methods of one model runner instance, with their state and counters."""

    def __init__(self, runner: Any, settings: DrafterWidthSettings, status: WorkerStatus) -> None:
        self.runner = runner
        self.drafter = runner.drafter
        self.settings = settings
        self.status = status
        self.k_max = status.k_max
        self.parallel = status.parallel
        self.disabled = False
        self.sync = DrafterSync()
        self.catch_up = status.off_steps in REPLAY_MODES
        self.prompts_left = status.off_steps == "catch_up"  # prompts may be left to a replay (no prefix caching)
        self.skip = status.skips_drafter
        self._fault_pending = settings.fault
        d = self.drafter
        self._slots_k = (d.extra_slots_per_request, d.net_num_new_slots_per_request, d.needs_extra_input_slots)
        self._shift = d.extra_slots_per_request - d.net_num_new_slots_per_request  # 1 for EAGLE (hidden states)
        self.counters: dict[str, int] = {
            "drafting_steps": 0, "lowered_steps": 0, "skipped_steps": 0, "skipped_prompt_steps": 0,
            "sync_pass_steps": 0,
            "plain_sampler_steps": 0, "zero_draft_metadata_steps": 0, "caught_up_requests": 0, "caught_up_tokens": 0,
            "deferred_holes": 0, "deferred_prompts": 0, "deferred_prompt_tokens": 0,
            "abandoned_holes": 0,
            "faults": 0,
        }
        self._decode_step = False
        self._drafting_reqs: frozenset[str] | None = None  # requests planned above depth 0 (None: all)
        self._defer = self.prompts_left and settings.defer_idle_prompts
        self.drafter_ms: dict[int, list[float]] = {}
        self.max_timings = 4096
        self.orig_propose_ids = runner.propose_draft_token_ids
        self.orig_sample = runner._sample
        self.orig_drafter_propose = d.propose
        self.orig_metadata = getattr(runner, "_calc_spec_decode_metadata", None)
        runner.propose_draft_token_ids = self.propose_draft_token_ids
        runner._sample = self.sample
        if self.orig_metadata is not None:
            runner._calc_spec_decode_metadata = self.spec_decode_metadata
        d.propose = self.drafter_propose

    # ------------------------------------------------------------------------------------------ failure
    def _fail(self, where: str, exc: BaseException) -> None:
        self.counters["faults"] += 1
        if not self.disabled:
            self.disabled = True
            self.skip = False
            logger.error(
                "peagle drafter width: disabled after an error in %s (%s: %s); this worker drafts at vLLM's "
                "widths from now on (K when 0 < k < K) and the scheduler trims.\n%s",
                where, type(exc).__name__, exc, traceback.format_exc(),
            )

    def _maybe_fault(self, where: str) -> None:
        if self._fault_pending == where:
            self._fault_pending = None
            raise DrafterWidthFault(f"fault={where!r} test hook")

    def _timing(self, k: int, t0: float) -> None:
        """Wall time of one drafter call at width k on a decode-only step (ms). On a GPU this is launch time
        unless the drafter synchronises; on CPU it is the drafter's compute."""
        if not self._decode_step:
            return
        entry = self.drafter_ms.setdefault(k, [])
        entry.append((time.perf_counter() - t0) * 1000.0)
        if len(entry) > self.max_timings:
            del entry[: len(entry) - self.max_timings]

    def _clamp(self, k: int) -> int:
        """The k vLLM's own proposer can take: 0 < k < K breaks parallel drafting, so draft K then."""
        return self.k_max if self.parallel and 0 < k < self.k_max else k

    def _set_slots(self, k: int) -> None:
        if not self.parallel:
            return
        d = self.drafter
        slots = drafting_slots(k, self.k_max, True)
        d.extra_slots_per_request = slots
        d.net_num_new_slots_per_request = slots - self._shift
        d.needs_extra_input_slots = d.net_num_new_slots_per_request > 0

    def _restore_slots(self) -> None:
        d = self.drafter
        d.extra_slots_per_request, d.net_num_new_slots_per_request, d.needs_extra_input_slots = self._slots_k

    # ----------------------------------------------------------------------------------- runner methods
    def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        self._decode_step = _decode_only(scheduler_output)
        self._drafting_reqs = getattr(scheduler_output, DRAFTING_ATTR, None)
        if self.skip and not self.disabled and getattr(scheduler_output, SKIP_ATTR, False):
            try:
                if int(scheduler_output.num_spec_tokens_to_schedule) == 0:
                    fresh = _fresh_requests(scheduler_output)
                    if self._decode_step or self._prompts_replayable(scheduler_output, fresh):
                        self._maybe_fault("skip")
                        if not self._decode_step:
                            self.counters["skipped_prompt_steps"] += 1
                        return self._skip_drafter(sampled_token_ids, fresh)
            except Exception as exc:
                self._fail("skipping the drafter", exc)
        return self.orig_propose_ids(scheduler_output, sampled_token_ids, *args, **kwargs)

    def _prompts_replayable(self, scheduler_output: Any, fresh: frozenset[str]) -> bool:
        """A step with prompt tokens may skip the drafter only when catching up and every request's gap (its
        prompt so far included) stays within ``max_catch_up_tokens``; otherwise the drafter runs (a hole the
        catch-up abandons would cost the request its acceptance)."""
        if not self.prompts_left:
            return False
        batch = self.runner.input_batch
        computed = batch.num_computed_tokens_cpu
        scheduled = scheduler_output.num_scheduled_tokens
        cap = self.settings.max_catch_up_tokens
        gap = self.sync.gap
        for i, req_id in enumerate(batch.req_ids[: batch.num_reqs]):
            q = int(computed[i])
            if gap(req_id, q, req_id in fresh, q + int(scheduled.get(req_id, 1))) > cap:
                return False
        return True

    def _skip_drafter(self, sampled_token_ids: Any, fresh: frozenset[str] = frozenset()) -> Any:
        import torch

        runner = self.runner
        batch = runner.input_batch
        n = batch.num_reqs
        computed = batch.num_computed_tokens_cpu
        holes = self.sync.holes
        for i, req_id in enumerate(batch.req_ids[:n]):
            if req_id not in holes:  # a later skipped step leaves the hole where it starts (`mark_skipped`)
                self.sync.mark_skipped(req_id, int(computed[i]), req_id in fresh)
        self.counters["skipped_steps"] += 1
        if getattr(runner, "valid_sampled_token_count_event", None) is None:
            # Synchronous: no drafts as lists (as vLLM's n-gram proposer returns them), so the runner skips its
            # device-to-host copy of the drafts and its event; a fetch still reads them.
            return [[] for _ in range(n)]
        # Async scheduling reads the next input tokens from here, drafter or not (vLLM does the same when the input
        # does not fit the drafter), and the runner's draft tensor.
        next_ids, counts = self.drafter.prepare_next_token_ids_padded(
            sampled_token_ids, runner.requests, batch, runner.discard_request_mask.gpu
        )
        runner._copy_valid_sampled_token_count(next_ids, counts)
        return torch.empty((n, 0), dtype=torch.int64, device=runner.device)

    def sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        if (
            not self.disabled
            and self.settings.skip_sampler
            and spec_decode_metadata is not None
            and spec_decode_metadata.max_spec_len == 0
        ):
            try:
                runner = self.runner
                runner.input_batch.update_async_output_token_ids()
                out = runner.sampler(logits=logits, sampling_metadata=runner.input_batch.sampling_metadata)
                self.counters["plain_sampler_steps"] += 1
                return out
            except Exception as exc:
                self._fail("sampling without the rejection sampler", exc)
        return self.orig_sample(logits, spec_decode_metadata)

    def spec_decode_metadata(self, num_draft_tokens: Any, cu_num_scheduled_tokens: Any) -> Any:
        assert self.orig_metadata is not None
        if not self.disabled and self.settings.skip_sampler and len(num_draft_tokens) and not num_draft_tokens.any():
            try:
                out = zero_draft_metadata(self.runner, num_draft_tokens, cu_num_scheduled_tokens)
                self.counters["zero_draft_metadata_steps"] += 1
                return out
            except Exception as exc:
                self._fail("building the metadata of a step without drafts", exc)
        return self.orig_metadata(num_draft_tokens, cu_num_scheduled_tokens)

    # --------------------------------------------------------------------------------- drafter.propose
    def drafter_propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: Any,
        target_positions: Any,
        target_hidden_states: Any,
        next_token_ids: Any,
        token_indices_to_sample: Any,
        common_attn_metadata: Any,
        sampling_metadata: Any,
        mm_embed_inputs: Any = None,
        num_rejected_tokens_gpu: Any = None,
        slot_mappings: Any = None,
    ) -> Any:
        k = int(num_speculative_tokens)
        rest = (next_token_ids, token_indices_to_sample)
        tail = {"mm_embed_inputs": mm_embed_inputs, "num_rejected_tokens_gpu": num_rejected_tokens_gpu,
                "slot_mappings": slot_mappings}
        if self.disabled:
            return self.orig_drafter_propose(
                self._clamp(k), target_token_ids, target_positions, target_hidden_states, *rest,
                common_attn_metadata, sampling_metadata, **tail,
            )
        try:
            if 0 < k < self.k_max:
                self._maybe_fault("propose")
            ids, positions, cad = target_token_ids, target_positions, common_attn_metadata
            if self.sync.holes or (self._defer and not self._decode_step
                                   and (k == 0 or self._drafting_reqs is not None)):
                ids, positions, cad = self._replay_holes(ids, positions, cad, k)
            self._set_slots(k)
            t0 = time.perf_counter()
            out = self.orig_drafter_propose(
                k, ids, positions, target_hidden_states, *rest, cad, sampling_metadata, **tail
            )
            self._timing(k, t0)
            self.counters["drafting_steps"] += 1
            if self.parallel and 0 < k < self.k_max:
                self.counters["lowered_steps"] += 1
            if k == 0:
                self.counters["sync_pass_steps"] += 1
            return out
        except Exception as exc:
            self._restore_slots()
            self._fail("drafter.propose", exc)
            return self.orig_drafter_propose(
                self._clamp(k), target_token_ids, target_positions, target_hidden_states, *rest,
                common_attn_metadata, sampling_metadata, **tail,
            )
        finally:
            self._restore_slots()

    def _replay_holes(self, ids: Any, positions: Any, cad: Any, k: int) -> tuple[Any, Any, Any]:
        """Prepend to each drafting request's drafter query the tokens a skipped step left without drafter KV, and
        cut the prompt of each request planned at depth 0 to its last token (`_deferred_prompt`)."""
        import numpy as np
        import torch

        runner = self.runner
        batch = runner.input_batch
        n = batch.num_reqs
        computed = batch.num_computed_tokens_cpu
        qsl = cad.query_start_loc_cpu
        extra = np.zeros(n, dtype=np.int64)
        replay: dict[int, tuple[int, Any]] = {}
        cut: set[int] = set()
        # A pass at width 0 (a step with prompt tokens the drafter must read) drafts nothing that is verified: nobody
        # replays in it but the requests the scheduler names (prompts the prefix-cache guard wants read, with any
        # earlier chunk they left out: a cached block needs its drafter KV computed from a complete context).
        drafting = (self._drafting_reqs or frozenset()) if k == 0 else self._drafting_reqs
        deferring = drafting if self._defer and not self._decode_step else None  # requests outside it may defer
        for i, req_id in enumerate(batch.req_ids[:n]):
            if deferring is not None and req_id not in deferring \
                    and self._deferred_prompt(i, req_id, int(qsl[i + 1] - qsl[i])):
                cut.add(i)
                extra[i] = 1 - int(qsl[i + 1] - qsl[i])
                continue
            if not self.sync.pending(req_id):
                continue
            if drafting is not None and req_id not in drafting:
                # Planned at depth 0: its drafts are not verified; it keeps its hole (the replay runs when it
                # drafts), so an exploration or one deep class does not replay every request's history.
                self.counters["deferred_holes"] += 1
                continue
            q = int(computed[i])
            hole = self.sync.take(req_id, q)
            if hole is None:
                continue
            if not self.catch_up or q - hole > self.settings.max_catch_up_tokens:
                self.counters["abandoned_holes"] += 1
                continue
            replay[i] = (hole, batch.token_ids_cpu[i, hole:q])
            extra[i] = q - hole
        if len(self.sync.holes) > 4 * max(n, 1) + 64:
            self.sync.prune(runner.requests)
        if not replay and not cut:
            return ids, positions, cad
        slots = drafting_slots(k, self.k_max, self.parallel)
        if replay and int(cad.num_actual_tokens) + int(extra.sum()) + n * slots > int(self.drafter.max_num_tokens):
            self.counters["abandoned_holes"] += len(replay)
            for i in replay:
                extra[i] = 0
            replay = {}
            if not cut:
                return ids, positions, cad
        device = ids.device
        id_parts: list[Any] = []
        pos_parts: list[Any] = []
        for i in range(n):
            a, b = int(qsl[i]), int(qsl[i + 1])
            if i in cut:
                a = b - 1
            elif i in replay:
                hole, tokens = replay[i]
                id_parts.append(torch.as_tensor(np.asarray(tokens), dtype=ids.dtype).to(device))
                pos_parts.append(torch.arange(hole, hole + len(tokens), dtype=positions.dtype, device=device))
            id_parts.append(ids[a:b])
            pos_parts.append(positions[a:b])
        shift = torch.from_numpy(np.concatenate(([0], np.cumsum(extra)))).to(qsl.dtype)
        new_qsl_cpu = qsl + shift
        lens = new_qsl_cpu[1:] - new_qsl_cpu[:-1]
        new_cad = cad.replace(
            query_start_loc=new_qsl_cpu.to(cad.query_start_loc.device),
            query_start_loc_cpu=new_qsl_cpu,
            num_actual_tokens=int(new_qsl_cpu[-1]),
            max_query_len=int(lens.max()),
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
        )
        if replay:
            self.counters["caught_up_requests"] += len(replay)
            self.counters["caught_up_tokens"] += int(sum(extra[i] for i in replay))
        return torch.cat(id_parts), torch.cat(pos_parts), new_cad

    def _deferred_prompt(self, i: int, req_id: str, query_len: int) -> bool:
        """Whether request row `i` (planned at depth 0 in this drafting step) leaves all but the last token of its
        query out of the drafter's pass: only when the query computes prompt tokens and the request's replay, should
        it draft later, stays within ``max_catch_up_tokens``. Records the hole from the query's start (from 0 for a
        request recomputed after preemption)."""
        batch = self.runner.input_batch
        q = int(batch.num_computed_tokens_cpu[i])
        if query_len <= 1 or q >= int(batch.num_prompt_tokens[i]):
            return False
        holes = self.sync.holes
        hole = min(holes.get(req_id, q), q)
        if q + query_len - hole > self.settings.max_catch_up_tokens:
            return False
        holes[req_id] = hole
        self.counters["deferred_prompts"] += 1
        self.counters["deferred_prompt_tokens"] += query_len - 1
        return True


def zero_draft_metadata(runner: Any, num_draft_tokens: Any, cu_num_scheduled_tokens: Any) -> Any:
    """vLLM's ``SpecDecodeMetadata`` for a step in which no request verifies a draft, equal field by field (values,
    dtypes, device) to what ``GPUModelRunner._calc_spec_decode_metadata`` builds: each request samples one token, at
    its last scheduled position. A speculative engine builds this metadata in every step, with or without drafts
    (vLLM 0.32); the general path costs ~40 us on this 2-core CPU (numpy index arithmetic and five host-to-device
    copies), this one about a third of that."""
    torch, to_device, metadata_cls = _vllm_parts()
    n = len(num_draft_tokens)
    device = runner.device
    int32 = torch.int32  # vLLM's cumulative sums are np.int32
    return metadata_cls(
        draft_token_ids=runner.input_ids.gpu[:0],
        num_draft_tokens=num_draft_tokens.tolist(),
        cu_num_draft_tokens=torch.zeros(n, dtype=int32, device=device),
        cu_num_sampled_tokens=torch.arange(1, n + 1, dtype=int32, device=device),
        target_logits_indices=torch.empty(0, dtype=int32, device=device),
        bonus_logits_indices=torch.arange(n, dtype=int32, device=device),
        # one sampled token per request, in vLLM's dtype (that of ``cu_num_scheduled_tokens - num_draft_tokens``)
        logits_indices=to_device(cu_num_scheduled_tokens - num_draft_tokens - 1, device=device),
    )


_VLLM_PARTS: tuple[Any, Any, Any] | None = None


def _vllm_parts() -> tuple[Any, Any, Any]:
    """torch, vLLM's ``async_tensor_h2d`` and ``SpecDecodeMetadata``, imported once (in the worker, lazily)."""
    global _VLLM_PARTS
    if _VLLM_PARTS is None:
        import torch
        from vllm.utils.torch_utils import async_tensor_h2d
        from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

        _VLLM_PARTS = (torch, async_tensor_h2d, SpecDecodeMetadata)
    return _VLLM_PARTS


def _decode_only(scheduler_output: Any) -> bool:
    """True when no request in the step computes a prompt token: only then may the drafter be skipped (a prompt
    chunk must write the drafter KV of the prompt and produce the request's first drafts)."""
    if scheduler_output.scheduled_new_reqs:
        return False
    spec = scheduler_output.scheduled_spec_decode_tokens
    scheduled = scheduler_output.num_scheduled_tokens
    if not spec:  # one token per request (every request schedules at least one): O(1), the off-step case
        return scheduler_output.total_num_scheduled_tokens == len(scheduled)
    return all(n == 1 + len(spec.get(r, ())) for r, n in scheduled.items())


def _fresh_requests(scheduler_output: Any) -> frozenset[str]:
    """Requests in their first step since (re)starting: new, or resumed after preemption (recomputed from scratch).
    No drafter pass has written any of their positions."""
    new = scheduler_output.scheduled_new_reqs
    resumed = getattr(scheduler_output.scheduled_cached_reqs, "resumed_req_ids", None) or ()
    if not new and not resumed:
        return frozenset()
    return frozenset([r.req_id for r in new] + list(resumed))


def _status(runner: Any, settings: DrafterWidthSettings, rank: int) -> WorkerStatus:
    """What this worker's runner supports, before anything is patched."""
    config = getattr(runner, "speculative_config", None)
    if config is None:
        return WorkerStatus(False, "no speculative decoding configured", rank, state="no_speculation")
    k_max = int(config.num_speculative_tokens or 0)
    method = str(getattr(config, "method", ""))
    parallel = bool(getattr(config, "parallel_drafting", False))

    def refuse(reason: str, state: str = "unsupported") -> WorkerStatus:
        return WorkerStatus(False, reason, rank, k_max=k_max, method=method, parallel=parallel, state=state)

    if type(runner).__module__.startswith(_V2_RUNNER_MODULES):
        return refuse(f"vLLM's V2 model runner ({type(runner).__module__}) drafts in its own speculator, which this "
                      "patch does not handle; start the engine with VLLM_USE_V2_MODEL_RUNNER=0", "v2_runner")
    drafter = getattr(runner, "drafter", None)
    name = type(drafter).__name__
    if name not in _METHODS_WITH_SLOTS:
        return refuse(f"drafter {name} (method {method!r}) is not patched; only {_METHODS_WITH_SLOTS}")
    if getattr(config, "disable_padded_drafter_batch", False):
        return refuse("disable_padded_drafter_batch is set")
    if not all(hasattr(runner, a) for a in ("propose_draft_token_ids", "_sample", "sampler", "input_batch")):
        return refuse(f"model runner {type(runner).__name__} lacks the V1 runner methods")
    token_only = not bool(getattr(drafter, "pass_hidden_states_to_model", True))
    prefix_caching = bool(getattr(getattr(runner, "cache_config", None), "enable_prefix_caching", False)) \
        and not settings.prefix_cache_guard  # the engine core keeps blocks of unread prompts out of the cache
    off, reason = off_step_mode(settings.off_steps, token_only=token_only,
                                async_scheduling=bool(getattr(runner, "use_async_scheduling", False)),
                                prefix_caching=prefix_caching)
    return WorkerStatus(True, reason, rank, k_max=k_max, method=method, parallel=parallel, lower_width=True,
                        off_steps=off, state="active")


def install(runner: Any, settings: DrafterWidthSettings | None = None, rank: int = 0) -> WorkerStatus:
    """Patch `runner` (a V1 GPU/CPU model runner instance) once; later calls return the installed status."""
    existing = getattr(runner, "_peagle_drafter_width", None)
    if existing is not None:
        status: WorkerStatus = existing.status
        return status
    settings = settings or DrafterWidthSettings()
    status = _status(runner, settings, rank)
    if status.installed:
        runner._peagle_drafter_width = _Patch(runner, settings, status)
        logger.info("peagle drafter width: installed in worker %d (K=%d, method=%s, parallel=%s, off_steps=%s)",
                    rank, status.k_max, status.method, status.parallel, status.off_steps)
    return status


class DrafterWidthExtension:
    """vLLM ``worker_extension_cls``: adds the handshake and counter RPCs to the worker (see `install`)."""

    def peagle_drafter_width_handshake(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """Install the drafter-width patch in this worker and report what it supports (a `WorkerStatus` dict).

        Never raises: a problem is reported as ``installed: false`` with the reason."""
        rank = int(getattr(self, "rank", 0) or 0)
        try:
            parsed = DrafterWidthSettings.from_dict(settings)
            if parsed.fault == "handshake":
                raise DrafterWidthFault("fault='handshake' test hook")
            return install(self.model_runner, parsed, rank).to_dict()  # type: ignore[attr-defined]
        except Exception as exc:
            logger.error("peagle drafter width: handshake failed in worker %d: %s: %s", rank, type(exc).__name__,
                         exc)
            return WorkerStatus(False, f"{type(exc).__name__}: {exc}", rank, state="install_failed").to_dict()

    def peagle_drafter_width_counters(self) -> dict[str, Any]:
        """This worker's counters, plus ``installed`` / ``disabled``."""
        patch = getattr(getattr(self, "model_runner", None), "_peagle_drafter_width", None)
        if patch is None:
            return {"installed": False}
        return {"installed": True, "disabled": patch.disabled, **patch.counters,
                "drafter_ms": {str(k): list(v) for k, v in patch.drafter_ms.items()}}
