"""Indexes for the operator console's jobs list: newest first, by keyset, at any depth.

The list is ordered by (created_at, id) and paged by that keyset (handles.console), optionally
filtered by kind or status. Without these a page at 10^6 stored jobs sorted the whole table
(about 340 ms on SQLite, 490 ms on PostgreSQL; a kind filter 390 and 960 ms); with them a page is
a walk down one index. `created_at`, `id` and `kind` never change, so the first two cost a write
only when a job is stored; the status one also at each status change.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_handles_jobs_created": ["created_at", "id"],
    "ix_handles_jobs_kind_created": ["kind", "created_at", "id"],
    "ix_handles_jobs_status_created": ["status", "created_at", "id"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.create_index(name, "handles_jobs", columns)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="handles_jobs")
