"""What `peagle-tune serve` serves: the tuned config looked up in the store, and the plugin config built from it.

Lookup order:

1. the recommendation: ``--recommendation ID``, else the one `autotune.selection` chooses for this model and this
   machine's device (its one matching search's highest concurrency; the CLI chooses first, by its options);
2. a policy file (``--policy FILE``, written by ``peagle-tune export --format policy``) overrides the recommendation's
   request policy (classes, caps, floors, static K, max K, controller settings);
3. acceptance priors and the step-cost model: the newest stored profile (measured or live) of this model and drafter
   on this device; without one, acceptance comes from the recommendation's acceptance length and the step cost from
   the roofline (catalog models on catalog GPUs only); without any step-cost model the plugin serves at the static
   K with the class caps (no adaptation) and says so.

``--drafter D`` always serves D. With no recommendation for the model on this device (a cold start), or one that
says "no speculation", the controller starts from the default settings at fallback depth 0 (no speculation) and
learns acceptance and step costs online (`COLD_START_COST` when neither a profile nor the roofline knows the step
cost): it decides when speculation pays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, NotFoundError, UnknownModelError, UsageError
from autotune.safe_text import shell_word
from autotune.spec import SpecConfig
from policies import AcceptanceProfile, ClassPolicy, RequestPolicy, StepCostModel, load_policy
from policies.plugin import PluginConfig

__all__ = ["COLD_START_COST", "TunedConfig", "plugin_config", "resolve_tuned_config"]

COLD_START_COST: dict[str, float] = {"base": 1.0, "per_verified_token": 0.05, "drafter_fixed": 0.25}
"""Step-cost prior (ms, `policies.StepCostModel` features) when a drafter is served with neither a profile nor a
roofline: relative, since goodput compares T(B, K) at one B and the online fit (Bayesian least squares in which this
prior counts as one observation with a 10% error; all steps being far slower than predicted, none is set aside as
an outlier) replaces the scale within a few refreshes. A drafter pass at a quarter of the step and a verified token
at 5% (decode is memory-bound): at B = 1, T(1) / T(0) = 1.35 / 1.05 = 1.29, so depth 1 pays when AL(1) > 1.29; the
untrained estimator's 0.5 per position (AL(1) = 1.5) passes, so the controller drafts, measures, and goes to depth 0
where it does not pay."""
DEFAULT_COLD_START_K = 4
"""Drafter depth of a cold start when the drafter names no recommended or trained K (`--max-k` overrides)."""

@dataclass(frozen=True)
class TunedConfig:
    """Everything `peagle-tune serve` needs to launch one server, with where each part came from."""

    model: str
    """What vLLM loads and the store's key: a Hugging Face id or an absolute local path."""
    spec: SpecConfig
    """The served config. Its K (``num_speculative_tokens``) is the drafter's depth: the deepest the controller may
    verify (``policy.max_k``, at least the recommendation's K)."""
    policy: RequestPolicy
    """Classes, caps/floors, static K (the fallback depth) and controller settings."""
    recommendation: dict[str, Any]
    """The stored recommendation (its ``to_dict()``)."""
    profile: dict[str, Any] | None = None
    """The stored profile the priors came from (its ``to_dict()``), or None."""
    acceptance: dict[str, AcceptanceProfile] = field(default_factory=dict)
    """Acceptance priors per class seeding the live estimator (measured counts from a profile, or a prediction
    from the recommendation's acceptance length)."""
    acceptance_source: str = ""
    cost_model: StepCostModel | None = None
    """Step-cost model T(B, K) in ms (fitted to a profile's measurements, or predicted by the roofline); None: no
    adaptation is possible and the plugin serves at the static K."""
    cost_source: str = ""
    notes: tuple[str, ...] = ()
    """Human-readable remarks on the lookup (shown by ``peagle-tune serve`` before launching)."""

    @property
    def static_k(self) -> int:
        """The offline-tuned depth: the controller's fallback."""
        return self.policy.static_k

    @property
    def adaptive(self) -> bool:
        """True when the controller can run (speculation on and a step-cost model known)."""
        return self.spec.speculative and self.cost_model is not None

    def reference_acceptance_length(self) -> dict[str, float]:
        """Per class, AL at the static K that live acceptance is compared with (see `autotune.serving.check_drift`):
        the profile's measured counts, else the recommendation's acceptance length under the key ``"*"``."""
        k = self.static_k
        if self.profile is not None and self.acceptance:
            return {cls: p.acceptance_length(k) for cls, p in self.acceptance.items()}
        al = (self.recommendation.get("metrics") or {}).get("acceptance_length")
        return {"*": float(al)} if isinstance(al, int | float) and al >= 1.0 else {}


