"""A start's active count on PostgreSQL reads only the principal's active jobs, whatever plan it keeps.

`handles_start` (revision 0011) counts the principal's active jobs with `status IN ('working',
'input_required')` against the index on (principal_key, status). A pooled connection lives as long as
its server and keeps the plan of that count; in a table with no statistics yet (a new deployment, until
autovacuum first analyses it), PostgreSQL 15's generic plan of it keeps the status list as a filter
over the principal's index entries instead of a condition of the index scan. Every start then read
every job its principal had stored, ended or not, and a session's starts grew slower with each start (in
bench's loop, 1.1 -> 2.1 ms over 4,000 starts of one principal).

This revision replaces the function with the count written as one equality per status (two index
probes, each reading only that status's entries of the principal), which every plan runs as an index
condition on both columns. Nothing else in the function changes; its signature is the same, so servers
of the previous version keep calling it while the schema is upgraded.

On SQLite this revision does nothing: its planner looks the statuses up in the index (Profile D).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_PREVIOUS = importlib.import_module("handles.migrations.versions.0011_start_function").CREATE

_COUNT_BY_LIST = """        SELECT count(*) INTO counted FROM handles_jobs AS j
            WHERE j.principal_key = new_job.principal_key AND j.status IN ('working', 'input_required');"""
_COUNT_BY_STATUS = """        counted := (SELECT count(*) FROM handles_jobs AS j
                WHERE j.principal_key = new_job.principal_key AND j.status = 'working')
            + (SELECT count(*) FROM handles_jobs AS j
                WHERE j.principal_key = new_job.principal_key AND j.status = 'input_required');"""
assert _PREVIOUS.count(_COUNT_BY_LIST) == 1, "revision 0011's count is not where this revision replaces it"
CREATE = _PREVIOUS.replace(_COUNT_BY_LIST, _COUNT_BY_STATUS)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(CREATE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PREVIOUS)
