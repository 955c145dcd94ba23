"""Step-cost terms a profile's linear fit cannot see, derived from the profile itself (ms, measured or derived).

The fitted `policies.StepCostModel` is made of decode-only steps with the drafter at full width or plainly off, and
prices a drafter-off step of a speculative engine like a no-speculation step. These terms complete it for the simulator
(`FittedStepCost`):

- `idle_drafter_ms`: a speculative engine's step whose drafter is skipped costs more than a plain engine's step of
  the same batch (the speculative launch's bookkeeping, the plugin's plan mode). Measured: the profile's speculative
  launch's drafter-off steps at depth 0 minus its no-speculation launch's steps at the same batch size, averaged
  with the former's step counts as weights.
- `drafter_token_ms`: the drafter's cost per token it replays after off-steps. Derived: the fit's
  ``per_verified_token`` is the target's plus the drafter's cost per token (the drafter reads every verified token;
  the slope comes from speculative steps of different depths), split in the ratio r of the two models' weights per
  token (`drafter_token_ratio`, how a compute-bound device such as a CPU prices a token): ``per_verified_token *
  r / (1 + r)``.

- `prompt_token_costs`: what a prompt token costs the target, measured on the profile's no-speculation steps with
  prompt tokens (the plugin records them apart from the decode steps the fit is made of: ``mixed_step_costs`` in its
  statistics). A CPU computes a prompt's tokens in one large pass, cheaper per token than the decode steps the fit's
  slope comes from (on the CPU fixtures ~0.10 ms against the fit's ~0.13, which also holds the drafter's share).
  Given, `FittedStepCost` prices prompt tokens with it, and the drafter's reading of them with
  ``drafter_token_ms`` as before.

And one refit: `mean_cost_model`. The profile's samples are the *median* step time per shape, but a run's duration
is the sum of its steps, i.e. their *mean* times the count, and CPU steps have a tail (on the CPU fixtures at
B = 1, depth 1, the mean is ~4% above the median). The plugin statistics of the profile's launches record each
shape's sum and count, so the simulator can refit the same linear model on the per-shape means
(``PluginStats.step_samples(statistic="mean")`` of `policies.plugin`) and price steps as a run pays them. A profile
keeps those means when its analysis recorded them (`profile_step_means`: ``notes["step_means"]`` of a stored
profile), and `profile_setup` prices with the refit when they are there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.engine import model_config_json
from autotune.simulate._cost import drafter_token_ratio
from policies import StepCostModel, StepSample

__all__ = [
    "ProfileTerms",
    "drafter_token_ms",
    "idle_drafter_ms",
    "mean_cost_model",
    "model_config",
    "prompt_token_costs",
    "profile_step_means",
    "profile_terms",
]


def _get(sample: Any, key: str) -> Any:
    return sample.get(key) if isinstance(sample, Mapping) else getattr(sample, key, None)


def idle_drafter_ms(step_samples: Iterable[Any], baseline_samples: Iterable[Any]) -> tuple[float, int] | None:
    """(ms, steps it rests on): the speculative launch's drafter-off depth-0 steps (``drafter_ran`` false,
    ``verified_tokens == batch_size``) minus the no-speculation launch's mean step at the same batch size, weighted
    by the former's ``n``; clipped at 0. None when no batch size has both."""
    base: dict[int, tuple[float, int]] = {}
    for s in baseline_samples:
        b, n, ms = int(_get(s, "batch_size")), int(_get(s, "n") or 1), float(_get(s, "step_ms"))
        total, count = base.get(b, (0.0, 0))
        base[b] = (total + ms * n, count + n)
    excess = 0.0
    weight = 0
    for s in step_samples:
        b = int(_get(s, "batch_size"))
        verified = _get(s, "verified_tokens")
        if _get(s, "drafter_ran") or b not in base or (verified is not None and int(verified) != b):
            continue
        if verified is None and int(_get(s, "depth") or 0) != 0:
            continue
        n = int(_get(s, "n") or 1)
        total, count = base[b]
        excess += (float(_get(s, "step_ms")) - total / count) * n
        weight += n
    if not weight:
        return None
    return max(excess / weight, 0.0), weight