def resolve_tuned_config(
    store: Any,
    model: str,
    *,
    recommendation_id: int | None = None,
    policy_path: str | Path | None = None,
    drafter: str | None = None,
    device: str | None = None,
    max_k: int | None = None,
) -> TunedConfig:
    """Look up the tuned config for ``model`` on ``device`` (default: this machine's) in ``store``.

    ``drafter``: serve this drafter (e.g. a local copy of the recommended one) instead of the recommendation's.
    ``max_k``: the drafter's depth, i.e. the deepest depth the controller may verify (default: the policy file's
    max_k, else the deepest of the recommended K and its class caps).
    Raises `UsageError` (naming the fix) when there is no recommendation, the policy file is broken (a
    `policies.PolicyFileError` naming the key), or the recommended drafter cannot be served.
    """
    from autotune.environment import detect_environment

    device = device or detect_environment()["device"]
    notes: list[str] = []
    try:
        rec = _recommendation(store, model, recommendation_id, device, notes)
    except NotFoundError:
        if drafter is None or recommendation_id is not None:
            raise
        return _cold_start(store, model, drafter, device, max_k, policy_path, notes)
    config = SpecConfig.from_dict(dict(rec.best_config))
    learn = False
    if (rec.metrics or {}).get("hypothetical_drafter") and drafter is None:
        raise UsageError(
            f"Recommendation #{rec.id} names the HYPOTHETICAL drafter {config.drafter!r}: no checkpoint exists, so "
            "vLLM cannot load it. Pass --drafter PATH to serve a real drafter, or re-run `peagle-tune search` "
            "without --include-hypothetical."
        )
    if drafter is not None:
        if not config.speculative:
            learn = True
            config = _drafter_config(drafter).with_(
                max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens
            )
            notes.append(
                f"Recommendation #{rec.id} serves without speculation; serving --drafter {drafter} anyway: the "
                "controller starts at depth 0 (no speculation) and speculates only when live acceptance and step "
                "times say it pays."
            )
        else:
            notes.append(f"Drafter {drafter} replaces the recommended {config.drafter}.")
            config = config.with_(drafter=drafter)

    if policy_path is not None:
        policy = load_policy(policy_path)
        notes.append(f"Request policy from {policy_path} (overrides recommendation #{rec.id}'s classes and caps).")
    else:
        policy = _policy_of(rec.to_dict())
        if learn:  # the no-speculation caps (depth 0) would keep the drafter idle: the controller decides instead
            policy = dataclasses.replace(policy, classes={name: ClassPolicy() for name in policy.classes})
    if config.speculative:
        if max_k is not None:
            depth = max_k
        elif policy_path is not None:
            depth = policy.max_k  # the policy file names the drafter's depth
        elif _full_graphs_here():
            launch = (rec.metrics or {}).get("launch_k")
            depth = max(launch, config.k) if isinstance(launch, int) and not isinstance(launch, bool) else config.k
            if policy.max_k != depth:
                notes.append(
                    f"Launching at K={depth}, the search's fastest K for this config (the policy's max_k is "
                    f"{policy.max_k}): on a GPU only the launch's K replays FULL CUDA graphs, so the controller adapts "
                    "at and below it (pass --max-k to launch at another K).")
        else:
            depth = max(policy.max_k, config.k)
        if depth < policy.static_k:
            raise UsageError(
                f"--max-k {depth} is below the static K {policy.static_k} the server falls back to; pass "
                f"--max-k >= {policy.static_k}."
            )
        try:
            config = config.with_(num_speculative_tokens=depth)
        except ConfigError as exc:
            raise UsageError(
                f"Drafter depth {depth} (from {'--max-k' if max_k is not None else 'the policy max_k'}): {exc}"
            ) from None
        if depth != policy.max_k:
            policy = dataclasses.replace(policy, max_k=depth, classes=_clip_classes(policy.classes, depth))
    else:
        notes.append(f"Recommendation #{rec.id} serves WITHOUT speculation: nothing to adapt; the plugin only "
                     "records step times.")

    tuned = TunedConfig(model=model, spec=config, policy=policy, recommendation=rec.to_dict())
    if not config.speculative:
        return dataclasses.replace(tuned, notes=tuple(notes))
    return _with_priors(store, tuned, device, notes, learn=learn)


def _full_graphs_here() -> bool:
    """Whether vLLM here replays FULL CUDA graphs for a launch's uniform decode steps: a GPU, where its default
    graph mode is FULL_AND_PIECEWISE (`autotune.engine.predict_variant`); every other step runs PIECEWISE
    (`policies._graphs`). The CPU build has no graphs."""
    from autotune.engine._variants import engine_device

    return engine_device() == "cuda"


