"""The audit evidence of a job, archived when the job is deleted: who did what to it and how it ended, with
receipts (SHA-256) standing for its arguments and results, never their data."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from handles.store.models import InputRequestRecord, JobRecord, StepRecord, claims_of

EVIDENCE_VERSION = 1


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def receipt(value: Any) -> str | None:
    """The SHA-256 of a stored value as canonical JSON (None for no value)."""
    if value is None:
        return None
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def evidence(
    job: JobRecord, questions: Iterable[InputRequestRecord], steps: Iterable[StepRecord]
) -> dict[str, Any]:
    """The evidence of `job`, from its rows."""
    error = job.error or {}
    data = error.get("data") or {}
    return {
        "version": EVIDENCE_VERSION,
        "job_id": job.id,
        "kind": job.kind,
        "started_by": job.principal,
        "created_at": _iso(job.created_at),
        "arguments_sha256": job.arguments_digest,
        "idempotency_key": job.idempotency_key,
        "questions": [
            {
                "key": question.key,
                "message": question.message,
                "asked_at": _iso(question.created_at),
                "answered_at": _iso(question.answered_at),
                "answered_by": question.answered_by
                or (job.principal if question.answered_at is not None else None),
                "fields_answered": sorted(question.answer or {}),
            }
            for question in questions
        ],
        "steps": [
            {
                "name": step.name,
                "status": step.status,
                "attempt": step.attempt,
                "started_at": _iso(step.started_at),
                "finished_at": _iso(step.finished_at),
                "receipt": receipt(step.result) if step.status == "completed" else None,
            }
            for step in steps
        ],
        "claims": [
            {
                "attempt": claim.attempt,
                "node": claim.node,
                "at": _iso(claim.claimed_at),
                "resumed": claim.resumed,
            }
            for claim in claims_of(job)
        ],
        "cancel_requested_at": _iso(job.cancel_requested_at),
        "cancel_requested_by": job.cancel_requested_by,
        "outcome": {
            "status": job.status,
            "finished_at": _iso(job.finished_at),
            "status_message": job.status_message,
            "error_code": error.get("code"),
            "reason": data.get("reason"),
            "reference": data.get("reference"),
            "result_receipt": receipt(job.result),
        },
    }
