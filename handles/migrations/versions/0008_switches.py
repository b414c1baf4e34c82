"""The operator's switches: the Tasks face's kill switch and paused job kinds.

- `handles_switches`: one row per switch (`tasks`, or `paused:<job>`), as last set: whether it is
  engaged, the operator's reason, the retry hint of a pause, who changed it and when. Every node
  reads the table (at most once per `HANDLES_SWITCH_CACHE_SECONDS`), so a switch set from the
  `handles` command takes effect everywhere without a restart.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from handles.store.models import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "handles_switches",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("engaged", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("retry_after_seconds", sa.Float(), nullable=True),
        sa.Column("changed_by", sa.Text(), nullable=False),
        sa.Column("changed_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("handles_switches")
