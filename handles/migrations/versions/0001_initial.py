"""The first stored shape: jobs and their input requests.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from handles.store.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "handles_jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("principal", sa.String(512), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("arguments", sa.JSON(), nullable=False),
        sa.Column("arguments_digest", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("progress_done", sa.Float(), nullable=True),
        sa.Column("progress_total", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("run_after", UTCDateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("cancel_requested_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("principal", "kind", "idempotency_key", name="uq_handles_jobs_idempotency"),
    )
    op.create_index("ix_handles_jobs_kind", "handles_jobs", ["kind"])
    op.create_index("ix_handles_jobs_principal", "handles_jobs", ["principal"])
    op.create_index("ix_handles_jobs_expires_at", "handles_jobs", ["expires_at"])
    op.create_index("ix_handles_jobs_claim", "handles_jobs", ["status", "lease_owner", "run_after"])
    op.create_table(
        "handles_input_requests",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("requested_schema", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("answered_at", UTCDateTime(), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("handles_input_requests")
    op.drop_table("handles_jobs")
