"""The recommendations table: the configuration a search recommends, with what it was tuned for."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, false, select, text, update
from sqlalchemy.orm import Session

from store import _validate as v
from store._bad_rows import first_readable, readable
from store._models import Recommendation, utcnow
from store._records import RecommendationRecord
from store._rows import Repository, get_row, limited, record_of, where_given


class Recommendations(Repository):
    def add_recommendation(
        self,
        model: str,
        *,
        gpu: str,
        objective: str,
        best_config: Mapping[str, Any],
        scenario: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        provenance: Mapping[str, Any] | None = None,
        pareto: Sequence[Any] | None = None,
        schedule: Sequence[Any] | None = None,
        class_policy: Mapping[str, Any] | None = None,
        vllm_version: str | None = None,
        workload_name: str | None = None,
        workload_hash: str | None = None,
        study: str | None = None,
        created_at: dt.datetime | None = None,
    ) -> int:
        """Store a recommendation for `model` on `gpu` ("cpu" or GPU name); returns its id.

        One recommendation per scenario of a `study`: when the study already holds one for the same model, GPU,
        objective, workload and scenario, it is updated in place with these fields and keeps its id (several workers
        sharing a study each store when they finish; the last to finish has seen every trial, so its result is the
        one kept; a re-run that extends the study updates it the same way). Writers of one study take turns (SQLite:
        the write lock, taken before looking; PostgreSQL: an advisory lock on the study), so concurrent workers store
        one row, never one each.
        """
        row = Recommendation(
            model=v.text("model", model),
            gpu=v.text("gpu", gpu, limit=v.DEVICE_CHARS),
            vllm_version=v.optional_text("vllm_version", vllm_version, limit=v.SHORT_CHARS),
            workload_name=v.optional_text("workload_name", workload_name),
            workload_hash=v.optional_text("workload_hash", workload_hash, limit=v.HASH_CHARS),
            objective=v.text("objective", objective, limit=v.SHORT_CHARS),
            scenario=v.json_dict("scenario", scenario),
            best_config=v.json_dict("best_config", best_config),
            metrics=v.json_dict("metrics", metrics),
            provenance=v.json_dict("provenance", provenance),
            pareto=v.json_list("pareto", pareto),
            schedule=v.json_list("schedule", schedule),
            class_policy=v.json_dict("class_policy", class_policy),
            study=v.optional_text("study", study),
            created_at=v.timestamp("created_at", created_at, default=utcnow()),
        )
        with self._session() as session:
            if row.study is not None:
                _take_turns(session, row.study)
                stored = next((r for r in session.scalars(
                    select(Recommendation).where(Recommendation.study == row.study).order_by(Recommendation.id.desc())
                ) if all(getattr(r, name) == getattr(row, name) for name in _SCENARIO)), None)
                if stored is not None:
                    if not all(getattr(stored, name) == getattr(row, name) for name in _CONTENT):
                        for name in (*_CONTENT, "created_at"):
                            setattr(stored, name, getattr(row, name))
                    return stored.id
            session.add(row)
            session.flush()
            return row.id

    def get_recommendation(self, recommendation_id: int) -> RecommendationRecord:
        with self._session() as session:
            missing = f"No recommendation with id {recommendation_id}. List them with `peagle-tune show`."
            return recommendation_record(get_row(session, Recommendation, recommendation_id, missing))

    def list_recommendations(self, model: str | None = None, *, limit: int | None = None) -> list[RecommendationRecord]:
        """Recommendations (for `model` if given), newest first."""
        query = limited(_newest_first(model=model), limit)
        with self._session() as session:
            return list(readable(session.scalars(query), recommendation_record, self._bad_row))

    def latest_recommendation(
        self,
        model: str | None = None,
        *,
        gpu: str | None = None,
        workload_hash: str | None = None,
        objective: str | None = None,
    ) -> RecommendationRecord | None:
        """The newest recommendation matching every filter given, or None if there is none."""
        query = _newest_first(model=model, gpu=gpu, workload_hash=workload_hash, objective=objective)
        with self._session() as session:
            return first_readable(session, query, recommendation_record, self._bad_row)


#: The columns that make two recommendations the same (all but the id and the time of storing).
_CONTENT = tuple(c.key for c in Recommendation.__table__.columns if c.key not in ("id", "created_at"))
#: What makes two recommendations of one study the same scenario's (the rest is the result, which may be updated).
_SCENARIO = ("model", "gpu", "objective", "workload_name", "workload_hash", "scenario")


def _take_turns(session: Session, study: str) -> None:
    """Hold, until this transaction ends, the lock that makes look-then-insert on `study`'s recommendations atomic.

    SQLite: a write statement takes the database's write lock now (in WAL mode that also means reading the newest
    commit), so no other writer can insert between our look and our insert. PostgreSQL: a transaction-scoped
    advisory lock keyed by the study name; other writers of the study wait for it.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        session.execute(update(Recommendation).where(false()).values(id=Recommendation.id))
    elif dialect == "postgresql":
        digest = hashlib.sha256(f"peagle-recommendation:{study}".encode()).digest()[:8]
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": int.from_bytes(digest, "big", signed=True)})


def _newest_first(
    *,
    model: str | None = None,
    gpu: str | None = None,
    workload_hash: str | None = None,
    objective: str | None = None,
) -> Select[Recommendation]:
    """Recommendations matching every filter given, newest first (the later insert first on equal timestamps)."""
    return where_given(
        select(Recommendation).order_by(Recommendation.created_at.desc(), Recommendation.id.desc()),
        (model, Recommendation.model == model),
        (gpu, Recommendation.gpu == gpu),
        (workload_hash, Recommendation.workload_hash == workload_hash),
        (objective, Recommendation.objective == objective),
    )


def recommendation_record(row: Recommendation) -> RecommendationRecord:
    """The record of a recommendation row; its torch_version comes from the provenance dict (None if it has none)."""
    torch_version = row.provenance.get("torch_version")
    return record_of(
        RecommendationRecord, row, torch_version=torch_version if isinstance(torch_version, str) else None
    )
