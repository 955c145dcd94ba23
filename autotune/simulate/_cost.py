"""Step-cost sources: the time of one engine step of any shape, ms (predicted), for the simulator.

A step verifies ``V = sum_r (K_r + 1)`` tokens of B decoding requests (per-request depths), lets the drafter propose
D drafts per request (D = 0: the drafter does not run, nor does the rejection sampler), and may also compute prompt
(prefill) tokens of newly admitted requests (vLLM V1 chunks prefill into the same forward pass). `StepShape` says
that; a `StepCostSource` prices it. Two sources:

- `RooflineStepCost`: the model backend's GPU roofline (`autotune.backends.model.ModelBackend`). It calls
  ``ModelBackend.step(config, batch_size, context_tokens)`` -> `StepTime` for uniform depths and composes a mixed
  step from its parts: the target side interpolated in V between the two neighbouring uniform depths, the
  speculation overhead when the drafter runs, the drafter side at depth D, and the backend's `Calibration` over
  both sides. A uniform step (every K_r = D = K) is exactly ``ModelBackend.predict_step_ms``. Prefill tokens add
  the marginal cost of a longer target pass (``ModelBackend.target_pass_ms``, the roofline pass the
  backend's own step time is built on): on a MoE model a decode batch already reads most experts, so an isolated
  prefill pass would count them twice.
- `FittedStepCost`: a measured `policies.StepCostModel` fit (what ``peagle-tune profile`` stores): its
  ``predict_tokens(B, V, drafter_ran, D)``, with prompt tokens priced like verified tokens (one forward pass over
  all of them), plus terms the fit (decode-only steps, drafter at full width or plainly off) cannot see: the
  drafter's replay of the tokens it missed in off-steps (``drafter_token_ms`` each), the cost of a speculative
  engine's step whose drafter is skipped over a plain engine's (``idle_drafter_ms``), and host time outside the
  measured step window: an optional constant per step, and the engine core's fetch of the drafts after a step whose
  drafter ran (``draft_fetch_ms``).

`drafter_token_ratio` derives the drafter's cost per token relative to the target's from the two models' shapes.

`controller_cost_model` fits the linear `StepCostModel` the depth controller would get from profiling that GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from autotune.catalogs import architecture_params
from autotune.errors import UsageError
from autotune.spec import SpecConfig
from policies import StepCostModel, StepSample

if TYPE_CHECKING:  # the model backend is imported only when a roofline source is built
    from autotune.backends.model import ModelBackend, StepTime

__all__ = [
    "FittedStepCost",
    "RooflineStepCost",
    "StepCostSource",
    "StepShape",
    "controller_cost_model",
    "drafter_token_ratio",
    "params_per_token",
]


@dataclass(frozen=True, slots=True)
class StepShape:
    """The shape of one engine step.

    ``batch_size``: decoding requests (each verifies K_r >= 0 drafts). ``verified_tokens``: ``sum_r (K_r + 1)``.
    ``drafting_depth``: drafts the drafter proposes per request in this step (0: no drafter pass, no rejection
    sampling). ``context_tokens``: mean context (prompt + generated) of the decoding requests. ``prefill_tokens``:
    prompt tokens computed in the step, for ``prefill_requests`` requests (when the drafter runs it reads them too).
    ``catch_up_tokens``: tokens the drafter replays in this step because earlier steps skipped it (drafter-width
    control with ``off_steps="catch_up"``, `policies.plugin.drafter_width`); only with ``drafting_depth > 0``.
    ``piecewise``: the step runs PIECEWISE on a device whose launch replays FULL CUDA graphs for its uniform decode
    step only (`policies._graphs`): it pays the penalty. ``drafter_idle``: the engine has a drafter but skips it in
    this step (``drafting_depth == 0`` of a speculative engine); False for an engine without speculation.
    ``drafter_skips_prompt``: the skipped drafter leaves this step's prompt tokens to a later replay (drafter-width
    control, ``catch_up``): the target alone computes them now; only with ``drafter_idle``.
    ``deferred_prompt_tokens``: of ``prefill_tokens``, those a running drafter leaves to a later replay (prompts of
    requests planned at depth 0, ``DrafterWidthSettings.defer_idle_prompts``); only with ``drafting_depth > 0``.
    """

    batch_size: int
    verified_tokens: int
    drafting_depth: int
    context_tokens: float
    prefill_tokens: int = 0
    prefill_requests: int = 0
    catch_up_tokens: int = 0
    drafter_idle: bool = False
    drafter_skips_prompt: bool = False
    deferred_prompt_tokens: int = 0
    piecewise: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 0 or self.prefill_requests < 0 or self.prefill_tokens < 0 or self.drafting_depth < 0 \
                or self.catch_up_tokens < 0:
            raise ValueError(f"a step shape has no negative counts, but got {self}.")
        if self.drafting_depth > 0 and self.drafter_idle:
            raise ValueError(f"a step whose drafter drafts (depth {self.drafting_depth}) is not idle: {self}.")
        if self.catch_up_tokens and self.drafting_depth == 0:
            raise ValueError(f"the drafter replays tokens only in a step where it runs, but got {self}.")
        if self.drafter_skips_prompt and not self.drafter_idle:
            raise ValueError(f"only a step that skips its drafter leaves the prompt to a replay, but got {self}.")
        if not 0 <= self.deferred_prompt_tokens <= self.prefill_tokens or (
                self.deferred_prompt_tokens and self.drafting_depth == 0):
            raise ValueError(f"a running drafter defers at most the step's prompt tokens, but got {self}.")
        if self.batch_size + self.prefill_requests < 1:
            raise ValueError("a step has at least one request (decoding or prefilling).")
        if self.verified_tokens < self.batch_size:
            raise ValueError(
                f"verified_tokens counts K_r + 1 per decoding request, so it must be >= batch_size="
                f"{self.batch_size}, but got {self.verified_tokens}."
            )


class StepCostSource(Protocol):
    """Prices an engine step (ms, predicted). ``label`` names the source for provenance. ``full_graphs``: the
    device replays FULL CUDA graphs for a launch's uniform decode step (a GPU), so other steps pay a penalty."""

    @property
    def label(self) -> str: ...

    @property
    def full_graphs(self) -> bool: ...

    def step_ms(self, shape: StepShape) -> float: ...


