"""Cold start and the cost of an inference (issue 54): ``ad_measurements.cold_start``, a config's start in fresh
processes (load and first inference, per process, with and without the engine's compiled cache), and
``ad_measurements.cost``, energy per inference from a named meter (powercap RAPL, NVML, hwmon) or, where the
machine has none, the worker's CPU time per inference under its own name. NULL where not measured, and in
measurements stored before this revision.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.add_column(sa.Column("cold_start", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("cost", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ad_measurements") as batch:
        batch.drop_column("cost")
        batch.drop_column("cold_start")
