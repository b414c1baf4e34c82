"""Durable execution: the step ledger, per-job policies, input and abandonment deadlines.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from handles.store.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("handles_jobs") as jobs:
        jobs.add_column(sa.Column("input_deadline", UTCDateTime(), nullable=True))
        jobs.add_column(sa.Column("abandon_at", UTCDateTime(), nullable=True))
        # Jobs stored before policies existed keep the behaviour they were started with.
        jobs.add_column(sa.Column("on_interrupt", sa.String(10), nullable=False, server_default="fail"))
        jobs.add_column(sa.Column("max_attempts", sa.Integer(), nullable=False, server_default="1"))
        jobs.add_column(sa.Column("keep_result_seconds", sa.Float(), nullable=True))
        jobs.add_column(sa.Column("input_timeout_seconds", sa.Float(), nullable=True))
        jobs.add_column(sa.Column("abandon_after_seconds", sa.Float(), nullable=True))
    op.create_table(
        "handles_steps",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("handles_steps")
    with op.batch_alter_table("handles_jobs") as jobs:
        for column in (
            "abandon_after_seconds",
            "input_timeout_seconds",
            "keep_result_seconds",
            "max_attempts",
            "on_interrupt",
            "abandon_at",
            "input_deadline",
        ):
            jobs.drop_column(column)
