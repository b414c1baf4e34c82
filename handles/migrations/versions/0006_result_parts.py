"""Large results as files read through a link: the result parts.

- `handles_result_parts`: the parts (at most `PART_BYTES` each) of a job's result file,
  keyed by job, file (one per attempt that wrote one) and part number. Deleted with the job.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "handles_result_parts",
        sa.Column("job_id", sa.String(length=64), primary_key=True),
        sa.Column("file_id", sa.String(length=32), primary_key=True),
        sa.Column("part", sa.Integer(), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("handles_result_parts")
