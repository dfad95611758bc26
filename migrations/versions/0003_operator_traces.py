"""Operator traces beside the graphs: gzip-compressed JSON keyed by content id.

Revision ID: 0003_operator_traces
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_operator_traces"
down_revision = "0002_content_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operator_traces",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("graph_name", sa.String(length=200), nullable=False),
        sa.Column("ops", sa.Integer(), nullable=False),
        sa.Column("compressed_bytes", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_operator_traces"),
    )
    op.create_index("ix_operator_traces_created_at", "operator_traces", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_operator_traces_created_at", table_name="operator_traces")
    op.drop_table("operator_traces")
