"""Recording a serving session into the store: the live profile, and the drift warning."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.profiling import step_cost_entries
from autotune.serving._live import (
    DEFAULT_DRIFT_THRESHOLD,
    DEFAULT_MIN_DRAFTS,
    DriftReport,
    LiveProfile,
    check_drift,
    live_profile,
    profile_notes,
)
from autotune.serving._tuned import TunedConfig
from policies.plugin import PluginConfigError, PluginStats

__all__ = ["LiveRecorder"]

_STORE_ENV_KEYS = ("device", "gpu_count", "driver", "vllm_version", "torch_version")


class LiveRecorder:
    """Reads the plugin's stats file and stores what it measured as a profile with ``kind="live"``.

    Each `record` stores the cumulative statistics since the launch as a new profile when there is new data (more
    decode steps than at the last record) and at least one class with acceptance; `store.latest_profile` then
    returns it, so the next `peagle-tune serve` or model-backend search starts from production data. It also
    compares live AL at the static K with the tuned reference (`check_drift`) and logs a re-tune suggestion once
    per drifted set of classes.

    Only classes the served policy knows (`policies.RequestPolicy.known_classes`, at most `policies.MAX_CLASSES`) are
    stored: a live profile seeds later servers and searches, so request labels must never grow it.
    """

    def __init__(
        self,
        store: Any,
        tuned: TunedConfig,
        stats_path: str | Path,
        *,
        log: Callable[[str], None] = print,
        environment: Mapping[str, Any] | None = None,
        drift_threshold: float = DEFAULT_DRIFT_THRESHOLD,
        min_drafts: int = DEFAULT_MIN_DRAFTS,
        session: str | None = None,
    ) -> None:
        self.store = store
        self.tuned = tuned
        self.stats_path = Path(stats_path)
        self.log = log
        self.drift_threshold = drift_threshold
        self.min_drafts = min_drafts
        self.session = session or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        self._environment = dict(environment) if environment is not None else None
        self._recorded_steps = -1
        self._warned: frozenset[str] = frozenset()
        self.profile_ids: list[int] = []
        """Ids of the live profiles stored so far (newest last)."""
        self.last_drift: DriftReport | None = None
        self.last_live: LiveProfile | None = None

    def read(self) -> LiveProfile | None:
        """The live profile in the stats file now (None: no file yet, or unreadable)."""
        if not self.stats_path.is_file():
            return None
        try:
            stats = PluginStats.load(self.stats_path)
        except PluginConfigError as exc:
            self.log(f"peagle-tune serve: cannot read the plugin statistics ({exc}); will retry.")
            return None
        return live_profile(stats, sequential=not self.tuned.spec.parallel_drafting)

    def record(self) -> int | None:
        """Store a live profile if there is new data; check drift. Returns the new profile id (None: nothing new)."""
        live = self.read()
        if live is None:
            return None
        live = self._known_classes_only(live)
        self.last_live = live
        if live.fallback and live.errors and self._recorded_steps < 0:
            self.log(f"peagle-tune serve: the scheduler plugin fell back to the static depth: {live.errors[0]}")
        self._check_drift(live)
        if live.decode_steps <= self._recorded_steps or not live.acceptance:
            return None
        profile_id = self._store(live)
        self._recorded_steps = live.decode_steps
        self.profile_ids.append(profile_id)
        return profile_id

    def _known_classes_only(self, live: LiveProfile) -> LiveProfile:
        known = self.tuned.policy.known_classes
        if all(c in known for c in live.acceptance):
            return live
        keep = {c: p for c, p in live.acceptance.items() if c in known}
        return dataclasses.replace(live, acceptance=keep, judged={c: j for c, j in live.judged.items() if c in keep})

    def _check_drift(self, live: LiveProfile) -> None:
        reference = self.tuned.reference_acceptance_length()
        if not reference:
            return
        report = check_drift(
            live.acceptance, live.judged, reference, self.tuned.static_k,
            threshold=self.drift_threshold, min_drafts=self.min_drafts,
        )
        self.last_drift = report
        drifted = frozenset(r["class"] for r in report.rows if r["drifted"])
        if drifted and drifted != self._warned:
            hint = (self.tuned.recommendation.get("workload_name") or "WORKLOAD")
            self.log("peagle-tune serve: " + report.message(self.tuned.model, hint))
        self._warned = drifted

    def _store(self, live: LiveProfile) -> int:
        tuned = self.tuned
        spec = tuned.spec
        env = self._environment
        if env is None:
            from autotune.environment import detect_environment

            env = self._environment = detect_environment()
        env_id = self.store.environment_id({k: env.get(k) for k in _STORE_ENV_KEYS})
        if live.cost_model is not None:
            cost = live.cost_model.to_dict()
            cost_source = "fitted to this session's step times (least squares)"
        elif tuned.cost_model is not None:
            cost = tuned.cost_model.to_dict()
            cost_source = f"carried over from {tuned.cost_source} (too few step shapes to refit)"
        else:
            cost, cost_source = None, "none"
        notes = profile_notes(
            live,
            {
                "session": self.session,
                "recommendation_id": tuned.recommendation.get("id"),
                "static_k": tuned.static_k,
                "served_k": spec.k,
                "prior_profile_id": None if tuned.profile is None else tuned.profile.get("id"),
                "cost_model_source": cost_source,
                "drift": None if self.last_drift is None else list(self.last_drift.rows),
            },
        )
        return int(
            self.store.add_profile(
                tuned.model,
                method=spec.method,
                max_k=max(p.max_k for p in live.acceptance.values()),
                environment_id=env_id,
                acceptance={c: p.to_dict() for c, p in sorted(live.acceptance.items())},
                step_costs=step_cost_entries(live.step_samples),
                drafter=spec.drafter,
                drafter_layers=spec.drafter_layers,
                parallel_drafting=spec.parallel_drafting,
                cost_model=cost,
                kind="live",
                notes=notes,
            )
        )
