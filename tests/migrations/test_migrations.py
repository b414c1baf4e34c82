"""Migrations: a database created by the previous schema revision, with jobs in it, upgrades and reads back."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlmodel import SQLModel

from handles.errors import ConfigurationError
from handles.states import Status
from handles.store import JobRepository, migrate
from handles.store.models import claims_of, principal_key
from tests.runtime.support import job_row
from tests.support import claim, count_active


def _insert_revision_0001_job(url: str) -> None:
    """Rows exactly as revision 0001 stored them (no policy columns, no steps)."""
    engine = create_engine(url)
    now = datetime.now(UTC)
    naive = engine.dialect.name == "sqlite"

    def ts(value: datetime) -> datetime:
        return value.replace(tzinfo=None) if naive else value

    with engine.begin() as connection:
        connection.execute(
            text(
                "insert into handles_jobs (id, kind, principal, status, status_message, arguments, "
                "arguments_digest, attempts, version, created_at, updated_at, started_at, expires_at, run_after, "
                "lease_owner, lease_expires_at, progress_done, progress_total) values (:id, 'report', 'local:local', "
                "'input_required', 'Approve?', :arguments, 'digest', 1, 3, :now, :now, :now, :expires, :now, "
                "'node-a', :lease, 2, 5)"
            ),
            {
                "id": "old-job",
                "arguments": json.dumps({"account": "acme"}),
                "now": ts(now),
                "expires": ts(now + timedelta(days=1)),
                "lease": ts(now + timedelta(seconds=30)),
            },
        )
        connection.execute(
            text(
                "insert into handles_input_requests (job_id, key, message, requested_schema, created_at) "
                "values ('old-job', 'q1', 'Approve?', :schema, :now)"
            ),
            {
                "schema": json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}}),
                "now": ts(now),
            },
        )
    engine.dispose()


def _fresh(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as connection:
        for table in [
            *(t.name for t in reversed(SQLModel.metadata.sorted_tables)),
            "handles_alembic_version",
        ]:
            connection.execute(text(f"drop table if exists {table}"))
    engine.dispose()


def test_upgrade_from_previous_revision_keeps_jobs_readable(database_url: str) -> None:
    _fresh(database_url)
    repo = JobRepository(database_url)
    migrate.upgrade(repo.engine, "0001")
    assert migrate.current_revision(repo.engine) == "0001"
    _insert_revision_0001_job(database_url)
    with pytest.raises(ConfigurationError, match="handles db upgrade"):
        repo.prepare(auto_migrate=False)

    repo.prepare(auto_migrate=True)
    assert migrate.current_revision(repo.engine) == migrate.head_revision()
    job = repo.get("old-job")
    assert job is not None
    assert (job.kind, job.status, job.arguments) == ("report", "input_required", {"account": "acme"})
    assert (job.progress_done, job.progress_total, job.attempts) == (2, 5, 1)
    assert (job.on_interrupt, job.max_attempts) == ("fail", 1), (
        "old jobs keep the behaviour they started with"
    )
    assert job.keep_result_seconds is None and job.input_deadline is None
    assert [r.key for r in repo.pending_inputs("old-job")] == ["q1"]
    assert repo.steps("old-job") == []
    outcome = repo.answer_inputs("old-job", {"q1": {"ok": True}})
    assert outcome is not None and outcome.accepted == ["q1"] and outcome.job.status == Status.WORKING
    repo.dispose()
    _fresh(database_url)


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    _fresh(database_url)
    repo = JobRepository(database_url)
    repo.prepare(auto_migrate=True)
    with repo.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = [
            d
            for d in compare_metadata(context, SQLModel.metadata)
            if not str(d).count("handles_alembic_version")
        ]
    assert differences == []
    repo.prepare(auto_migrate=True)  # idempotent
    repo.dispose()
    _fresh(database_url)


def _upgraded_to_head_from(database_url: str, revision: str) -> JobRepository:
    """A fresh database holding one job stored at revision 0001, taken to `revision`, then by the
    repository's own start-up to the newest revision."""
    _fresh(database_url)
    repo = JobRepository(database_url)
    migrate.upgrade(repo.engine, "0001")
    _insert_revision_0001_job(database_url)
    migrate.upgrade(repo.engine, revision)
    repo.prepare(auto_migrate=True)
    assert migrate.current_revision(repo.engine) == migrate.head_revision()
    return repo


