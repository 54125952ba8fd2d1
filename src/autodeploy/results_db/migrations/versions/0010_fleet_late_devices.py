"""Jobs that finish and devices you can see (issue 51): a job takes devices that register after its submission
only until ``accept_late_until`` (``fleet submit --accept-late``; ``fleet close`` ends it now); a device retired
by ``fleet forget`` has ``retired_at``.

Rows stored before this revision keep NULL, as a new job without ``--accept-late`` does: no device registering
from now on takes them (before, a device added a month later re-tuned every ``all`` and ``tag:`` job ever sent).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_fleet_jobs") as batch:
        batch.add_column(sa.Column("accept_late_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("ad_fleet_agents") as batch:
        batch.add_column(sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_fleet_agents") as batch:
        batch.drop_column("retired_at")
    with op.batch_alter_table("ad_fleet_jobs") as batch:
        batch.drop_column("accept_late_until")
