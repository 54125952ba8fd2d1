"""The shapes each trial was measured at: a shape set's case key and every input's shape as fed.

Trials stored before this revision keep NULL in both: their shape was not recorded.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_trials") as batch:
        batch.add_column(sa.Column("shape_key", sa.String(), nullable=True))
        batch.add_column(sa.Column("shapes", sa.JSON(), nullable=True))
    op.create_index(op.f("ix_ad_trials_shape_key"), "ad_trials", ["shape_key"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ad_trials_shape_key"), table_name="ad_trials")
    with op.batch_alter_table("ad_trials") as batch:
        batch.drop_column("shapes")
        batch.drop_column("shape_key")
