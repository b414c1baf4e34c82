"""Which node ran each attempt: the claim log.

- `claim_log`: one line per claim of the job, `[attempt,"claimed at","node"]`, appended
  by the claim's own UPDATE (or the start that claims its job as it stores it), so it
  costs no extra round trip. Jobs stored before this revision keep it empty: the nodes
  that ran them were never kept.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.add_column(sa.Column("claim_log", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.drop_column("claim_log")