def _drafter_config(drafter: str, max_k: int | None = None) -> SpecConfig:
    """The speculative config serving ``drafter`` (a catalog name, a local directory or a Hugging Face repo id, as
    `search` takes them) without a tuned one: its method and parallel drafting, at ``max_k``, else its recommended
    (or trained) K, else `DEFAULT_COLD_START_K`."""
    from autotune.search.machine import drafter_spec

    spec = drafter_spec(drafter, None)
    k = max_k if max_k is not None else (spec.recommended_k or spec.trained_k or DEFAULT_COLD_START_K)
    try:
        return SpecConfig.from_dict({"method": spec.method, "drafter": spec.local_path or spec.name,
                                     "num_speculative_tokens": k, "parallel_drafting": spec.parallel_drafting})
    except ConfigError as exc:
        raise UsageError(f"--drafter {drafter}: {exc}") from None


def _cold_start(
    store: Any, model: str, drafter: str, device: str, max_k: int | None, policy_path: str | Path | None,
    notes: list[str],
) -> TunedConfig:
    """No recommendation for ``model`` on ``device``: serve ``drafter`` from the default controller settings (or
    ``policy_path``) with fallback depth 0, learning online."""
    config = _drafter_config(drafter, max_k)
    if policy_path is not None:
        policy = load_policy(policy_path)
        notes.append(f"Request policy from {policy_path}.")
        if max_k is None and policy.max_k >= 1:
            config = config.with_(num_speculative_tokens=policy.max_k)
    else:
        policy = RequestPolicy(static_k=0, max_k=config.k, model=model)
    if policy.max_k != config.k:
        policy = dataclasses.replace(policy, max_k=config.k, static_k=min(policy.static_k, config.k),
                                     classes=_clip_classes(policy.classes, config.k))
    notes.append(
        f"Cold start: no recommendation for {model} on {device}; serving drafter {config.drafter} at K={config.k} "
        "from the default controller settings, learning acceptance and step costs online (run `peagle-tune "
        f"search --model {shell_word(model)}` to tune)."
    )
    tuned = TunedConfig(model=model, spec=config, policy=policy, recommendation={})
    return _with_priors(store, tuned, device, notes, learn=True)


def _recommendation(store: Any, model: str, rec_id: int | None, device: str, notes: list[str]) -> Any:
    if rec_id is not None:
        rec = store.get_recommendation(rec_id)
        if rec.model != model:
            raise UsageError(
                f"Recommendation #{rec_id} is for model {rec.model!r}, not {model!r}. Pass --model "
                f"{shell_word(rec.model)} or the id of a recommendation for {model!r} "
                f"(`peagle-tune show --model {shell_word(model)}`)."
            )
        if rec.gpu != device:
            notes.append(f"Recommendation #{rec_id} was tuned for {rec.gpu}; this machine is {device}.")
        return rec
    from autotune.selection import Criteria, choose_search

    try:  # the rule `peagle-tune serve` selects by: the one search for this device, its highest concurrency
        return choose_search(store.list_recommendations(model=model), Criteria(model=model, gpu=device)).rec
    except NotFoundError:
        pass
    except UsageError as exc:  # a device no catalog knows and nothing stored under its name
        if not isinstance(exc, UnknownModelError):
            raise
    others = sorted({r.gpu for r in store.list_recommendations(model=model)})
    hint = (
        f" There are recommendations for {model} on {', '.join(others)}: pass --recommendation ID to serve one "
        f"of them (`peagle-tune show --model {shell_word(model)}` lists the ids)."
        if others
        else ""
    )
    raise NotFoundError(
        f"There is no recommendation for {model} on this machine's device ({device}). Run `peagle-tune search "
        f"--model {shell_word(model)} --backend vllm` (or `peagle-tune profile` then `peagle-tune search`) first.{hint}"
    )


def _policy_of(rec: Mapping[str, Any]) -> RequestPolicy:
    """The recommendation's request policy (the same document `peagle-tune export --format policy` writes)."""
    from autotune.export import policy_document

    return RequestPolicy.from_dict(policy_document(rec), source=f"recommendation #{rec.get('id')}")


def _clip_classes(classes: Mapping[str, ClassPolicy], depth: int) -> dict[str, ClassPolicy]:
    out = {}
    for name, c in classes.items():
        cap = c.max_k if c.max_k is None else min(c.max_k, depth)
        out[name] = ClassPolicy(max_k=cap, min_k=min(c.min_k, depth if cap is None else cap))
    return out