class FittedStepCost:
    """Step times from a fitted `policies.StepCostModel` (measured samples, linear fit).

    A step with prefill is priced as one pass over ``B + prefill_requests`` requests and ``V + prefill_tokens``
    tokens. The drafter reads every token the target computes in a step where it runs, so the fit's
    ``per_verified_token`` (its slope comes from speculative steps of different depths) is the target's plus the
    drafter's cost per token, and prompt tokens priced at it include the drafter's work on them. The fit is made of
    decode-only steps at full drafter width or with the drafter plainly off, so three terms come from outside it
    (all ms, default 0):

    - ``drafter_token_ms``: the drafter's cost per token it replays after off-steps (``StepShape.catch_up_tokens``),
      e.g. `drafter_token_ms` of `autotune.simulate.profile_terms` (derived from the two models' shapes).
    - ``idle_drafter_ms``: what a speculative engine's step costs over a plain engine's when the drafter is skipped
      (``StepShape.drafter_idle``; the fit prices such a step like a no-speculation step). Measured in a profile as
      the speculative launch's drafter-off steps minus the no-speculation launch's at the same batch size.
      The prompt tokens of a skipped step whose drafter replays them later (``StepShape.drafter_skips_prompt``),
      and those a running drafter defers (``StepShape.deferred_prompt_tokens``), cost the fit's per-token time less
      ``drafter_token_ms`` each (at most all of it): the drafter's share moves to the replay (or is never paid).
    - ``step_overhead_ms``: host time per step outside the model's measured window (the plugin times a step from
      ``schedule()`` to ``update_from_output()``; output processing between steps is not in it).
    - ``draft_fetch_ms``: host time per step whose drafter ran, outside that window: vLLM's engine core fetches the
      step's drafts from the workers after it (``EngineCore.post_step`` -> ``take_draft_token_ids``, one more RPC
      with a multiprocess executor; the plugin skips it after an off-step). A property of the host and executor,
      not of the fit: 0 unless measured for that host.
    - ``prompt_token_ms`` (None: not given): the target's cost per prompt token, measured on steps with prompt
      tokens (`autotune.simulate.prompt_token_costs`). Given, prompt tokens leave the fit's per-token slope (made of
      decode steps, and holding the drafter's share) and cost this each, plus ``drafter_token_ms`` each that a
      running drafter reads (not the deferred ones, nor any in a step that skips the drafter).
    """

    def __init__(self, model: StepCostModel, *, label: str = "fitted step-cost model", step_overhead_ms: float = 0.0,
                 drafter_token_ms: float = 0.0, idle_drafter_ms: float = 0.0, draft_fetch_ms: float = 0.0,
                 prompt_token_ms: float | None = None):
        for name, value in (("step_overhead_ms", step_overhead_ms), ("drafter_token_ms", drafter_token_ms),
                            ("idle_drafter_ms", idle_drafter_ms), ("draft_fetch_ms", draft_fetch_ms),
                            ("prompt_token_ms", 0.0 if prompt_token_ms is None else prompt_token_ms)):
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be a finite number >= 0, but got {value}.")
        self.prompt_token_ms = None if prompt_token_ms is None else float(prompt_token_ms)
        self.model = model
        self.step_overhead_ms = float(step_overhead_ms)
        self.drafter_token_ms = float(drafter_token_ms)
        self.idle_drafter_ms = float(idle_drafter_ms)
        self.draft_fetch_ms = float(draft_fetch_ms)
        self._per_token = float(model.coefficients.get("per_verified_token", 0.0))  # the fit's target + drafter
        self._label = label

    @property
    def full_graphs(self) -> bool:
        """The fit was made on a device with FULL graphs (its model knows the launch's FULL-graph depth)."""
        return self.model.full_graph_depth is not None

    @property
    def label(self) -> str:
        parts = [self._label]
        if self.drafter_token_ms:
            parts.append(f"{self.drafter_token_ms:.3g} ms per extra drafter token")
        if self.idle_drafter_ms:
            parts.append(f"{self.idle_drafter_ms:.3g} ms per skipped-drafter step")
        if self.draft_fetch_ms:
            parts.append(f"{self.draft_fetch_ms:.3g} ms draft fetch per drafting step")
        if self.prompt_token_ms is not None:
            parts.append(f"{self.prompt_token_ms:.3g} ms per prompt token")
        if self.step_overhead_ms:
            parts.append(f"{self.step_overhead_ms:.3g} ms/step host time")
        return " + ".join(parts)

    def step_ms(self, shape: StepShape) -> float:
        ran = shape.drafting_depth > 0
        explicit = self.prompt_token_ms is not None  # prompt tokens priced apart from the fit's slope
        ms = self.model.predict_tokens(
            shape.batch_size + shape.prefill_requests,
            shape.verified_tokens + (0 if explicit else shape.prefill_tokens),
            ran,
            shape.drafting_depth,
            shape.piecewise,
        )
        ms = max(ms, 1e-3) + self.step_overhead_ms
        if explicit:
            ms += (self.prompt_token_ms or 0.0) * shape.prefill_tokens
        if ran:
            ms += self.drafter_token_ms * shape.catch_up_tokens + self.draft_fetch_ms
            if explicit:
                ms += self.drafter_token_ms * (shape.prefill_tokens - shape.deferred_prompt_tokens)
            else:
                ms -= min(self.drafter_token_ms, self._per_token) * shape.deferred_prompt_tokens
        elif shape.drafter_idle:
            ms += self.idle_drafter_ms
            if shape.drafter_skips_prompt and not explicit:
                ms -= min(self.drafter_token_ms, self._per_token) * shape.prefill_tokens
        return ms