def prompt_token_costs(
    prompt_steps: Mapping[str, Iterable[Mapping[str, Any]]], cost_model: StepCostModel
) -> tuple[float, int] | None:
    """(the target's ms per prompt token, prompt tokens it rests on), measured on the no-speculation launch's steps
    with prompt tokens; None without such steps.

    ``prompt_steps``: {"baseline": [...], ...}, each entry one phase's steps with prompt tokens as the scheduler plugin
    sums them (``PluginStats.mixed_step_costs``: "phase", "drafter_ran", "n", "sum_ms", "prompt_tokens", "requests";
    the warm-up is left out). The price is the entries' time beyond the fit's decode step of the same batch (every
    request counted as verifying one token), over their prompt tokens (a ratio of sums: a phase weighs with its
    tokens).
    """
    ms = 0.0
    tokens = 0
    for e in prompt_steps.get("baseline") or ():
        try:  # a stored profile's notes: skip what is not a well-formed entry
            n, prompt, sum_ms = int(e.get("n") or 0), int(e.get("prompt_tokens") or 0), float(e["sum_ms"])
            per_step = float(e.get("requests") or n) / max(n, 1)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if e.get("phase") == "warmup" or n <= 0 or prompt <= 0 or e.get("drafter_ran") or not math.isfinite(sum_ms):
            continue
        b = max(int(round(per_step)), 1) if math.isfinite(per_step) else 1
        ms += sum_ms - n * cost_model.predict_tokens(b, b, False)
        tokens += prompt
    return (ms / tokens, tokens) if tokens and ms > 0 else None


def profile_step_means(record: Any) -> tuple[list[StepSample], list[StepSample]] | None:
    """A profile's per-shape *mean* step times (ms, measured), as (speculative launch, no-speculation launch), or
    None when it recorded none (profiles analysed by versions that did not record them).

    ``record``: an `autotune.profiling.ProfileResult` (``step_means``, ``baseline_means``), its ``to_dict()``
    (``step_means``), or a stored profile (`store.ProfileRecord` or its dict: ``notes["step_means"]``); the stored
    form is ``{"speculative": [...], "baseline": [...]}`` in the ``step_costs`` form."""
    raw = _get(record, "step_means")
    if raw is None:
        notes = _get(record, "notes")
        raw = notes.get("step_means") if isinstance(notes, Mapping) else None
    if isinstance(raw, Mapping):
        speculative, baseline = raw.get("speculative") or (), raw.get("baseline") or ()
    elif isinstance(raw, Sequence) and not isinstance(raw, str):
        speculative, baseline = raw, _get(record, "baseline_means") or ()
    else:
        return None
    out = [_samples(speculative), _samples(baseline)]
    return (out[0], out[1]) if out[0] else None


def _samples(entries: Iterable[Any]) -> list[StepSample]:
    return [
        e if isinstance(e, StepSample) else StepSample(
            int(e["batch_size"]), int(e["depth"]), float(e["step_ms"]), n=int(e.get("n") or 1),
            verified_tokens=None if e.get("verified_tokens") is None else int(e["verified_tokens"]),
            drafter_ran=None if e.get("drafter_ran") is None else bool(e["drafter_ran"]),
        )
        for e in entries
    ]


def mean_cost_model(
    like: StepCostModel, speculative: Sequence[StepSample], baseline: Sequence[StepSample]
) -> StepCostModel:
    """The profile's linear step-cost model refitted on per-shape means (`profile_step_means`: its speculative and
    its no-speculation launch), with ``like``'s form (``sequential``, ``forgetting``): see the module docstring."""
    return StepCostModel.fit([*speculative, *baseline], sequential=like.sequential, forgetting=like.forgetting)


