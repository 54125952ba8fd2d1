"""Device keys (issue 47): each fleet device's public key, its identity; and each run's signed result.

Rows stored before this revision keep NULL: a device registered before keys takes its key when its agent
registers again; a run finished before keys has no signature, and ``fleet export --trust`` refuses it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_fleet_agents") as batch:
        batch.add_column(sa.Column("public_key", sa.Text(), nullable=True))
    with op.batch_alter_table("ad_fleet_runs") as batch:
        batch.add_column(sa.Column("signature", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_fleet_runs") as batch:
        batch.drop_column("signature")
    with op.batch_alter_table("ad_fleet_agents") as batch:
        batch.drop_column("public_key")