def _with_priors(store: Any, tuned: TunedConfig, device: str, notes: list[str], *, learn: bool = False) -> TunedConfig:
    """Acceptance priors and the step-cost model: newest profile, else the recommendation and the roofline; with
    ``learn`` (no tuned speculative config) and neither, `COLD_START_COST`, refined online."""
    from autotune.profiling import predictor_from_profile, roofline_cost_model

    spec = tuned.spec
    rec = tuned.recommendation
    names = [n for n in dict.fromkeys([spec.drafter, (rec.get("best_config") or {}).get("drafter")]) if n]
    profile = None
    for name in names:
        candidate = store.latest_profile(tuned.model, drafter=name, device=device)
        if candidate is None:
            continue
        if candidate.parallel_drafting != spec.parallel_drafting:
            notes.append(
                f"Profile #{candidate.id} of {name} was measured with parallel_drafting={candidate.parallel_drafting}"
                f", but the served config has {spec.parallel_drafting}: not used."
            )
            continue
        profile = candidate
        break
    acceptance: dict[str, AcceptanceProfile] = {}
    cost: StepCostModel | None = None
    acceptance_source = cost_source = ""
    if profile is not None:
        try:
            acceptance, cost = predictor_from_profile(profile)
            acceptance_source = cost_source = f"{profile.kind} profile #{profile.id}"
        except ValueError as exc:
            notes.append(f"Profile #{profile.id} is incomplete ({exc}).")
            acceptance = {
                c: AcceptanceProfile.from_dict({k: e[k] for k in ("num_drafts", "accepted_per_position")})
                for c, e in (profile.acceptance or {}).items()
                if int(e.get("num_drafts", 0)) > 0 and e.get("accepted_per_position")
            }
            acceptance_source = f"{profile.kind} profile #{profile.id}" if acceptance else ""
    else:
        notes.append(
            f"No stored profile of {spec.drafter} on {device}: run `peagle-tune profile --model "
            f"{shell_word(tuned.model)} --drafter {shell_word(str(spec.drafter))} --workload W` for measured "
            "acceptance and step costs."
        )
    if not acceptance and rec.get("best_config"):
        al = (rec.get("metrics") or {}).get("acceptance_length")
        base_k = SpecConfig.from_dict(dict(rec["best_config"])).k
        if base_k >= 1 and isinstance(al, int | float) and 1.0 <= al <= base_k + 1:
            prior = AcceptanceProfile.from_acceptance_length(float(al), base_k, max_k=spec.k)
            classes = {tuned.policy.default_class, *tuned.policy.classes}
            acceptance = dict.fromkeys(sorted(classes), prior)
            acceptance_source = (
                f"recommendation #{rec.get('id')} (AL {al:.2f} at K={base_k}, geometric per position: predicted)"
            )
    if cost is None:
        cost = roofline_cost_model(tuned.model, device, spec)
        if cost is not None:
            cost_source = f"roofline for {device} (predicted; refined online from measured step times)"
        elif learn:
            cost = StepCostModel(COLD_START_COST, sequential=not spec.parallel_drafting)
            cost_source = "cold-start prior (relative; learnt online from measured step times)"
        else:
            notes.append(
                "No step-cost model (no profile, and the roofline knows no such model/device): serving at the static "
                f"K={tuned.static_k} with the class caps, without adaptation. Run `peagle-tune profile` to enable it."
            )
    return dataclasses.replace(
        tuned,
        profile=None if profile is None else profile.to_dict(),
        acceptance=acceptance,
        acceptance_source=acceptance_source,
        cost_model=cost,
        cost_source=cost_source,
        notes=tuple(notes),
    )


def plugin_config(
    tuned: TunedConfig,
    stats_path: str | Path | None,
    *,
    flush_every_s: float = 5.0,
    overrides: Mapping[str, Any] | None = None,
) -> PluginConfig:
    """The scheduler plugin's config for ``tuned``: adaptive mode when a step-cost model is known, else static
    mode at the static K; the class caps apply in both (and after a controller fallback). ``overrides``: further
    `PluginConfig` fields (e.g. the plugin's fault-injection test hooks)."""
    caps = {name: c.max_k for name, c in tuned.policy.classes.items() if c.max_k is not None}
    common: dict[str, Any] = {
        "stats_path": None if stats_path is None else str(stats_path),
        "static_depth": tuned.static_k if tuned.spec.speculative else None,
        "class_depths": caps,
        "flush_every_s": flush_every_s,
        **(overrides or {}),
    }
    if not tuned.adaptive:
        # The policy resolves request labels in the engine too (a client's label never raises its cap).
        return PluginConfig(mode="static", **{"policy": tuned.policy.to_dict(), **common})
    assert tuned.cost_model is not None
    known = tuned.policy.known_classes  # priors of classes no request can be in are dead weight (and unbounded)
    adaptive = {
        "policy": tuned.policy.to_dict(),
        "cost_model": tuned.cost_model.to_dict(),
        "acceptance": {cls: p.to_dict() for cls, p in sorted(tuned.acceptance.items()) if cls in known},
    }
    return PluginConfig(mode="adaptive", adaptive=adaptive, **common)
