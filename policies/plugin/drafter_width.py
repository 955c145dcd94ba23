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
K); the scheduler sees K drafts instead of k and goes back to trimming. No request fails. That holds with one rank
only. Under tensor parallelism the ranks draft in lockstep (the drafter's forward all-reduces), and a fault is seen
by its own rank alone: falling back there would leave it drafting K (or running a skipped drafter) while the others
draft k, and NCCL would wait forever. So with ``tensor_parallel_size > 1`` a fault logs one line saying so and ends
the worker, and vLLM's executor fails the engine (`fault_action` says why this rather than a joint fallback).
"""

from __future__ import annotations

from typing import Any

from policies._off_steps import OFF_STEP_MODES, off_step_mode
from policies.plugin._drafter_patch import _Patch, zero_draft_metadata
from policies.plugin._drafter_protocol import (
    COUNTERS_METHOD,
    DRAFTER_WIDTH_STATES,
    DRAFTING_ATTR,
    HANDSHAKE_METHOD,
    SKIP_ATTR,
    WORKER_EXTENSION_CLS,
    DrafterSync,
    DrafterWidthFault,
    DrafterWidthSettings,
    WorkerStatus,
    drafting_slots,
    fault_action,
    logger,
)

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
    "fault_action",
    "install",
    "zero_draft_metadata",
]

#: Module prefixes of vLLM 0.32's V2 model runners (vllm/v1/worker/gpu/, and its CPU subclass in vllm/v1/worker/cpu/).
_V2_RUNNER_MODULES = ("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")
_METHODS_WITH_SLOTS = ("DraftModelProposer", "EagleProposer")


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
