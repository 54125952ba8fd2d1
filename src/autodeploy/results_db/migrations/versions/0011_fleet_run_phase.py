"""Where a fleet run stands, and profile jobs (issue 51): ``ad_fleet_runs.phase``, the study's current step as its
agent last wrote it (``screening 3/12``, ``finalist round 2/3``, ``waiting for the spread``, ``exporting``,
``profiling``; NULL before the run starts, after it ends, and in rows stored before this revision), and
``ad_fleet_jobs.profile``, the one config a profile job measures on every device (``fleet submit --profile``;
NULL: the job tunes, as every job stored before this revision does).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_fleet_runs") as batch:
        batch.add_column(sa.Column("phase", sa.Text(), nullable=True))
    with op.batch_alter_table("ad_fleet_jobs") as batch:
        batch.add_column(sa.Column("profile", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_fleet_jobs") as batch:
        batch.drop_column("profile")
    with op.batch_alter_table("ad_fleet_runs") as batch:
        batch.drop_column("phase")
