"""Benchmarks: a recommendation served as it will be and measured by ``vllm bench serve`` (`peagle-tune bench`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "peagle_benchmarks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("recommendation_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("num_prompts", sa.Integer(), nullable=False),
        sa.Column("figures", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("provenance", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("commands", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("mode IN ('static', 'adaptive')", name=op.f("ck_peagle_benchmarks_mode")),
        sa.ForeignKeyConstraint(
            ["recommendation_id"],
            ["peagle_recommendations.id"],
            name=op.f("fk_peagle_benchmarks_recommendation_id_peagle_recommendations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_peagle_benchmarks")),
    )
    op.create_index(
        op.f("ix_peagle_benchmarks_recommendation_id"), "peagle_benchmarks", ["recommendation_id"], unique=False
    )


def downgrade() -> None:
    op.drop_table("peagle_benchmarks")
