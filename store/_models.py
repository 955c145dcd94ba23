"""SQLAlchemy declarative models of peagle-tune's tables.

Every table name starts with ``peagle_``: Optuna's RDBStorage keeps its own tables (studies, trials, version_info,
alembic_version, ...) in the same database, and our Alembic environment manages only names with this prefix.
Configs, scenarios and metrics are stored as JSON dicts; the store knows nothing of autotune's types.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from store._validate import DEVICE_CHARS, HASH_CHARS, NAME_CHARS, SHORT_CHARS

#: Prefix of every table peagle-tune owns in a database it may share with Optuna.
TABLE_PREFIX = "peagle_"
#: Alembic's version table for our schema (Optuna's Alembic uses the default ``alembic_version``).
VERSION_TABLE = "peagle_alembic_version"

PROFILE_KINDS: tuple[str, ...] = ("measured", "live")
BENCHMARK_MODES: tuple[str, ...] = ("static", "adaptive")
TRIAL_STATUSES: tuple[str, ...] = ("complete", "failed", "pruned", "running")

# Deterministic constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_NAME = NAME_CHARS  # model / drafter / workload / study names and HF ids
_SHORT = SHORT_CHARS  # versions, methods, objectives, backends


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _json(nullable: bool = False) -> Any:
    # none_as_null: a Python None in a nullable JSON column is SQL NULL, not the JSON text 'null'.
    return mapped_column(JSON(none_as_null=True), nullable=nullable)


def _created_at() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Environment(Base):
    """Where a profile was measured. Empty string (not NULL) for unknown text fields keeps the identity unique."""

    __tablename__ = "peagle_environments"
    __table_args__ = (
        UniqueConstraint(
            "device", "gpu_count", "driver", "vllm_version", "torch_version", name="uq_peagle_environments_identity"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device: Mapped[str] = mapped_column(String(DEVICE_CHARS), nullable=False)
    gpu_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    driver: Mapped[str] = mapped_column(String(_SHORT), nullable=False, default="")
    vllm_version: Mapped[str] = mapped_column(String(_SHORT), nullable=False, default="")
    torch_version: Mapped[str] = mapped_column(String(_SHORT), nullable=False, default="")
    created_at: Mapped[dt.datetime] = _created_at()


class Model(Base):
    __tablename__ = "peagle_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(_NAME), nullable=False, unique=True)
    hf_id: Mapped[str | None] = mapped_column(String(_NAME), nullable=True)
    info: Mapped[dict[str, Any]] = _json()
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _created_at()


class Drafter(Base):
    __tablename__ = "peagle_drafters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(_NAME), nullable=False, unique=True)
    target: Mapped[str] = mapped_column(String(_NAME), nullable=False, index=True)
    method: Mapped[str] = mapped_column(String(_SHORT), nullable=False)
    layers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    info: Mapped[dict[str, Any]] = _json()
    created_at: Mapped[dt.datetime] = _created_at()
    updated_at: Mapped[dt.datetime] = _created_at()


class Workload(Base):
    __tablename__ = "peagle_workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(_NAME), nullable=False)
    content_hash: Mapped[str] = mapped_column(String(HASH_CHARS), nullable=False, unique=True)
    classes: Mapped[list[str]] = _json()
    source: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[dt.datetime] = _created_at()


class Profile(Base):
    """Measured (or live) acceptance per class and per draft position plus step costs T(B, K) in ms."""

    __tablename__ = "peagle_profiles"
    __table_args__ = (CheckConstraint("kind IN ('measured', 'live')", name="kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(_NAME), nullable=False, index=True)
    drafter: Mapped[str | None] = mapped_column(String(_NAME), nullable=True, index=True)
    drafter_layers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    method: Mapped[str] = mapped_column(String(_SHORT), nullable=False)
    parallel_drafting: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    max_k: Mapped[int] = mapped_column(Integer, nullable=False)
    environment_id: Mapped[int] = mapped_column(
        ForeignKey("peagle_environments.id", ondelete="RESTRICT"), nullable=False, index=True
    )
    workload_id: Mapped[int | None] = mapped_column(
        ForeignKey("peagle_workloads.id", ondelete="RESTRICT"), nullable=True, index=True
    )
    acceptance: Mapped[dict[str, Any]] = _json()
    step_costs: Mapped[list[dict[str, Any]]] = _json()
    cost_model: Mapped[dict[str, Any] | None] = _json(nullable=True)
    kind: Mapped[str] = mapped_column(String(16), nullable=False, default="measured")
    notes: Mapped[dict[str, Any]] = _json()
    created_at: Mapped[dt.datetime] = _created_at()

    environment: Mapped[Environment] = relationship(lazy="joined")
    workload: Mapped[Workload | None] = relationship(lazy="joined")


class Trial(Base):
    """One evaluated configuration of a search (mirrors an Optuna trial with our own fields)."""

    __tablename__ = "peagle_trials"
    __table_args__ = (
        UniqueConstraint("study", "number", name="uq_peagle_trials_study_number"),
        CheckConstraint("status IN ('complete', 'failed', 'pruned', 'running')", name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study: Mapped[str] = mapped_column(String(_NAME), nullable=False)
    number: Mapped[int] = mapped_column(Integer, nullable=False)
    model: Mapped[str] = mapped_column(String(_NAME), nullable=False, index=True)
    config: Mapped[dict[str, Any]] = _json()
    scenario: Mapped[dict[str, Any]] = _json()
    values: Mapped[dict[str, float]] = _json()
    metrics: Mapped[dict[str, Any]] = _json()
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    backend: Mapped[str] = mapped_column(String(_SHORT), nullable=False)
    provenance: Mapped[dict[str, Any]] = _json()
    created_at: Mapped[dt.datetime] = _created_at()


class Recommendation(Base):
    """The configuration a search recommends for (model, GPU, vLLM version, workload, objective)."""

    __tablename__ = "peagle_recommendations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(_NAME), nullable=False, index=True)
    gpu: Mapped[str] = mapped_column(String(DEVICE_CHARS), nullable=False)
    vllm_version: Mapped[str | None] = mapped_column(String(_SHORT), nullable=True)
    workload_name: Mapped[str | None] = mapped_column(String(_NAME), nullable=True)
    workload_hash: Mapped[str | None] = mapped_column(String(HASH_CHARS), nullable=True, index=True)
    objective: Mapped[str] = mapped_column(String(_SHORT), nullable=False)
    scenario: Mapped[dict[str, Any]] = _json()
    best_config: Mapped[dict[str, Any]] = _json()
    metrics: Mapped[dict[str, Any]] = _json()
    provenance: Mapped[dict[str, Any]] = _json()
    pareto: Mapped[list[dict[str, Any]]] = _json()
    schedule: Mapped[list[Any]] = _json()
    class_policy: Mapped[dict[str, Any]] = _json()
    study: Mapped[str | None] = mapped_column(String(_NAME), nullable=True)
    created_at: Mapped[dt.datetime] = _created_at()


class Benchmark(Base):
    """A recommendation served as it will be (plain `vllm serve` or `peagle-tune serve`) and measured by vLLM's own
    ``vllm bench serve`` (`peagle-tune bench`): the measured figures beside the recommendation they check."""

    __tablename__ = "peagle_benchmarks"
    __table_args__ = (CheckConstraint("mode IN ('static', 'adaptive')", name="mode"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    recommendation_id: Mapped[int] = mapped_column(
        ForeignKey("peagle_recommendations.id", ondelete="CASCADE"), nullable=False, index=True
    )
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    concurrency: Mapped[int] = mapped_column(Integer, nullable=False)
    num_prompts: Mapped[int] = mapped_column(Integer, nullable=False)
    figures: Mapped[dict[str, Any]] = _json()
    provenance: Mapped[dict[str, Any]] = _json()
    commands: Mapped[dict[str, Any]] = _json()
    created_at: Mapped[dt.datetime] = _created_at()
