"""The simulated engine: continuous batching step by step, the way vLLM V1's scheduler runs it (simplified).

Each step:

1. requests that arrived wait in a FIFO queue; while fewer than ``max_num_seqs`` run, the next one is admitted;
2. every decoding request verifies the depth decided for it in the step before, at most the drafts the drafter
   proposed for it then (a request's first decode step verifies all of them when nothing was decided for it);
3. the token budget ``max_num_batched_tokens`` goes first to the decoding requests (K_r + 1 each), then to prompt
   tokens of admitted requests in admission order (chunked prefill, as in vLLM V1);
4. the config's `DepthRule` decides, for the requests that will decode next (this step's decoding requests and those
   whose prompt completes now), their depth in the next step, and the drafter's depth D of this step (0: no drafter
   pass) -- the scheduler plugin's order: decide at ``schedule()`` of step n, draft during step n, verify at n+1.
   Under the scheduler plugin with drafter-width control (`Adaptive`, its ``off_steps`` as the plugin's workers run
   them, `policies.plugin.drafter_width`) a step with D = 0 (an off-step) does what the workers do:
   ``sync_pass`` (EAGLE heads, async scheduling): the drafter runs over one slot (D = 1, nothing replayed later);
   ``catch_up`` (token-only drafters): the drafter is skipped, in steps with prompt tokens too unless some request
   of the step would then have more than ``max_catch_up_tokens`` to replay (tokens missed so far plus the tokens it
   computes in this step; the worker's ``_prompts_replayable``), in which case it runs at D = 1;
   ``catch_up_decode`` (``catch_up`` under prefix caching): the same in decode-only steps, D = 1 in steps with
   prompt tokens, and no prompt left to a replay;
   ``holes``: skipped in decode-only steps, run at D = 1 in steps with prompt tokens;
5. the step takes ``cost.step_ms(StepShape(...))`` plus the config's ``plugin_ms_per_step`` (the scheduler plugin's
   own host time, `Adaptive`; the controller observes the step time without it). A speculative engine's step
   without a drafter pass is ``StepShape.drafter_idle``; a skipped step's prompt tokens are
   ``StepShape.drafter_skips_prompt`` (computed by the target alone).
   Under ``catch_up`` every request of the step (decoding or prefilling) keeps count of the tokens the drafter
   skipped for it -- a skipped prompt chunk's tokens, a skipped decode step's new tokens -- and the next step whose
   drafter runs for it replays them (``StepShape.catch_up_tokens``): a request that first drafts after a skipped
   prompt replays its prompt and its output so far, one that never drafts again never pays for them (in a drafting
   step a request planned at depth 0 keeps its missed tokens, and its prompt chunk joins them unread if that keeps
   it within ``max_catch_up_tokens``, as the plugin's workers do); a request with more
   than ``max_catch_up_tokens`` missed is abandoned (not replayed), as the plugin does. A vLLM schedule at K = 0
   runs the drafter anyway (its rule says at what depth, `BatchSizeSchedule`), as vLLM does.
   Every decoding request gains ``A_r + 1`` tokens (A_r accepted drafts from its `AcceptanceStream`, plus the bonus
   token), capped at its output length; a request whose prompt is complete gains its first token (TTFT);
6. finished requests leave; in closed loop their client sends the next request of the phase at once.

Not modelled: KV-cache capacity and preemption, host time per request (arrival, detokenisation) and the
scheduler's own CPU time beyond what the cost source and ``plugin_ms_per_step`` price, async scheduling, and early
stops (EOS): each request generates exactly its output length. Time is in ms from the start of the run.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import UsageError
from autotune.simulate._acceptance import AcceptanceModel, AcceptanceStream
from autotune.simulate._configs import ServingConfig
from autotune.simulate._cost import StepCostSource, StepShape
from autotune.simulate._prefix_cache import PrefixCache
from autotune.simulate._requests import Phase, SimRequest
from policies import MAX_CATCH_UP_TOKENS, REPLAY_MODES

__all__ = ["MAX_CATCH_UP_TOKENS", "RequestRecord", "SimRun", "simulate"]



@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request (times in ms from the start of the run)."""

    request_id: str
    cls: str
    phase: int
    arrival_ms: float
    first_token_ms: float
    finish_ms: float
    output_tokens: int
    decode_steps: int
    drafted: int
    accepted: int

    @property
    def ttft_ms(self) -> float:
        return self.first_token_ms - self.arrival_ms

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first; None for a one-token request."""
        if self.output_tokens < 2:
            return None
        return (self.finish_ms - self.first_token_ms) / (self.output_tokens - 1)


@dataclass
class SimRun:
    """One config on one workload: per-request records, per-phase spans and step statistics (all predicted)."""

    config: str
    requests: list[RequestRecord]
    phase_spans: list[tuple[float, float, int]]
    """Per phase: (start ms, end ms, output tokens). In closed loop the spans follow each other."""
    steps: int
    decode_request_steps: int
    depth_histogram: dict[int, int]
    """Verified depth -> decoding request-steps."""
    drafter_steps: int
    """Steps in which the drafter ran."""
    batch_sum: int
    """Sum over steps of decoding requests (mean batch = batch_sum / steps)."""
    duration_ms: float
    rule_summary: dict[str, Any] = field(default_factory=dict)
    catch_up_tokens: int = 0
    """Tokens the drafter replayed after off-steps (summed over steps and requests)."""
    idle_drafter_steps: int = 0
    """Steps of a speculative engine in which the drafter was skipped."""
    skipped_prompt_steps: int = 0
    """Of those, steps with prompt tokens left to a later replay (drafter width, ``catch_up``; the plugin's worker
    counter ``skipped_prompt_steps``)."""
    plugin_ms: float = 0.0
    """Host time of the scheduler plugin added over the run (``plugin_ms_per_step`` x steps)."""

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_ms * 1000.0 if self.duration_ms > 0 else 0.0

    def phase_tokens_per_s(self) -> list[float]:
        return [tok / (end - start) * 1000.0 if end > start else 0.0 for start, end, tok in self.phase_spans]


class _Live:
    __slots__ = ("req", "phase", "stream", "arrival", "prompt_left", "generated", "first_token", "steps", "drafted",
                 "accepted", "drafts_ready", "next_depth", "decoding", "missed")

    def __init__(self, req: SimRequest, phase: int, stream: AcceptanceStream, arrival: float) -> None:
        self.req = req
        self.phase = phase
        self.stream = stream
        self.arrival = arrival
        self.prompt_left = req.prompt_tokens
        self.generated = 0
        self.first_token = math.nan
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.drafts_ready = 0
        self.next_depth: int | None = None
        self.decoding = False
        self.missed = 0  # tokens without drafter KV (produced in steps that skipped the drafter)

    @property
    def context(self) -> int:
        return self.req.prompt_tokens + self.generated


def simulate(
    phases: Sequence[Phase],
    config: ServingConfig,
    cost: StepCostSource,
    acceptance: AcceptanceModel,
    *,
    concurrency: int | None = None,
    request_rate: float | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    seed: int = 0,
    max_steps: int = 5_000_000,
    max_catch_up_tokens: int = MAX_CATCH_UP_TOKENS,
    prefix_cache: PrefixCache | None = None,
) -> SimRun:
    """Serve ``phases`` with ``config``; closed loop at ``concurrency`` or open loop at ``request_rate`` (req/s).

    Deterministic for a seed: the acceptance streams are seeded per request (`AcceptanceModel`), Poisson arrivals
    by ``seed``. ``max_catch_up_tokens``: per request, the most missed tokens the drafter replays (see step 5).
    ``prefix_cache``: vLLM's prefix caching (None: off); a request admitted to the batch computes only the part of its
    prompt the cache lacks, and its prompt joins the cache once computed (the object is updated in place).
    """
    if (concurrency is None) == (request_rate is None):
        raise UsageError("simulate needs exactly one of concurrency (closed loop) or request_rate (open loop).")
    if concurrency is not None and concurrency < 1:
        raise UsageError(f"concurrency must be >= 1, but got {concurrency}.")
    if request_rate is not None and not (math.isfinite(request_rate) and request_rate > 0):
        raise UsageError(f"request_rate must be > 0 requests/s, but got {request_rate}.")
    if max_num_seqs < 1:
        raise UsageError(f"max_num_seqs must be >= 1, but got {max_num_seqs}.")
    rule = config.start()
    max_k = acceptance.max_k
    speculative = config.speculative
    plugin = speculative and config.kind == "adaptive"  # the plugin's drafter-width rules (step 4 and 5)
    off_steps = str(getattr(config, "off_steps", "catch_up"))
    # Drafter width under catch_up: the tokens each request missed in the drafter are replayed later (trimming runs
    # the drafter at K_max in every step, so it never misses any).
    track = plugin and bool(getattr(config, "drafter_width", True)) and off_steps in REPLAY_MODES
    prompts_left = track and off_steps == "catch_up"  # prompt tokens may be left to a replay
    plugin_ms = float(getattr(config, "plugin_ms_per_step", 0.0) or 0.0)
    if not (math.isfinite(plugin_ms) and plugin_ms >= 0):
        raise UsageError(f"plugin_ms_per_step must be a finite number >= 0 ms, but got {plugin_ms}.")

    # Arrivals: open loop draws every request's time up front; closed loop releases them as clients free up.
    timed: deque[tuple[float, int, SimRequest]] = deque()
    if request_rate is not None:
        rng = random.Random(seed)
        t_arr = 0.0
        for p, phase in enumerate(phases):
            for r in phase.requests:
                t_arr += rng.expovariate(request_rate) * 1000.0
                timed.append((t_arr, p, r))
    pending_phases = deque(enumerate(phases))
    phase_queue: deque[SimRequest] = deque()
    current_phase = -1
    in_flight = 0

    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    records: list[RequestRecord] = []
    spans: dict[int, list[float]] = {}
    phase_tokens: dict[int, int] = {}
    depth_hist: dict[int, int] = {}
    t = 0.0
    steps = decode_request_steps = drafter_steps = batch_sum = 0
    catch_up_total = idle_steps = skipped_prompts = 0

    def arrive(req: SimRequest, phase: int, at: float) -> None:
        waiting.append(_Live(req, phase, acceptance.stream(req), at))
        span = spans.setdefault(phase, [at, at])
        span[0] = min(span[0], at)

    def release_closed_loop() -> None:
        nonlocal current_phase, in_flight
        assert concurrency is not None
        if not phase_queue and in_flight == 0 and pending_phases:
            current_phase, phase = pending_phases.popleft()
            phase_queue.extend(phase.requests)
            spans.setdefault(current_phase, [t, t])
        while phase_queue and in_flight < concurrency:
            arrive(phase_queue.popleft(), current_phase, t)
            in_flight += 1

    while True:
        if concurrency is not None:
            release_closed_loop()
        else:
            while timed and timed[0][0] <= t:
                at, p, req = timed.popleft()
                arrive(req, p, at)
        if not running and not waiting:
            if concurrency is not None:
                if not pending_phases and not phase_queue:
                    break
                continue
            if not timed:
                break
            t = max(t, timed[0][0])
            continue
        if steps >= max_steps:
            raise UsageError(f"the simulation did not finish within {max_steps} steps; shorten the workload.")
        while waiting and len(running) < max_num_seqs:
            x = waiting.popleft()
            if prefix_cache is not None:
                x.prompt_left -= prefix_cache.cached_tokens(x.req)
            running.append(x)

        decoding = [x for x in running if x.decoding]
        depths = []
        verified = 0
        for x in decoding:
            k = x.drafts_ready if x.next_depth is None or x.next_depth > x.drafts_ready else x.next_depth
            if k > max_k:
                k = max_k
            depths.append(k)
            verified += k + 1
        budget = max_num_batched_tokens - verified
        chunks: list[tuple[_Live, int]] = []
        for x in running:
            if budget <= 0:
                break
            if x.decoding:
                continue
            chunk = x.prompt_left if x.prompt_left < budget else budget
            chunks.append((x, chunk))
            budget -= chunk
        if not decoding and not chunks:
            raise UsageError(
                f"max_num_batched_tokens={max_num_batched_tokens} leaves no room for any token of the step; raise it."
            )
        completing = [x for x, chunk in chunks if chunk == x.prompt_left and x.req.output_tokens > 1]
        for x in completing:
            rule.join(x.req.request_id, x.req.cls)
        planned_for = decoding + completing
        planned, drafting = rule.plan([x.req.request_id for x in planned_for], len(decoding) + len(chunks))
        prefill_tokens = sum(c for _, c in chunks)
        if not speculative:
            drafting = 0
        elif plugin and drafting == 0:
            if off_steps == "sync_pass":
                drafting = 1  # a one-slot pass keeps the drafter's KV cache (nothing to replay later)
            elif prefill_tokens and not (prompts_left and _replayable(decoding, depths, chunks, max_catch_up_tokens)):
                drafting = 1  # the drafter reads the prompt tokens now (at one slot)
        catch_up = deferred_prompt = 0
        deferred: set[int] = set()  # requests in the pass planned at depth 0: they keep their missed tokens
        if track and drafting > 0:
            # The plugin names the requests planned above 0 when some are not (`DRAFTING_ATTR`); only those replay,
            # and the others' prompt chunks are left to a replay too (but their last token) when it stays in bounds.
            named = {id(x) for x, k in zip(planned_for, planned, strict=True) if k > 0} \
                if any(k == 0 for k in planned) else None
            if named is not None and prompts_left:
                for x, chunk in chunks:
                    if id(x) not in named and chunk > 1 and x.missed + chunk <= max_catch_up_tokens:
                        deferred.add(id(x))
                        deferred_prompt += chunk - 1
            for x in decoding + [x for x, _ in chunks]:  # the requests in the drafter's pass
                if x.missed:
                    if named is not None and id(x) not in named:
                        deferred.add(id(x))
                        continue
                    if x.missed <= max_catch_up_tokens:
                        catch_up += x.missed
                    x.missed = 0
        idle = speculative and drafting == 0
        skips_prompt = track and idle and prefill_tokens > 0
        context = sum(x.context for x in decoding) / len(decoding) if decoding else 0.0
        shape = StepShape(len(decoding), verified, drafting, context, prefill_tokens, len(chunks), catch_up, idle,
                          skips_prompt, deferred_prompt)
        step_ms = cost.step_ms(shape)  # what the controller learns from: the engine's step, not the plugin's time
        t += step_ms + plugin_ms
        steps += 1
        batch_sum += len(decoding)
        catch_up_total += catch_up
        if drafting > 0:
            drafter_steps += 1
        elif idle:
            idle_steps += 1
            skipped_prompts += skips_prompt
        for x, k in zip(planned_for, planned, strict=True):
            x.next_depth = k
            x.drafts_ready = drafting

        results = []
        finished: list[_Live] = []
        for i, x in enumerate(decoding):
            k = depths[i]
            a = x.stream.accepted(k)
            gain = a + 1
            left = x.req.output_tokens - x.generated
            if gain > left:
                gain = left
            x.generated += gain
            if track and (idle or id(x) in deferred):
                x.missed += gain
            x.steps += 1
            x.drafted += k
            x.accepted += a
            depth_hist[k] = depth_hist.get(k, 0) + 1
            results.append((x.req.request_id, x.req.cls, k, a))
            if x.generated >= x.req.output_tokens:
                finished.append(x)
        decode_request_steps += len(decoding)
        for x, chunk in chunks:
            x.prompt_left -= chunk
            if skips_prompt or id(x) in deferred:
                x.missed += chunk
            if x.prompt_left == 0:
                if prefix_cache is not None:
                    prefix_cache.add(x.req)
                x.generated = 1
                x.first_token = t
                if x.generated >= x.req.output_tokens:
                    finished.append(x)
                else:
                    x.decoding = True
        rule.observe(results, None if prefill_tokens else step_ms)
        if finished:
            gone = set(map(id, finished))
            running = [x for x in running if id(x) not in gone]
            for x in finished:
                if x.decoding:
                    rule.leave(x.req.request_id)
                records.append(
                    RequestRecord(x.req.request_id, x.req.cls, x.phase, x.arrival, x.first_token, t,
                                  x.generated, x.steps, x.drafted, x.accepted)
                )
                spans[x.phase][1] = max(spans[x.phase][1], t)
                phase_tokens[x.phase] = phase_tokens.get(x.phase, 0) + x.generated
                if concurrency is not None:
                    in_flight -= 1

    start = min((s[0] for s in spans.values()), default=0.0)
    return SimRun(
        config=config.label,
        requests=records,
        phase_spans=[(spans[p][0], spans[p][1], phase_tokens.get(p, 0)) for p in sorted(spans)],
        steps=steps,
        decode_request_steps=decode_request_steps,
        depth_histogram=dict(sorted(depth_hist.items())),
        drafter_steps=drafter_steps,
        batch_sum=batch_sum,
        duration_ms=t - start,
        rule_summary=rule.summary(),
        catch_up_tokens=catch_up_total,
        idle_drafter_steps=idle_steps,
        skipped_prompt_steps=skipped_prompts,
        plugin_ms=plugin_ms * steps,
    )


def _replayable(decoding: Sequence[_Live], depths: Sequence[int], chunks: Sequence[tuple[_Live, int]],
                cap: int) -> bool:
    """Whether the drafter may skip a step with prompt tokens under ``catch_up``: every request's replay, were the
    step skipped -- the tokens it missed so far plus those it computes now (K_r + 1 verified, or its prompt chunk) --
    stays within ``cap`` (the plugin's worker counts the same span, `DrafterSync.gap`; for a request that drafted
    before the skipped steps its span is one token shorter, the drafting pass having written its bonus token)."""
    if any(x.missed + k + 1 > cap for x, k in zip(decoding, depths, strict=True)):
        return False
    return all(x.missed + chunk <= cap for x, chunk in chunks)
