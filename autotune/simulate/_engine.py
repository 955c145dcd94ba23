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
    sim = _Simulation(phases, config, cost, acceptance, concurrency, max_num_seqs, max_num_batched_tokens,
                      max_catch_up_tokens, prefix_cache)
    if request_rate is not None:
        sim.draw_arrivals(phases, request_rate, seed)
    while sim.has_work():
        if sim.steps >= max_steps:
            raise UsageError(f"the simulation did not finish within {max_steps} steps; shorten the workload.")
        sim.admit()
        sim.step()
    return sim.result()


class _Simulation:
    """The state of one run and its steps (the numbered steps of the module docstring)."""

    def __init__(
        self,
        phases: Sequence[Phase],
        config: ServingConfig,
        cost: StepCostSource,
        acceptance: AcceptanceModel,
        concurrency: int | None,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_catch_up_tokens: int,
        prefix_cache: PrefixCache | None,
    ) -> None:
        self.config, self.cost, self.acceptance = config, cost, acceptance
        self.concurrency, self.max_num_seqs = concurrency, max_num_seqs
        self.max_num_batched_tokens, self.max_catch_up_tokens = max_num_batched_tokens, max_catch_up_tokens
        self.prefix_cache = prefix_cache
        self.rule = config.start()
        self.max_k = acceptance.max_k
        self.speculative = config.speculative
        self.plugin = self.speculative and config.kind == "adaptive"  # the plugin's drafter-width rules (4 and 5)
        self.off_steps = str(getattr(config, "off_steps", "catch_up"))
        # Drafter width under catch_up: the tokens each request missed in the drafter are replayed later (trimming
        # runs the drafter at K_max in every step, so it never misses any).
        self.track = self.plugin and bool(getattr(config, "drafter_width", True)) and self.off_steps in REPLAY_MODES
        self.prompts_left = self.track and self.off_steps == "catch_up"  # prompt tokens may be left to a replay
        plugin_ms = float(getattr(config, "plugin_ms_per_step", 0.0) or 0.0)
        if not (math.isfinite(plugin_ms) and plugin_ms >= 0):
            raise UsageError(f"plugin_ms_per_step must be a finite number >= 0 ms, but got {plugin_ms}.")
        self.plugin_ms = plugin_ms
        # CUDA graphs: on a device with FULL graphs only the uniform decode step at the launch's K replays them.
        self.graphs = bool(getattr(cost, "full_graphs", False))
        self.graph_depth = getattr(config, "graph_depth", None)

        # Arrivals: open loop draws every request's time up front; closed loop releases them as clients free up.
        self.timed: deque[tuple[float, int, SimRequest]] = deque()
        self.pending_phases = deque(enumerate(phases))
        self.phase_queue: deque[SimRequest] = deque()
        self.current_phase = -1
        self.in_flight = 0

        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        self.records: list[RequestRecord] = []
        self.spans: dict[int, list[float]] = {}
        self.phase_tokens: dict[int, int] = {}
        self.depth_hist: dict[int, int] = {}
        self.t = 0.0
        self.steps = self.decode_request_steps = self.drafter_steps = self.batch_sum = 0
        self.catch_up_total = self.idle_steps = self.skipped_prompts = 0

    # ---- 1. arrivals and admission ---------------------------------------------------------------------------
    def draw_arrivals(self, phases: Sequence[Phase], request_rate: float, seed: int) -> None:
        """Open loop: every request's Poisson arrival time, phase after phase."""
        rng = random.Random(seed)
        t_arr = 0.0
        for p, phase in enumerate(phases):
            for r in phase.requests:
                t_arr += rng.expovariate(request_rate) * 1000.0
                self.timed.append((t_arr, p, r))

    def _arrive(self, req: SimRequest, phase: int, at: float) -> None:
        self.waiting.append(_Live(req, phase, self.acceptance.stream(req), at))
        span = self.spans.setdefault(phase, [at, at])
        span[0] = min(span[0], at)

    def _release_closed_loop(self, concurrency: int) -> None:
        if not self.phase_queue and self.in_flight == 0 and self.pending_phases:
            self.current_phase, phase = self.pending_phases.popleft()
            self.phase_queue.extend(phase.requests)
            self.spans.setdefault(self.current_phase, [self.t, self.t])
        while self.phase_queue and self.in_flight < concurrency:
            self._arrive(self.phase_queue.popleft(), self.current_phase, self.t)
            self.in_flight += 1

    def has_work(self) -> bool:
        """Release the requests that arrived by now (waiting for the next arrival when nothing runs); False when
        every request is served."""
        while True:
            if self.concurrency is not None:
                self._release_closed_loop(self.concurrency)
            else:
                timed = self.timed
                while timed and timed[0][0] <= self.t:
                    at, p, req = timed.popleft()
                    self._arrive(req, p, at)
            if self.running or self.waiting:
                return True
            if self.concurrency is not None:
                if not self.pending_phases and not self.phase_queue:
                    return False
                continue
            if not self.timed:
                return False
            self.t = max(self.t, self.timed[0][0])

    def admit(self) -> None:
        """Waiting requests join the batch while fewer than max_num_seqs run (the prefix cache's part of their
        prompt is not computed)."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            x = self.waiting.popleft()
            if self.prefix_cache is not None:
                x.prompt_left -= self.prefix_cache.cached_tokens(x.req)
            self.running.append(x)

    # ---- one step --------------------------------------------------------------------------------------------
    def step(self) -> None:
        decoding, depths, verified = self._verify_depths()
        chunks = self._prompt_chunks(self.max_num_batched_tokens - verified)
        if not decoding and not chunks:
            raise UsageError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} leaves no room for any token of the step; "
                "raise it."
            )
        prefill_tokens = sum(c for _, c in chunks)
        planned_for, planned, drafting = self._plan(decoding, depths, chunks, prefill_tokens)
        catch_up, deferred, deferred_prompt = self._replays(decoding, chunks, planned_for, planned, drafting)
        idle = self.speculative and drafting == 0
        skips_prompt = self.track and idle and prefill_tokens > 0
        context = sum(x.context for x in decoding) / len(decoding) if decoding else 0.0
        full = self.graph_depth
        piecewise = self.graphs and (full is None or prefill_tokens > 0 or verified != len(decoding) * (full + 1))
        shape = StepShape(len(decoding), verified, drafting, context, prefill_tokens, len(chunks), catch_up, idle,
                          skips_prompt, deferred_prompt, piecewise)
        step_ms = self.cost.step_ms(shape)  # what the controller learns from: the engine's step, not the plugin's
        self._count(step_ms, len(decoding), catch_up, drafting, idle, skips_prompt)
        for x, k in zip(planned_for, planned, strict=True):
            x.next_depth = k
            x.drafts_ready = drafting
        results, finished = self._decode(decoding, depths, self.track and idle, deferred)
        finished += self._prefill(chunks, skips_prompt, deferred)
        self.rule.observe(results, None if prefill_tokens else step_ms)
        if finished:
            self._retire(finished)

    def _verify_depths(self) -> tuple[list[_Live], list[int], int]:
        """2. The decoding requests, the depth each verifies now, and the tokens they verify (K_r + 1 each)."""
        decoding = [x for x in self.running if x.decoding]
        depths = []
        verified = 0
        max_k = self.max_k
        for x in decoding:
            k = x.drafts_ready if x.next_depth is None or x.next_depth > x.drafts_ready else x.next_depth
            if k > max_k:
                k = max_k
            depths.append(k)
            verified += k + 1
        return decoding, depths, verified

    def _prompt_chunks(self, budget: int) -> list[tuple[_Live, int]]:
        """3. The prompt tokens the rest of the budget computes, request by request in admission order."""
        chunks: list[tuple[_Live, int]] = []
        for x in self.running:
            if budget <= 0:
                break
            if x.decoding:
                continue
            chunk = x.prompt_left if x.prompt_left < budget else budget
            chunks.append((x, chunk))
            budget -= chunk
        return chunks

    def _plan(
        self, decoding: list[_Live], depths: list[int], chunks: list[tuple[_Live, int]], prefill_tokens: int
    ) -> tuple[list[_Live], list[int], int]:
        """4. The rule's depths for the requests that decode next, and the drafter's depth in this step (the
        plugin's off-step rules when the rule says 0)."""
        completing = [x for x, chunk in chunks if chunk == x.prompt_left and x.req.output_tokens > 1]
        for x in completing:
            self.rule.join(x.req.request_id, x.req.cls)
        planned_for = decoding + completing
        planned, drafting = self.rule.plan([x.req.request_id for x in planned_for], len(decoding) + len(chunks))
        if not self.speculative:
            drafting = 0
        elif self.plugin and drafting == 0:
            if self.off_steps == "sync_pass":
                drafting = 1  # a one-slot pass keeps the drafter's KV cache (nothing to replay later)
            elif prefill_tokens and not (
                self.prompts_left and _replayable(decoding, depths, chunks, self.max_catch_up_tokens)
            ):
                drafting = 1  # the drafter reads the prompt tokens now (at one slot)
        return planned_for, planned, drafting

    def _replays(
        self,
        decoding: list[_Live],
        chunks: list[tuple[_Live, int]],
        planned_for: list[_Live],
        planned: list[int],
        drafting: int,
    ) -> tuple[int, set[int], int]:
        """5. Under catch_up, in a step whose drafter runs: the missed tokens it replays now, the requests of the pass
        that keep theirs (planned at depth 0), and the prompt tokens of those left to a later replay."""
        catch_up = deferred_prompt = 0
        deferred: set[int] = set()  # requests in the pass planned at depth 0: they keep their missed tokens
        if not (self.track and drafting > 0):
            return catch_up, deferred, deferred_prompt
        cap = self.max_catch_up_tokens
        # The plugin names the requests planned above 0 when some are not (`DRAFTING_ATTR`); only those replay,
        # and the others' prompt chunks are left to a replay too (but their last token) when it stays in bounds.
        named = {id(x) for x, k in zip(planned_for, planned, strict=True) if k > 0} \
            if any(k == 0 for k in planned) else None
        if named is not None and self.prompts_left:
            for x, chunk in chunks:
                if id(x) not in named and chunk > 1 and x.missed + chunk <= cap:
                    deferred.add(id(x))
                    deferred_prompt += chunk - 1
        for x in decoding + [x for x, _ in chunks]:  # the requests in the drafter's pass
            if x.missed:
                if named is not None and id(x) not in named:
                    deferred.add(id(x))
                    continue
                if x.missed <= cap:
                    catch_up += x.missed
                x.missed = 0
        return catch_up, deferred, deferred_prompt

    def _count(self, step_ms: float, batch: int, catch_up: int, drafting: int, idle: bool, skips_prompt: bool) -> None:
        """The clock moves by the step and the plugin's host time; the run's step counters."""
        self.t += step_ms + self.plugin_ms
        self.steps += 1
        self.batch_sum += batch
        self.catch_up_total += catch_up
        if drafting > 0:
            self.drafter_steps += 1
        elif idle:
            self.idle_steps += 1
            self.skipped_prompts += skips_prompt

    def _decode(
        self, decoding: list[_Live], depths: list[int], missing: bool, deferred: set[int]
    ) -> tuple[list[tuple[str, str, int, int]], list[_Live]]:
        """Each decoding request gains its accepted drafts plus the bonus token (capped at its output length);
        `missing`: the drafter skipped this step, so the tokens are missed. Returns the rule's observations and the
        requests that finished."""
        results = []
        finished: list[_Live] = []
        depth_hist = self.depth_hist
        track = self.track
        for x, k in zip(decoding, depths, strict=True):
            a = x.stream.accepted(k)
            gain = a + 1
            left = x.req.output_tokens - x.generated
            if gain > left:
                gain = left
            x.generated += gain
            if track and (missing or id(x) in deferred):
                x.missed += gain
            x.steps += 1
            x.drafted += k
            x.accepted += a
            depth_hist[k] = depth_hist.get(k, 0) + 1
            results.append((x.req.request_id, x.req.cls, k, a))
            if x.generated >= x.req.output_tokens:
                finished.append(x)
        self.decode_request_steps += len(decoding)
        return results, finished

    def _prefill(self, chunks: list[tuple[_Live, int]], skips_prompt: bool, deferred: set[int]) -> list[_Live]:
        """Prompt chunks are computed; a request whose prompt completes gains its first token (and joins the prefix
        cache). Returns the requests that finished (one-token outputs)."""
        finished: list[_Live] = []
        for x, chunk in chunks:
            x.prompt_left -= chunk
            if skips_prompt or id(x) in deferred:
                x.missed += chunk
            if x.prompt_left == 0:
                if self.prefix_cache is not None:
                    self.prefix_cache.add(x.req)
                x.generated = 1
                x.first_token = self.t
                if x.generated >= x.req.output_tokens:
                    finished.append(x)
                else:
                    x.decoding = True
        return finished

    def _retire(self, finished: list[_Live]) -> None:
        """6. Finished requests leave the batch (and the rule), with their records; their clients are free."""
        gone = set(map(id, finished))
        self.running = [x for x in self.running if id(x) not in gone]
        t = self.t
        for x in finished:
            if x.decoding:
                self.rule.leave(x.req.request_id)
            self.records.append(
                RequestRecord(x.req.request_id, x.req.cls, x.phase, x.arrival, x.first_token, t,
                              x.generated, x.steps, x.drafted, x.accepted)
            )
            self.spans[x.phase][1] = max(self.spans[x.phase][1], t)
            self.phase_tokens[x.phase] = self.phase_tokens.get(x.phase, 0) + x.generated
            if self.concurrency is not None:
                self.in_flight -= 1

    def result(self) -> SimRun:
        spans = self.spans
        start = min((s[0] for s in spans.values()), default=0.0)
        return SimRun(
            config=self.config.label,
            requests=self.records,
            phase_spans=[(spans[p][0], spans[p][1], self.phase_tokens.get(p, 0)) for p in sorted(spans)],
            steps=self.steps,
            decode_request_steps=self.decode_request_steps,
            depth_histogram=dict(sorted(self.depth_hist.items())),
            drafter_steps=self.drafter_steps,
            batch_sum=self.batch_sum,
            duration_ms=self.t - start,
            rule_summary=self.rule.summary(),
            catch_up_tokens=self.catch_up_total,
            idle_drafter_steps=self.idle_steps,
            skipped_prompt_steps=self.skipped_prompts,
            plugin_ms=self.plugin_ms * self.steps,
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
