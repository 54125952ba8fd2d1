"""Artifact file hashes per trial, and exports known by their manifest digest.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_trials") as batch:
        batch.add_column(sa.Column("artifact_files", sa.JSON(), nullable=True))
    op.create_table(
        "ad_exports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("manifest_sha256", sa.String(), nullable=False),
        sa.Column("format", sa.String(), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("signed", sa.Boolean(), nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["ad_trials.id"], name=op.f("fk_ad_exports_trial_id_ad_trials")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_exports")),
    )
    op.create_index(op.f("ix_ad_exports_trial_id"), "ad_exports", ["trial_id"])
    op.create_index(op.f("ix_ad_exports_manifest_sha256"), "ad_exports", ["manifest_sha256"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ad_exports_manifest_sha256"), table_name="ad_exports")
    op.drop_index(op.f("ix_ad_exports_trial_id"), table_name="ad_exports")
    op.drop_table("ad_exports")
    with op.batch_alter_table("ad_trials") as batch:
        batch.drop_column("artifact_files")
