"""Principals of any length, and jobs that resume without counting an attempt.

- `principal` becomes unbounded text; uniqueness and lookups go through
  `principal_key`, the SHA-256 of the principal (hex), so a principal of any length
  fits every index on every engine.
- `resuming`: the job was handed back without failing (its question was answered,
  or its node drained on shutdown); the next claim continues it without counting a
  new attempt.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("handles_jobs") as batch:
        batch.add_column(sa.Column("principal_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("resuming", sa.Boolean(), nullable=False, server_default=sa.false()))
    _backfill_principal_keys()
    op.drop_index("ix_handles_jobs_principal_status", table_name="handles_jobs")
    op.drop_index("ix_handles_jobs_principal", table_name="handles_jobs")
    with op.batch_alter_table("handles_jobs") as batch:
        batch.drop_constraint("uq_handles_jobs_idempotency", type_="unique")
        batch.alter_column(
            "principal", type_=sa.Text(), existing_type=sa.String(512), existing_nullable=False
        )
        batch.alter_column("principal_key", existing_type=sa.String(64), nullable=False)
        batch.create_unique_constraint(
            "uq_handles_jobs_idempotency", ["principal_key", "kind", "idempotency_key"]
        )
    op.create_index("ix_handles_jobs_principal_key_status", "handles_jobs", ["principal_key", "status"])


def _backfill_principal_keys() -> None:
    connection = op.get_bind()
    jobs = sa.table(
        "handles_jobs",
        sa.column("id", sa.String),
        sa.column("principal", sa.Text),
        sa.column("principal_key", sa.String),
    )
    while True:
        rows = connection.execute(
            sa.select(jobs.c.id, jobs.c.principal).where(jobs.c.principal_key.is_(None)).limit(BATCH)
        ).all()
        if not rows:
            return
        for job_id, principal in rows:
            key = hashlib.sha256(principal.encode()).hexdigest()
            connection.execute(jobs.update().where(jobs.c.id == job_id).values(principal_key=key))


def downgrade() -> None:
    op.drop_index("ix_handles_jobs_principal_key_status", table_name="handles_jobs")
    with op.batch_alter_table("handles_jobs") as batch:
        batch.drop_constraint("uq_handles_jobs_idempotency", type_="unique")
        batch.alter_column(
            "principal", type_=sa.String(512), existing_type=sa.Text(), existing_nullable=False
        )
        batch.create_unique_constraint(
            "uq_handles_jobs_idempotency", ["principal", "kind", "idempotency_key"]
        )
        batch.drop_column("resuming")
        batch.drop_column("principal_key")
    op.create_index("ix_handles_jobs_principal", "handles_jobs", ["principal"])
    op.create_index("ix_handles_jobs_principal_status", "handles_jobs", ["principal", "status"])
