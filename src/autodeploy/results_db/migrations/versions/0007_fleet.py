"""Fleet jobs: agents (devices by name and fingerprint), jobs, one run per job and device, shared blobs.

The queue that hands runs to agents (PgQueuer) keeps its tables in its own schema, autodeploy_queue,
installed by autodeploy.fleet.queue and never by these migrations.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ad_fleet_blobs",
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_ad_fleet_blobs")),
    )
    op.create_table(
        "ad_fleet_agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("cpu", sa.String(), nullable=False),
        sa.Column("engines", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("version", sa.String(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["ad_devices.id"], name=op.f("fk_ad_fleet_agents_device_id_ad_devices")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_fleet_agents")),
        sa.UniqueConstraint("name", name=op.f("uq_ad_fleet_agents_name")),
    )
    op.create_index(op.f("ix_ad_fleet_agents_device_id"), "ad_fleet_agents", ["device_id"])
    op.create_table(
        "ad_fleet_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(), nullable=False),
        sa.Column("model_file", sa.String(), nullable=False),
        sa.Column("model_sha256", sa.String(), nullable=False),
        sa.Column("data", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("devices", sa.String(), nullable=False),
        sa.Column("lost_after_s", sa.Double(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('open', 'cancelled')", name=op.f("ck_ad_fleet_jobs_state")),
        sa.ForeignKeyConstraint(["model_sha256"], ["ad_fleet_blobs.sha256"],
                                name=op.f("fk_ad_fleet_jobs_model_sha256_ad_fleet_blobs")),  # fmt: skip
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_fleet_jobs")),
    )
    op.create_table(
        "ad_fleet_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("study", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("queue_job", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("winner", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("bundle_sha256", sa.String(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("skipped", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled', 'skipped')",
                           name=op.f("ck_ad_fleet_runs_state")),  # fmt: skip
        sa.ForeignKeyConstraint(["agent_id"], ["ad_fleet_agents.id"], name=op.f("fk_ad_fleet_runs_agent_id_ad_fleet_agents")),
        sa.ForeignKeyConstraint(["bundle_sha256"], ["ad_fleet_blobs.sha256"],
                                name=op.f("fk_ad_fleet_runs_bundle_sha256_ad_fleet_blobs")),  # fmt: skip
        sa.ForeignKeyConstraint(["job_id"], ["ad_fleet_jobs.id"], name=op.f("fk_ad_fleet_runs_job_id_ad_fleet_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_fleet_runs")),
        sa.UniqueConstraint("job_id", "agent_id", name=op.f("uq_ad_fleet_runs_job_id_agent_id")),
    )
    op.create_index(op.f("ix_ad_fleet_runs_agent_id"), "ad_fleet_runs", ["agent_id"])
    op.create_index(op.f("ix_ad_fleet_runs_job_id"), "ad_fleet_runs", ["job_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ad_fleet_runs_job_id"), table_name="ad_fleet_runs")
    op.drop_index(op.f("ix_ad_fleet_runs_agent_id"), table_name="ad_fleet_runs")
    op.drop_table("ad_fleet_runs")
    op.drop_table("ad_fleet_jobs")
    op.drop_index(op.f("ix_ad_fleet_agents_device_id"), table_name="ad_fleet_agents")
    op.drop_table("ad_fleet_agents")
    op.drop_table("ad_fleet_blobs")
