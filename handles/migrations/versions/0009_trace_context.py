"""The trace context of the request that started a job, for linking every attempt's span to it.

- `handles_jobs.trace_context`: the W3C `traceparent` (and `tracestate`) of the request that
  started the job, when an OpenTelemetry SDK was recording it (see handles/telemetry.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.add_column(sa.Column("trace_context", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.drop_column("trace_context")
