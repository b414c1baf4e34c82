"""An index on (principal, status): the per-principal active-job count at every start stays a lookup.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_handles_jobs_principal_status", "handles_jobs", ["principal", "status"])


def downgrade() -> None:
    op.drop_index("ix_handles_jobs_principal_status", table_name="handles_jobs")
