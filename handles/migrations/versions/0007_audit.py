"""Audit evidence that outlives its job: who cancelled, who answered, and the evidence archive.

- `handles_jobs.cancel_requested_by`: who asked for the cancel (the principal, `operator:<name>`,
  or `handles:<reason>` for the runtime's own cancels).
- `handles_input_requests.answered_by`: who answered.
- `handles_audit`: one row of evidence per deleted job (who started it, its questions and who
  answered them, its steps with the receipts of their results, its attempts and its outcome;
  never an argument, an answer or a result), kept until its own `keep_until`.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from handles.store.models import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.add_column(sa.Column("cancel_requested_by", sa.Text(), nullable=True))
    with op.batch_alter_table("handles_input_requests") as batch:
        batch.add_column(sa.Column("answered_by", sa.Text(), nullable=True))
    op.create_table(
        "handles_audit",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=128), nullable=False),
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("archived_at", UTCDateTime(), nullable=False),
        sa.Column("keep_until", UTCDateTime(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
    )
    op.create_index("ix_handles_audit_job_id", "handles_audit", ["job_id"])
    op.create_index("ix_handles_audit_archived_at", "handles_audit", ["archived_at"])
    op.create_index("ix_handles_audit_keep_until", "handles_audit", ["keep_until"])


def downgrade() -> None:
    op.drop_table("handles_audit")
    with op.batch_alter_table("handles_input_requests") as batch:
        batch.drop_column("answered_by")
    with op.batch_alter_table("handles_jobs") as batch:
        batch.drop_column("cancel_requested_by")
