"""A start on PostgreSQL in one round trip: the function `handles_start`.

A start used to be seven exchanges with the server (a ping at checkout, BEGIN, the advisory lock
with `now()`, the per-principal count, the INSERT, the NOTIFY and COMMIT). `handles_start` does
all of it in one statement, called in autocommit, so the statement is its own transaction: it
commits (and its NOTIFY goes out) before the reply reaches the caller, exactly as the COMMIT did.

`handles_start(job, arguments, result, error, trace_context, questions, question_schemas,
question_answers, active_limit, lease_seconds, notice)`:

- `job` is the row as JSON (its columns by name, times in ISO 8601 with an offset), read into the
  table's row type with `json_populate_record`, so a plain column added later flows through
  unchanged. Its JSON columns come as `json` parameters of their own: PostgreSQL's JSON functions
  refuse a document with a `\u0000` escape anywhere in it, which a `json` column stores (a NUL in a
  job's arguments is allowed). `questions` are the `handles_input_requests` rows asked before the
  job starts (JSON array, or NULL), their JSON columns in the two arrays, in the same order.
- A row that already has the job's own id, principal, kind and creation time is this same start,
  tried again after its connection died with the reply on its way: it is answered as created and
  nothing else happens (job ids are fresh random ids, so no other start can name it).
- With `active_limit`, an advisory lock on the principal's key serialises its concurrent starts
  (as `JobRepository._lock_principal` did) before the idempotency check and the count.
- With `lease_seconds` and a lease owner, the lease runs from the database's `now()`.
- `notice` is published on the `handles_jobs` channel, only when a row was inserted.

It returns one row `(outcome, active, lease_expires_at, stored)`: `created` (with the lease set
by the database clock; `stored` is the row only for a repeated try), `existing` (the job the
idempotency key names, as JSON) or `limit` (with the count of active jobs; nothing stored).

On SQLite this revision does nothing: a start there is one local transaction already.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# The active statuses are those of handles.states.ACTIVE when this revision was written; a revision
# that changes them must replace the function too.
CREATE = """
CREATE OR REPLACE FUNCTION handles_start(
    job json, arguments json, result json, error json, trace_context json,
    questions json, question_schemas json[], question_answers json[],
    active_limit integer, lease_seconds double precision, notice text
) RETURNS TABLE (outcome text, active bigint, lease_expires_at timestamptz, stored json)
LANGUAGE plpgsql VOLATILE AS $function$
DECLARE
    new_job handles_jobs := json_populate_record(NULL::handles_jobs, job);
    question handles_input_requests;
    earlier handles_jobs;
    counted bigint;
BEGIN
    new_job.arguments := arguments;
    new_job.result := result;
    new_job.error := error;
    new_job.trace_context := trace_context;
    SELECT * INTO earlier FROM handles_jobs AS j WHERE j.id = new_job.id;
    IF FOUND AND earlier.principal_key = new_job.principal_key AND earlier.kind = new_job.kind
            AND earlier.created_at = new_job.created_at THEN
        RETURN QUERY SELECT 'created'::text, NULL::bigint, earlier.lease_expires_at, row_to_json(earlier);
        RETURN;
    END IF;
    IF active_limit IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext(new_job.principal_key));
    END IF;
    IF new_job.idempotency_key IS NOT NULL THEN
        SELECT * INTO earlier FROM handles_jobs AS j
            WHERE j.principal_key = new_job.principal_key AND j.principal = new_job.principal
                AND j.kind = new_job.kind AND j.idempotency_key = new_job.idempotency_key;
        IF FOUND THEN
            RETURN QUERY SELECT 'existing'::text, NULL::bigint, NULL::timestamptz, row_to_json(earlier);
            RETURN;
        END IF;
    END IF;
    IF active_limit IS NOT NULL THEN
        SELECT count(*) INTO counted FROM handles_jobs AS j
            WHERE j.principal_key = new_job.principal_key AND j.status IN ('working', 'input_required');
        IF counted >= active_limit THEN
            RETURN QUERY SELECT 'limit'::text, counted, NULL::timestamptz, NULL::json;
            RETURN;
        END IF;
    END IF;
    IF lease_seconds IS NOT NULL AND new_job.lease_owner IS NOT NULL THEN
        new_job.lease_expires_at := now() + make_interval(secs => lease_seconds);
    END IF;
    INSERT INTO handles_jobs SELECT (new_job).*
        ON CONFLICT ON CONSTRAINT uq_handles_jobs_idempotency DO NOTHING;
    IF NOT FOUND THEN
        -- A concurrent start (without a limit's lock) stored the same idempotency key first.
        SELECT * INTO earlier FROM handles_jobs AS j
            WHERE j.principal_key = new_job.principal_key AND j.principal = new_job.principal
                AND j.kind = new_job.kind AND j.idempotency_key = new_job.idempotency_key;
        RETURN QUERY SELECT 'existing'::text, NULL::bigint, NULL::timestamptz, row_to_json(earlier);
        RETURN;
    END IF;
    IF questions IS NOT NULL THEN
        FOR i IN 1 .. json_array_length(questions) LOOP
            question := json_populate_record(NULL::handles_input_requests, questions -> (i - 1));
            question.requested_schema := question_schemas[i];
            question.answer := question_answers[i];
            INSERT INTO handles_input_requests SELECT (question).*;
        END LOOP;
    END IF;
    IF notice IS NOT NULL THEN
        PERFORM pg_notify('handles_jobs', notice);
    END IF;
    RETURN QUERY SELECT 'created'::text, NULL::bigint, new_job.lease_expires_at, NULL::json;
END
$function$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(CREATE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "DROP FUNCTION IF EXISTS handles_start(json, json, json, json, json, json, json[], json[], integer, "
            "double precision, text)"
        )
