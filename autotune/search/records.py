"""Our store's copy of a study's trials: every finished trial is written to the ``trials`` table as well, so
`peagle-tune show`, reports and exports never need Optuna's tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.search.trials import counted, trial_info
from autotune.spec import Scenario, SpecConfig
from store import InvalidRecordError, Store


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
        """Store one finished trial (once: a trial another worker stored already is skipped)."""
        try:
            self.store.add_trial(
                study=self.study,
                number=number,
                model=self.model,
                config=config.to_dict(),
                scenario=self.scenario.to_dict(),
                values=dict(zip(self.value_names, values, strict=False)),
                metrics=dict(metrics),
                status=status,
                failure_reason=failure,
                backend=str(provenance.get("backend", "?")),
                provenance=dict(provenance),
            )
        except InvalidRecordError:
            pass  # another worker (or an earlier run) stored it already

    def sync(self, trials: Sequence[FrozenTrial]) -> None:
        """Store finished trials the table lacks (a worker killed between Optuna's commit and ours)."""
        stored = {t.number for t in self.store.list_trials(study=self.study)}
        for t in trials:
            info = trial_info(t)
            if t.number in stored or not counted(t) or not t.state.is_finished() or "status" not in info:
                continue
            values = list(t.values or []) if t.state == TrialState.COMPLETE else []
            self.record(
                t.number, SpecConfig.from_dict(info["config"]), info["status"], values, info.get("metrics", {}),
                info.get("provenance") or {}, info.get("failure"),
            )
