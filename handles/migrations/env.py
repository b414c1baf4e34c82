"""Alembic environment for the handles tables: runs on the connection `handles.store.migrate` passes in."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import handles.store.models  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run handles migrations through handles.store.migrate (or `handles db upgrade`)")

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    version_table="handles_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
