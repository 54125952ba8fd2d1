"""Initial schema: devices, models, trials, measurements, studies, gate runs.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False)


def _floats(*names: str, nullable: bool) -> list[sa.Column]:
    return [sa.Column(n, sa.Double(), nullable=nullable) for n in names]


def upgrade() -> None:
    op.create_table(
        "ad_devices",
        _id(),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("cpu", sa.String(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_devices")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_ad_devices_fingerprint")),
    )
    op.create_table(
        "ad_models",
        _id(),
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("outputs", sa.JSON(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_models")),
        sa.UniqueConstraint("sha256", name=op.f("uq_ad_models_sha256")),
    )
    op.create_table(
        "ad_trials",
        _id(),
        sa.Column("uid", sa.String(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("study", sa.String(), nullable=True),
        sa.Column("phase", sa.String(), nullable=True),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("engine_version", sa.String(), nullable=True),
        sa.Column("precision", sa.String(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_key", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("failure_kind", sa.String(), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("artifact_path", sa.Text(), nullable=True),
        _created_at(),
        sa.CheckConstraint("status IN ('ok', 'failed')", name=op.f("ck_ad_trials_status")),
        sa.ForeignKeyConstraint(["device_id"], ["ad_devices.id"], name=op.f("fk_ad_trials_device_id_ad_devices")),
        sa.ForeignKeyConstraint(["model_id"], ["ad_models.id"], name=op.f("fk_ad_trials_model_id_ad_models")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_trials")),
        sa.UniqueConstraint("uid", name=op.f("uq_ad_trials_uid")),
    )
    op.create_index(
        op.f("ix_ad_trials_model_id_device_id_config_key"), "ad_trials", ["model_id", "device_id", "config_key"]
    )
    op.create_index(op.f("ix_ad_trials_study"), "ad_trials", ["study"])
    op.create_table(
        "ad_studies",
        _id(),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("objective", sa.String(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("winner_uid", sa.String(), nullable=True),
        sa.Column("summary", sa.JSON(none_as_null=True), nullable=True),
        _created_at(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["ad_devices.id"], name=op.f("fk_ad_studies_device_id_ad_devices")),
        sa.ForeignKeyConstraint(["model_id"], ["ad_models.id"], name=op.f("fk_ad_studies_model_id_ad_models")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_studies")),
        sa.UniqueConstraint("name", name=op.f("uq_ad_studies_name")),
    )
    op.create_table(
        "ad_measurements",
        _id(),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        *_floats("median_ms", "mean_ms", "stdev_ms", "cv", "min_ms", "max_ms", nullable=False),
        *_floats("median_ci_low", "median_ci_high", nullable=False),
        *_floats("p90_ms", "p90_ci_low", "p90_ci_high", "p99_ms", "p99_ci_low", "p99_ci_high", nullable=True),
        sa.Column("unstable", sa.Boolean(), nullable=False),
        *_floats("throughput", "peak_rss_mb", "artifact_mb", "build_s", nullable=True),
        sa.Column("accuracy", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("accuracy_passed", sa.Boolean(), nullable=True),
        sa.Column("samples_ms", sa.JSON(), nullable=False),
        sa.Column("warmup_calls", sa.Integer(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["ad_trials.id"], name=op.f("fk_ad_measurements_trial_id_ad_trials"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_measurements")),
        sa.UniqueConstraint("trial_id", "scenario", name=op.f("uq_ad_measurements_trial_id_scenario")),
    )

    op.create_table(
        "ad_gate_runs",
        _id(),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(), nullable=False),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("baseline_ref", sa.Text(), nullable=False),
        sa.Column("baseline_sha256", sa.String(), nullable=False),
        sa.Column("baseline_config", sa.JSON(), nullable=False),
        sa.Column("candidate_ref", sa.Text(), nullable=False),
        sa.Column("candidate_sha256", sa.String(), nullable=False),
        sa.Column("candidate_config", sa.JSON(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("notes", sa.JSON(), nullable=False),
        sa.Column("wall_s", sa.Double(), nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        _created_at(),
        sa.CheckConstraint("mode IN ('interleaved', 'against-db')", name=op.f("ck_ad_gate_runs_mode")),
        sa.CheckConstraint(
            "verdict IN ('pass', 'fail', 'inconclusive')", name=op.f("ck_ad_gate_runs_verdict")
        ),
        sa.ForeignKeyConstraint(
            ["device_id"], ["ad_devices.id"], name=op.f("fk_ad_gate_runs_device_id_ad_devices")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ad_gate_runs")),
    )
    op.create_index(op.f("ix_ad_gate_runs_device_id"), "ad_gate_runs", ["device_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_ad_gate_runs_device_id"), table_name="ad_gate_runs")
    op.drop_table("ad_gate_runs")
    op.drop_table("ad_measurements")
    op.drop_table("ad_studies")
    op.drop_index(op.f("ix_ad_trials_study"), table_name="ad_trials")
    op.drop_index(op.f("ix_ad_trials_model_id_device_id_config_key"), table_name="ad_trials")
    op.drop_table("ad_trials")
    op.drop_table("ad_models")
    op.drop_table("ad_devices")
