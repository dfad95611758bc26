"""Initial schema: documents, jobs and their candidates, trials, cost-model versions.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
JOB_PHASES = ("queued", "searching", "trials", "finalizing", "done")


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _document_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("json", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{name}"),
    )
    op.create_index(f"ix_{name}_created_at", name, ["created_at"])


def upgrade() -> None:
    op.create_table(
        "cost_model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        _timestamp("created_at"),
        sa.Column("booster", sa.Text(), nullable=False),
        sa.Column("n_train", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("in_use", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cost_model_versions"),
    )
    _document_table("graphs")
    _document_table("resource_specs")
    op.create_table(
        "strategies",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("graph_id", sa.String(length=64), nullable=True),
        sa.Column("resource_id", sa.String(length=64), nullable=True),
        sa.Column("json", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(["graph_id"], ["graphs.id"], name="fk_strategies_graph_id_graphs"),
        sa.ForeignKeyConstraint(
            ["resource_id"], ["resource_specs.id"], name="fk_strategies_resource_id_resource_specs"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_strategies"),
    )
    op.create_index("ix_strategies_graph_id", "strategies", ["graph_id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("graph_id", sa.String(length=64), nullable=False),
        sa.Column("resource_id", sa.String(length=64), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.Enum(*JOB_STATUSES, name="jobstatus", native_enum=False, length=16), nullable=False),
        sa.Column("phase", sa.Enum(*JOB_PHASES, name="jobphase", native_enum=False, length=16), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=120), nullable=True),
        sa.Column("best_strategy_id", sa.String(length=64), nullable=True),
        _timestamp("created_at"),
        _timestamp("started_at", nullable=True),
        _timestamp("finished_at", nullable=True),
        _timestamp("heartbeat_at", nullable=True),
        sa.ForeignKeyConstraint(["best_strategy_id"], ["strategies.id"], name="fk_jobs_best_strategy_id_strategies"),
        sa.ForeignKeyConstraint(["graph_id"], ["graphs.id"], name="fk_jobs_graph_id_graphs"),
        sa.ForeignKeyConstraint(["resource_id"], ["resource_specs.id"], name="fk_jobs_resource_id_resource_specs"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_graph_id", "jobs", ["graph_id"])
    op.create_index("ix_jobs_status_created_at", "jobs", ["status", "created_at"])
    op.create_table(
        "job_candidates",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("strategy_id", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("predicted", sa.JSON(), nullable=True),
        sa.Column("measured", sa.JSON(), nullable=True),
        sa.Column("predicted_step_time_s", sa.Float(), nullable=True),
        sa.Column("source", sa.String(length=120), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_candidates_job_id_jobs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["strategy_id"], ["strategies.id"], name="fk_job_candidates_strategy_id_strategies"),
        sa.PrimaryKeyConstraint("id", name="pk_job_candidates"),
        sa.UniqueConstraint("job_id", "strategy_id", name="uq_job_candidates_job_id_strategy_id"),
    )
    op.create_index("ix_job_candidates_job_id", "job_candidates", ["job_id"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("graph_id", sa.String(length=64), nullable=False),
        sa.Column("resource_id", sa.String(length=64), nullable=False),
        sa.Column("strategy_id", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("step_times_s", sa.JSON(), nullable=False),
        sa.Column("median_s", sa.Float(), nullable=True),
        sa.Column("p90_s", sa.Float(), nullable=True),
        sa.Column("samples_per_s", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("predicted_step_time_s", sa.Float(), nullable=True),
        sa.Column("simulator_version", sa.String(length=64), nullable=True),
        sa.Column("details", sa.JSON(), nullable=True),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(["graph_id"], ["graphs.id"], name="fk_trials_graph_id_graphs"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_trials_job_id_jobs", ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["resource_id"], ["resource_specs.id"], name="fk_trials_resource_id_resource_specs"),
        sa.ForeignKeyConstraint(["strategy_id"], ["strategies.id"], name="fk_trials_strategy_id_strategies"),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
    )
    for column in ("created_at", "graph_id", "job_id", "strategy_id"):
        op.create_index(f"ix_trials_{column}", "trials", [column])


def downgrade() -> None:
    op.drop_table("trials")
    op.drop_table("job_candidates")
    op.drop_table("jobs")
    op.drop_table("strategies")
    op.drop_table("resource_specs")
    op.drop_table("graphs")
    op.drop_table("cost_model_versions")
