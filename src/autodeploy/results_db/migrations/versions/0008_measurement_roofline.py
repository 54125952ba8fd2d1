"""Every measurement's distance to this device's limit: the operations of one call, the GOP/s achieved and
their share of the precision's peak (``autodeploy.roofline.Roofline``, issue 41).

Measurements stored before this revision keep NULL: their operations were not counted.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.add_column(sa.Column("roofline", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.drop_column("roofline")
