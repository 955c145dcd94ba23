"""The drafter-width patch of one model runner instance (`_Patch`), installed by `policies.plugin.drafter_width.install`
in the worker process, and `zero_draft_metadata`, its short path for steps that verify no draft. See
`policies.plugin.drafter_width` for what is patched and why. torch and vLLM are imported lazily (worker only).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

from policies._off_steps import REPLAY_MODES
from policies.plugin._drafter_protocol import (
    DRAFTING_ATTR,
    FAULT_EXIT_CODE,
    SKIP_ATTR,
    DrafterSync,
    DrafterWidthFault,
    DrafterWidthSettings,
    WorkerStatus,
    drafting_slots,
    fault_action,
    fault_message,
    logger,
)

__all__ = ["zero_draft_metadata"]


class _Patch:
    """The patched methods of one model runner instance, with their state and counters."""

    def __init__(self, runner: Any, settings: DrafterWidthSettings, status: WorkerStatus) -> None:
        self.runner = runner
        self.drafter = runner.drafter
        self.settings = settings
        self.status = status
        self.k_max = status.k_max
        self.parallel = status.parallel
        # Ranks that draft in lockstep (the drafter's forward all-reduces across them): a fault may not fall back
        # on one of them alone (`fault_action`).
        self.tensor_parallel_size = int(getattr(getattr(runner, "parallel_config", None),
                                                "tensor_parallel_size", 1) or 1)
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
        """Handle an exception in a patched path: fall back to vLLM's own code in this worker (one rank), or end
        the worker so the engine fails at once (tensor parallel; see `fault_action` for why)."""
        self.counters["faults"] += 1
        if fault_action(self.tensor_parallel_size) == "fail_engine":
            logger.critical("%s\n%s", fault_message(where, exc, self.tensor_parallel_size, self.status.rank),
                            traceback.format_exc())
            _end_worker(FAULT_EXIT_CODE)
            return
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


def _end_worker(code: int) -> None:
    """End this worker process now, logs flushed: vLLM's executor notices the death and fails the engine. Not
    ``sys.exit``: a ``SystemExit`` unwinds through vLLM's worker loop and Ray's actor code, which read it as a
    shutdown request; ``os._exit`` ends the process whatever runs it."""
    logging.shutdown()
    os._exit(code)


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