def params_per_token(config: Mapping[str, object]) -> float:
    """Weights a dense decoder-only transformer multiplies per token (a Hugging Face ``config.json``): its active
    parameters as the catalog counts them (`autotune.catalogs.architecture_params`: per layer the attention
    projections and a gated MLP, plus the LM head). A forward pass does ~2 FLOPs per weight per token; attention
    over the context is left out (it is the same per token for target and drafter at equal context, up to their
    head counts)."""

    def num(key: str, default: float | None = None) -> float:
        value = config.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise UsageError(f"model config lacks a positive {key!r} (got {value!r}); cannot size its pass.")
        return float(value)

    h = num("hidden_size")
    heads = num("num_attention_heads")
    active_b = architecture_params(
        num_layers=int(num("num_hidden_layers")), hidden_size=int(h), num_attention_heads=int(heads),
        num_kv_heads=int(num("num_key_value_heads", heads)), head_dim=int(num("head_dim", h // heads)),
        vocab_size=int(num("vocab_size")), ffn_intermediate_size=int(num("intermediate_size")), num_experts=0,
        experts_per_token=0, tie_word_embeddings=False,
    ).active_b
    return active_b * 1e9


def drafter_token_ratio(target: Mapping[str, object], drafter: Mapping[str, object]) -> float:
    """The drafter's cost per token as a share of the target's, from their shapes (`params_per_token`): on a
    compute-bound device (a CPU) a token costs in proportion to the weights it is multiplied by."""
    return params_per_token(drafter) / params_per_token(target)


class RooflineStepCost:
    """Step times from the model backend's roofline for one GPU (see the module docstring for the composition).

    ``backend``: a `ModelBackend` for the target and GPU (its calibration applies). ``drafter``: the speculative
    config whose drafter drafts (any K; each depth is priced with its own K); None for a no-speculation engine.
    ``context_bucket``: contexts are rounded to this many tokens so repeated shapes are priced once.
    """

    def __init__(self, backend: ModelBackend, drafter: SpecConfig | None, *, context_bucket: int = 64) -> None:
        if drafter is not None and not drafter.speculative:
            drafter = None
        if drafter is not None:
            backend.drafter_for(drafter)  # fail early on an unknown or incompatible drafter
        self.backend = backend
        self.drafter = drafter
        self.context_bucket = max(int(context_bucket), 1)
        self._cache: dict[tuple[int, int, int, int, int, int, bool], float] = {}
        self._steps: dict[tuple[int, int, int], StepTime] = {}
        self._piecewise: dict[tuple[int, int, int], float] = {}

    @property
    def label(self) -> str:
        return f"model backend {self.backend.step_cost_source}, {self.backend.device}"

    @property
    def full_graphs(self) -> bool:
        """A GPU: vLLM's default graph mode there is FULL_AND_PIECEWISE (`autotune.engine.predict_variant`)."""
        return True

    def piecewise_ms(self, drafting_depth: int, context: int) -> float:
        """The PIECEWISE penalty of a step whose drafter drafts ``drafting_depth`` (0: a plain launch's step):
        `ModelBackend.piecewise_penalty_ms` of that launch, calibrated."""
        key = (-1, drafting_depth, context)
        cached = self._piecewise.get(key)
        if cached is None:
            config = SpecConfig() if drafting_depth == 0 or self.drafter is None else \
                self.drafter.with_(num_speculative_tokens=drafting_depth)
            cached = self._piecewise[key] = self.backend.piecewise_penalty_ms(config, float(context))
        return cached

    def _step(self, batch: int, k: int, context: int) -> StepTime:
        key = (batch, k, context)
        st = self._steps.get(key)
        if st is None:
            if k == 0 or self.drafter is None:
                config = SpecConfig()
            else:
                config = self.drafter.with_(num_speculative_tokens=k)
            st = self._steps[key] = self.backend.step(config, batch, float(context))
        return st

    def _target_ms(self, batch: int, depth: float, context: int) -> float:
        """Target pass (with its overheads, without speculation overhead) at mean verified depth ``depth``."""
        lo = int(math.floor(depth))
        frac = depth - lo
        a = self._step(batch, lo, context)
        ms = a.verify_side_ms - a.spec_overhead_ms
        if frac > 1e-9:
            b = self._step(batch, lo + 1, context)
            ms += frac * ((b.verify_side_ms - b.spec_overhead_ms) - ms)
        return ms

    def step_ms(self, shape: StepShape) -> float:
        bucket = self.context_bucket
        context = max(bucket, int(round(shape.context_tokens / bucket)) * bucket)
        draft_depth = shape.drafting_depth if self.drafter is not None else 0
        key = (shape.batch_size, shape.verified_tokens, draft_depth, context, shape.prefill_tokens,
               shape.prefill_requests, shape.piecewise)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        b = shape.batch_size
        verify = 0.0
        spec = 0.0
        draft = 0.0
        drafting_batch = b if b > 0 else shape.prefill_requests
        if b > 0:
            verify = self._target_ms(b, shape.verified_tokens / b - 1.0, context)
        if draft_depth > 0:
            st = self._step(drafting_batch, draft_depth, context)
            spec = st.spec_overhead_ms
            draft = st.draft_side_ms
        if shape.prefill_tokens > 0:
            verify += self._prefill_marginal_ms(shape, context)
        calibration = self.backend.calibration
        ms = calibration.apply(verify + spec, draft) if calibration is not None else verify + spec + draft
        if shape.piecewise:
            ms += self.piecewise_ms(draft_depth, context)
        self._cache[key] = ms
        return ms

    def _prefill_marginal_ms(self, shape: StepShape, context: int) -> float:
        """Extra target-pass time for the prompt tokens of a mixed step (all of it for a prefill-only step)."""
        backend = self.backend
        prompt_ctx = shape.prefill_tokens / max(shape.prefill_requests, 1) / 2.0
        requests = shape.batch_size + shape.prefill_requests
        mean_ctx = (shape.batch_size * context + shape.prefill_requests * prompt_ctx) / requests
        full = backend.target_pass_ms(shape.verified_tokens + shape.prefill_tokens, requests, mean_ctx)
        if shape.batch_size == 0:
            return full
        decode_only = backend.target_pass_ms(shape.verified_tokens, shape.batch_size, float(context))
        return max(full - decode_only, 0.0)


def controller_cost_model(
    source: StepCostSource,
    max_k: int,
    batch_sizes: Sequence[int],
    context_tokens: float,
    *,
    drafter_always_runs: bool = True,
) -> StepCostModel:
    """The linear `StepCostModel` a profile of this GPU would give the depth controller: a fit of ``source`` over a
    grid of batch sizes x uniform verified depths 0..max_k, plus no-speculation steps (the profile's baseline
    launch). ``drafter_always_runs``: depth applied by trimming (the drafter drafts max_k in every step, as the
    shipped plugin does with parallel drafting); False: the drafter drafts the verified depth and skips depth 0.
    The samples are priced as FULL-graph steps; `StepCostModel.with_graphs` adds the PIECEWISE prior for a launch.
    """
    if not batch_sizes:
        raise UsageError("controller_cost_model needs at least one batch size.")
    samples = []
    for b in sorted(set(batch_sizes)):
        plain = source.step_ms(StepShape(b, b, 0, context_tokens))
        samples.append(StepSample(b, 0, plain, verified_tokens=b, drafter_ran=False, piecewise=False))
        for k in range(max_k + 1):
            d = max_k if drafter_always_runs else k
            if d == 0:
                continue
            ms = source.step_ms(StepShape(b, b * (k + 1), d, context_tokens))
            samples.append(StepSample(b, k, ms, verified_tokens=b * (k + 1), drafter_ran=True, piecewise=False))
    return StepCostModel.fit(samples)
