"""Initial schema: environments, models, drafters, workloads, profiles, trials, recommendations.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.JSON:
    return sa.JSON(none_as_null=True)


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "peagle_environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(length=200), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("driver", sa.String(length=64), nullable=False),
        sa.Column("vllm_version", sa.String(length=64), nullable=False),
        sa.Column("torch_version", sa.String(length=64), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_environments")),
        sa.UniqueConstraint(
            "device", "gpu_count", "driver", "vllm_version", "torch_version", name="uq_peagle_environments_identity"
        ),
    )
    op.create_table(
        "peagle_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("hf_id", sa.String(length=300), nullable=True),
        sa.Column("info", _json(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_models")),
        sa.UniqueConstraint("name", name=op.f("uq_peagle_models_name")),
    )
    op.create_table(
        "peagle_drafters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("layers", sa.Integer(), nullable=True),
        sa.Column("info", _json(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_drafters")),
        sa.UniqueConstraint("name", name=op.f("uq_peagle_drafters_name")),
    )
    op.create_index(op.f("ix_peagle_drafters_target"), "peagle_drafters", ["target"], unique=False)
    op.create_table(
        "peagle_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=300), nullable=False),
        sa.Column("content_hash", sa.String(length=128), nullable=False),
        sa.Column("classes", _json(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_workloads")),
        sa.UniqueConstraint("content_hash", name=op.f("uq_peagle_workloads_content_hash")),
    )
    op.create_table(
        "peagle_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("drafter", sa.String(length=300), nullable=True),
        sa.Column("drafter_layers", sa.Integer(), nullable=True),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("parallel_drafting", sa.Boolean(), nullable=False),
        sa.Column("max_k", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("acceptance", _json(), nullable=False),
        sa.Column("step_costs", _json(), nullable=False),
        sa.Column("cost_model", _json(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("notes", _json(), nullable=False),
        _timestamp("created_at"),
        sa.CheckConstraint("kind IN ('measured', 'live')", name=op.f("ck_peagle_profiles_kind")),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["peagle_environments.id"],
            name=op.f("fk_peagle_profiles_environment_id_peagle_environments"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["peagle_workloads.id"],
            name=op.f("fk_peagle_profiles_workload_id_peagle_workloads"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_profiles")),
    )
    for column in ("model", "drafter", "environment_id", "workload_id"):
        op.create_index(op.f(f"ix_peagle_profiles_{column}"), "peagle_profiles", [column], unique=False)
    op.create_table(
        "peagle_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study", sa.String(length=300), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("config", _json(), nullable=False),
        sa.Column("scenario", _json(), nullable=False),
        sa.Column("values", _json(), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("provenance", _json(), nullable=False),
        _timestamp("created_at"),
        sa.CheckConstraint(
            "status IN ('complete', 'failed', 'pruned', 'running')", name=op.f("ck_peagle_trials_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_trials")),
        sa.UniqueConstraint("study", "number", name="uq_peagle_trials_study_number"),
    )
    op.create_index(op.f("ix_peagle_trials_model"), "peagle_trials", ["model"], unique=False)
    op.create_table(
        "peagle_recommendations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=300), nullable=False),
        sa.Column("gpu", sa.String(length=200), nullable=False),
        sa.Column("vllm_version", sa.String(length=64), nullable=True),
        sa.Column("workload_name", sa.String(length=300), nullable=True),
        sa.Column("workload_hash", sa.String(length=128), nullable=True),
        sa.Column("objective", sa.String(length=64), nullable=False),
        sa.Column("scenario", _json(), nullable=False),
        sa.Column("best_config", _json(), nullable=False),
        sa.Column("metrics", _json(), nullable=False),
        sa.Column("provenance", _json(), nullable=False),
        sa.Column("pareto", _json(), nullable=False),
        sa.Column("schedule", _json(), nullable=False),
        sa.Column("class_policy", _json(), nullable=False),
        sa.Column("study", sa.String(length=300), nullable=True),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_recommendations")),
    )
    for column in ("model", "workload_hash"):
        op.create_index(op.f(f"ix_peagle_recommendations_{column}"), "peagle_recommendations", [column], unique=False)


def downgrade() -> None:
    # Indexes go with their tables; children before parents because of the foreign keys.
    for table in (
        "peagle_recommendations",
        "peagle_trials",
        "peagle_profiles",
        "peagle_workloads",
        "peagle_drafters",
        "peagle_models",
        "peagle_environments",
    ):
        op.drop_table(table)