def test_upgrade_to_principal_keys_backfills_them_and_lifts_the_length_limit(database_url: str) -> None:
    """0004: existing jobs get their principal key (in batches), idempotency still finds them, and a
    principal of any length can be stored afterwards."""
    repo = _upgraded_to_head_from(database_url, "0003")
    old = repo.get("old-job")
    assert old is not None and old.principal_key == principal_key("local:local")
    assert count_active(repo, principal="local:local") == 1
    long_principal = "token:" + "x" * 5000
    stored, created = repo.insert(
        job_row("long-principal-job", principal=long_principal, idempotency_key="k1")
    )
    assert created and repo.get(stored.id).principal == long_principal  # type: ignore[union-attr]
    again, created_again = repo.insert(
        job_row("long-principal-retry", principal=long_principal, idempotency_key="k1")
    )
    assert not created_again and again.id == "long-principal-job"
    repo.dispose()
    _fresh(database_url)


def test_upgrade_to_claim_logs_keeps_old_jobs_and_records_new_claims(database_url: str) -> None:
    """0005: jobs stored before it have no claim log (their nodes were never kept); every claim after it
    records its attempt and node, one entry per claim, a resumed attempt again under its number."""
    repo = _upgraded_to_head_from(database_url, "0004")
    old = repo.get("old-job")
    assert old is not None and old.claim_log is None and claims_of(old) == []
    repo.insert(job_row("new-job"))
    claimed = claim(repo, "new-job", "node-a:1:aaaa", 30)
    assert claimed is not None
    assert [(c.attempt, c.node) for c in claims_of(claimed)] == [(1, "node-a:1:aaaa")]
    repo.dispose()
    _fresh(database_url)


def test_upgrade_to_switches_adds_an_empty_record_that_takes_changes(database_url: str) -> None:
    """0008: the operator's switches start empty (the Tasks face on, nothing paused) beside the old jobs."""
    repo = _upgraded_to_head_from(database_url, "0007")
    assert repo.switches() == []
    assert repo.get("old-job") is not None
    row, before = repo.set_switch("tasks", engaged=True, by="operator", reason="rollback")
    assert before is None and (row.engaged, row.changed_by) == (True, "operator")
    assert [(r.name, r.engaged) for r in repo.switches()] == [("tasks", True)]
    repo.dispose()
    _fresh(database_url)


def test_a_database_upgraded_by_a_newer_version_is_refused_with_what_to_do(database_url: str) -> None:
    """A node of this version that (re)starts after a newer version of handles upgraded the schema (a rolling
    deploy that restarts an old node, a rollback of the code alone) must say so, not tell the operator to run
    the upgrade that already ran, nor fail with Alembic's own error; and it must change nothing stored."""
    _fresh(database_url)
    repo = JobRepository(database_url)
    repo.prepare(auto_migrate=True)
    repo.insert(job_row("kept"))
    engine = create_engine(database_url)
    with engine.begin() as connection:  # what a newer version's next revision leaves in the version table
        connection.execute(text("update handles_alembic_version set version_num = '9999_from_the_future'"))
    try:
        for auto_migrate in (False, True):
            with pytest.raises(ConfigurationError) as refused:
                repo.prepare(auto_migrate=auto_migrate)
            message = str(refused.value)
            assert "9999_from_the_future" in message and migrate.head_revision() in message
            assert "newer version of handles" in message
            assert "handles db upgrade" not in message
        assert migrate.current_revision(repo.engine) == "9999_from_the_future"
        kept = repo.get("kept")
        assert kept is not None and kept.id == "kept"
    finally:
        engine.dispose()
        repo.dispose()
        _fresh(database_url)