def drafter_token_ms(cost_model: StepCostModel, target: Mapping[str, Any], drafter: Mapping[str, Any]) -> float:
    """The drafter's ms per replayed token: the fit's ``per_verified_token`` x r / (1 + r), r =
    `drafter_token_ratio` (see the module docstring)."""
    r = drafter_token_ratio(target, drafter)
    return cost_model.coefficients.get("per_verified_token", 0.0) * r / (1.0 + r)


def model_config(path_or_name: Any) -> dict[str, Any] | None:
    """A local model's ``config.json`` (`autotune.engine.model_config_json`), else None (no name, a name not on
    disk, or an unreadable file)."""
    if not path_or_name:
        return None
    try:
        return model_config_json(str(path_or_name))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ProfileTerms:
    """The terms for one profile and where each came from (``None`` source: not available, priced 0)."""

    idle_drafter_ms: float = 0.0
    idle_drafter_source: str | None = None
    drafter_token_ms: float = 0.0
    drafter_token_source: str | None = None
    draft_fetch_ms: float = 0.0
    """Host time of the drafts' fetch after a drafting step (`FittedStepCost`); not in a profile: 0 unless given."""
    draft_fetch_source: str | None = None
    prompt_token_ms: float | None = None
    """The target's ms per prompt token, measured (`prompt_token_costs`); None: prompt tokens at the fit's slope."""
    prompt_token_source: str | None = None

    def describe(self) -> str:
        parts = []
        if self.prompt_token_source and self.prompt_token_ms is not None:
            parts.append(f"prompt tokens {self.prompt_token_ms:.4f} ms each ({self.prompt_token_source})")
        if self.idle_drafter_source:
            parts.append(f"skipped-drafter step +{self.idle_drafter_ms:.2f} ms ({self.idle_drafter_source})")
        if self.drafter_token_source:
            parts.append(f"drafter {self.drafter_token_ms:.4f} ms per extra token ({self.drafter_token_source})")
        if self.draft_fetch_source:
            parts.append(f"draft fetch {self.draft_fetch_ms:.3f} ms per drafting step ({self.draft_fetch_source})")
        return "; ".join(parts) if parts else "no terms beyond the fit"


def profile_terms(
    record: Any,
    cost_model: StepCostModel,
    target_config: Mapping[str, Any] | None = None,
    drafter_config: Mapping[str, Any] | None = None,
) -> ProfileTerms:
    """The terms for a profile record (dict or object with ``step_samples``, ``baseline_samples``, ``model``,
    ``drafter``, and ``prompt_steps`` or ``notes["prompt_steps"]`` when recorded). The model configs default to the
    record's model and drafter when they are local directories."""
    idle = idle_drafter_ms(_get(record, "step_samples") or (), _get(record, "baseline_samples") or ())
    steps = _get(record, "prompt_steps")
    if steps is None:
        notes = _get(record, "notes")
        steps = notes.get("prompt_steps") if isinstance(notes, Mapping) else None
    prompt = prompt_token_costs(steps, cost_model) if isinstance(steps, Mapping) else None
    target = target_config if target_config is not None else model_config(_get(record, "model"))
    drafter = drafter_config if drafter_config is not None else model_config(_get(record, "drafter"))
    out: dict[str, Any] = {}
    if idle is not None:
        out["idle_drafter_ms"] = idle[0]
        out["idle_drafter_source"] = (f"measured in the profile: speculative launch's drafter-off steps minus "
                                      f"no-speculation launch's, {idle[1]} steps")
    if prompt is not None:
        out["prompt_token_ms"] = prompt[0]
        out["prompt_token_source"] = (f"measured in the profile: its no-speculation launch's steps with prompt tokens "
                                      f"beyond the fit's decode step, over {prompt[1]} prompt tokens")
    if target is not None and drafter is not None:
        ratio = drafter_token_ratio(target, drafter)
        out["drafter_token_ms"] = drafter_token_ms(cost_model, target, drafter)
        out["drafter_token_source"] = (f"derived: fit's per_verified_token x r/(1+r), r = drafter/target weights "
                                       f"per token = {ratio:.3f}")
    return ProfileTerms(**out)
