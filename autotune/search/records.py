"""Our store's copy of a study's trials: every finished trial is written to the ``trials`` table as well, so
`peagle-tune show`, reports and exports never need Optuna's tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.search.trials import counted, trial_info
from autotune.spec import Scenario, SpecConfig
from store import DuplicateRecordError, Store


@dataclass(frozen=True)
class TrialRecorder:
    """Writes the finished trials of one study (`study`, a scenario of `model`) to `store`."""

    store: Store
    study: str
    model: str
    scenario: Scenario
    value_names: Sequence[str]
    """The objective's value names, in Optuna's order (the keys of a stored trial's ``values``)."""

    def record(
        self,
        number: int,
        config: SpecConfig,
        status: str,
        values: Sequence[float],
        metrics: Mapping[str, Any],
        provenance: Mapping[str, Any],
        failure: str | None,
    ) -> None:
        """Store one finished trial (once: a trial another worker stored already is skipped).

        The store refuses NaN and infinity (PostgreSQL's JSON cannot hold them), and Optuna keeps a trial whose value
        is infinite, so such numbers are stored as null and named in ``metrics["non_finite"]``: the trial is in our
        table exactly when it is in Optuna's. Any other refusal by the store is raised.
        """
        try:
            self.store.add_trial(self.study, **self._fields(number, config, status, values, metrics, provenance,
                                                            failure))
        except DuplicateRecordError:
            pass  # another worker (or an earlier run) stored it already

    def sync(self, trials: Sequence[FrozenTrial]) -> None:
        """Store, in one transaction, the finished trials the table lacks (all of a private study's; a worker killed
        between Optuna's commit and ours)."""
        stored = {t.number for t in self.store.list_trials(study=self.study)}
        rows = []
        for t in trials:
            info = trial_info(t)
            if t.number in stored or not counted(t) or not t.state.is_finished() or "status" not in info:
                continue
            values = list(t.values or []) if t.state == TrialState.COMPLETE else []
            rows.append(self._fields(
                t.number, SpecConfig.from_dict(info["config"]), info["status"], values, info.get("metrics", {}),
                info.get("provenance") or {}, info.get("failure"),
            ))
        if rows:
            self.store.add_trials(self.study, rows)

    def _fields(
        self,
        number: int,
        config: SpecConfig,
        status: str,
        values: Sequence[float],
        metrics: Mapping[str, Any],
        provenance: Mapping[str, Any],
        failure: str | None,
    ) -> dict[str, Any]:
        """`Store.add_trial`'s keyword arguments for one trial, non-finite numbers stored as null (see `record`)."""
        named = dict(zip(self.value_names, values, strict=False))
        finite = {k: v for k, v in named.items() if math.isfinite(v)}
        non_finite = [f"values.{k}={v!r}" for k, v in named.items() if k not in finite]
        clean_metrics = _finite(dict(metrics), "metrics", non_finite)
        clean_provenance = _finite(dict(provenance), "provenance", non_finite)
        if non_finite:
            clean_metrics["non_finite"] = non_finite
        return {
            "number": number, "model": self.model, "config": config.to_dict(), "scenario": self.scenario.to_dict(),
            "values": finite, "metrics": clean_metrics, "status": status, "failure_reason": failure,
            "backend": str(provenance.get("backend", "?")), "provenance": clean_provenance,
        }


def _finite(value: Any, where: str, found: list[str]) -> Any:
    """`value` with every NaN/infinite float replaced by None; each one's path is appended to `found`."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append(f"{where}={value!r}")
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v, f"{where}.{k}", found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{where}[{i}]", found) for i, v in enumerate(value)]
    return value
