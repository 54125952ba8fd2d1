"""What each trial was fed: its data source and how images were preprocessed.

A bundle records it, so it can be run on images exactly as measured. Trials stored before this
revision keep NULL: their inputs were not recorded.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_trials") as batch:
        batch.add_column(sa.Column("inputs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_trials") as batch:
        batch.drop_column("inputs")
