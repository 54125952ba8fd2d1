"""How busy the machine was while each measurement ran: other processes' cores, load average, CPU clock.

Measurements stored before this revision keep NULL: their load was not read.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.add_column(sa.Column("load", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.drop_column("load")
