"""The trials table: one row per evaluated configuration of a search study, unique by (study, number)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from store import _validate as v
from store._bad_rows import BadRowError, readable, unicode_problem
from store._models import TRIAL_STATUSES, Trial, utcnow
from store._records import StudySummary, TrialRecord
from store._rows import Repository, get_or_create, get_row, record_of, set_given, where_given
from store._studies import Direction, checked_directions, study_summaries
from store.exceptions import DuplicateRecordError


class Trials(Repository):
    def add_trial(
        self,
        study: str,
        *,
        number: int,
        model: str,
        config: Mapping[str, Any],
        backend: str,
        scenario: Mapping[str, Any] | None = None,
        values: Mapping[str, float] | None = None,
        metrics: Mapping[str, Any] | None = None,
        status: str = "complete",
        failure_reason: str | None = None,
        provenance: Mapping[str, Any] | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store trial `number` of `study`; returns its id. (study, number) is unique: storing it again raises
        `DuplicateRecordError` (use `update_trial` to change it); a refused value raises `InvalidRecordError`.

        values: {objective: value} in the objective's unit (tokens/s, ms); backend: "vllm" or "model".
        """
        row = _trial_row(study, number=number, model=model, config=config, backend=backend, scenario=scenario,
                         values=values, metrics=metrics, status=status, failure_reason=failure_reason,
                         provenance=provenance, created_at=created_at)
        with self._session() as session:
            stored, created = get_or_create(
                session, select(Trial).where(Trial.study == study, Trial.number == number), lambda: row
            )
            if not created:
                raise DuplicateRecordError(
                    f"Trial {number} of study {study!r} is already stored (id {stored.id}); trial numbers are unique "
                    f"per study. Use update_trial({stored.id}, ...) to change it."
                )
            return stored.id

    def add_trials(self, study: str, trials: Sequence[Mapping[str, Any]]) -> int:
        """Store trials of `study` in one transaction, each given as `add_trial`'s keyword arguments; numbers stored
        already are skipped. Returns how many were stored. A refused value raises `InvalidRecordError` and stores
        none; a concurrent writer of the same numbers makes it store them one by one, skipping theirs."""
        rows = [_trial_row(study, **t) for t in trials]
        try:
            with self._session() as session:
                stored = set(session.scalars(select(Trial.number).where(Trial.study == study)))
                new = {row.number: row for row in rows if row.number not in stored}
                session.add_all(new.values())
            return len(new)
        except DuplicateRecordError:
            added = 0
            for t in trials:
                try:
                    self.add_trial(study, **t)
                    added += 1
                except DuplicateRecordError:
                    pass
            return added

    def update_trial(
        self,
        trial_id: int,
        *,
        status: str | None = None,
        values: Mapping[str, float] | None = None,
        metrics: Mapping[str, Any] | None = None,
        failure_reason: str | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        """Finish or correct a stored trial (e.g. "running" -> "complete"); None arguments keep the stored value."""
        changes = {
            "status": None if status is None else v.choice("status", status, TRIAL_STATUSES),
            "values": None if values is None else v.objective_values(values),
            "metrics": None if metrics is None else v.json_dict("metrics", metrics),
            "failure_reason": v.optional_text("failure_reason", failure_reason, limit=None, name=False),
            "provenance": None if provenance is None else v.json_dict("provenance", provenance),
        }
        with self._session() as session:
            set_given(get_row(session, Trial, trial_id, f"No trial with id {trial_id}."), **changes)

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self._session() as session:
            return trial_record(get_row(session, Trial, trial_id, f"No trial with id {trial_id}."))

    def list_trials(
        self, study: str | None = None, *, model: str | None = None, status: str | None = None
    ) -> list[TrialRecord]:
        """Trials (filtered if asked) in the order they were run: by study, then trial number."""
        if status is not None:
            v.choice("status", status, TRIAL_STATUSES)
        query = where_given(
            select(Trial).order_by(Trial.study, Trial.number),
            (study, Trial.study == study),
            (model, Trial.model == model),
            (status, Trial.status == status),
        )
        with self._session() as session:
            return list(readable(session.scalars(query), trial_record, self._bad_row))

    def list_studies(self, directions: Mapping[str, Direction] | None = None) -> list[StudySummary]:
        """One summary per study in our trials table, most recently active first.

        The best value of an objective is the max over complete trials, or the min where `directions` marks it
        "minimize"; objectives not in `directions` get no best value (the store does not guess which way is better:
        take directions from `autotune.search.Objective`).
        """
        query = select(
            Trial.id, Trial.study, Trial.number, Trial.model, Trial.status, Trial.values, Trial.created_at
        ).order_by(Trial.study, Trial.number)
        checked = checked_directions(directions)
        with self._session() as session:
            rows = session.execute(query).all()
        return study_summaries([row for row in rows if self._summarisable(row)], checked)

    def _summarisable(self, row: Any) -> bool:
        """Whether a (study, model, values) row of the trials table can be summarised; if not, it is reported."""
        problem = None
        for name, limit in (("study", Trial.study.type.length), ("model", Trial.model.type.length)):
            text = getattr(row, name)
            why = unicode_problem(text) or (
                f"is {len(text):,} characters long, more than the {limit:,} its column holds" if len(text) > limit
                else None
            )
            problem = problem or (f"{name} {why}" if why else None)
        if problem is None and not (
            isinstance(row.values, dict)
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in row.values.values())
        ):
            problem = "values is not a JSON object of numbers"
        if problem is None:
            return True
        self._bad_row(BadRowError(Trial.__tablename__, row.id, problem))
        return False

def trial_record(row: Trial) -> TrialRecord:
    return record_of(TrialRecord, row, values={k: float(x) for k, x in row.values.items()})


def _trial_row(
    study: str,
    *,
    number: int,
    model: str,
    config: Mapping[str, Any],
    backend: str,
    scenario: Mapping[str, Any] | None = None,
    values: Mapping[str, float] | None = None,
    metrics: Mapping[str, Any] | None = None,
    status: str = "complete",
    failure_reason: str | None = None,
    provenance: Mapping[str, Any] | None = None,
    created_at: dt.datetime | None = None,
) -> Trial:
    """A new trials row, every value checked (`InvalidRecordError` names the one refused)."""
    return Trial(
        study=v.text("study", study),
        number=v.integer("number", number, minimum=0),
        model=v.text("model", model),
        config=v.json_dict("config", config),
        scenario=v.json_dict("scenario", scenario),
        values=v.objective_values(values),
        metrics=v.json_dict("metrics", metrics),
        status=v.choice("status", status, TRIAL_STATUSES),
        failure_reason=v.optional_text("failure_reason", failure_reason, limit=None, name=False),
        backend=v.text("backend", backend, limit=v.SHORT_CHARS),
        provenance=v.json_dict("provenance", provenance),
        created_at=v.timestamp("created_at", created_at, default=utcnow()),
    )
