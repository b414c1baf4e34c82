"""Change notices on PostgreSQL go out after their writes commit, several writes' in one transaction of one
connection of the node, so no write's own transaction notifies: PostgreSQL takes one lock for the whole
cluster at the commit of every notifying transaction, which would make all writes commit one at a time."""

from __future__ import annotations

import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg

from handles.states import Status
from handles.store import JobRecord, JobRepository, utc_now
from handles.store.notices import MAX_LINGER_SECONDS, NoticeSender
from tests.harness.postgres import listening, repository
from tests.runtime.support import job_row

OWNER = "node-a"


def _running(repo: JobRepository) -> JobRecord:
    now = utc_now()
    claim = {"lease_owner": OWNER, "lease_expires_at": now + timedelta(seconds=30), "started_at": now}
    job = job_row(f"n-{secrets.token_hex(6)}", principal=f"local:n-{secrets.token_hex(4)}", **claim)
    stored, created = repo.insert(job, active_limit=10)
    assert created
    return stored


def _received(listener: psycopg.Connection, job_ids: set[str], seconds: float = 1.0) -> list[psycopg.Notify]:
    """The notices of `job_ids` that `listener` receives within `seconds` (other tests' arrive too)."""
    received: list[psycopg.Notify] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        received += listener.notifies(timeout=left, stop_after=1)
    return [notice for notice in received if notice.payload.split(" ")[0] in job_ids]


def test_the_notices_of_concurrent_writes_come_from_one_connection_that_made_none_of_them(
    postgres_url: str,
) -> None:
    with repository(postgres_url) as repo, listening(postgres_url) as listener:
        jobs = [_running(repo) for _ in range(8)]
        _received(listener, {job.id for job in jobs}, 0.2)

        def outcome(job: JobRecord) -> bool:
            return repo.publishing(
                job.id, "origin-1", "changed", repo.transition, job.id, Status.COMPLETED, owner=OWNER
            )

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(outcome, jobs))
        received = _received(listener, {job.id for job in jobs})
        assert sorted(notice.payload for notice in received) == sorted(
            repo.notice(job.id, "origin-1", "changed") for job in jobs
        )
        writers = [repo.engine.raw_connection() for _ in range(repo.engine.pool.checkedin())]  # type: ignore[attr-defined]
        try:
            writer_pids = {connection.driver_connection.info.backend_pid for connection in writers}
        finally:
            for connection in writers:
                connection.close()
        assert writer_pids and len({notice.pid for notice in received}) == 1
        assert received[0].pid not in writer_pids, "a write's own transaction sent its notice"


def test_identical_notices_queued_while_a_send_is_in_flight_go_out_once_in_the_next_batch() -> None:
    batches: list[list[str]] = []
    first_send_started, release_first_send = threading.Event(), threading.Event()

    def send(batch: list[str]) -> None:
        batches.append(batch)
        if len(batches) == 1:
            first_send_started.set()
            assert release_first_send.wait(5)

    sender = NoticeSender(send)
    sender.add("a changed")
    assert first_send_started.wait(5)
    for _ in range(20):
        sender.add("a changed")
    sender.add("b changed")
    sender.add("a changed")
    release_first_send.set()
    sender.close()
    assert batches == [["a changed"], ["a changed", "b changed"]]


def test_a_steady_stream_of_notices_is_sent_in_fewer_larger_batches_and_a_quiet_spell_resets_it() -> None:
    sends: list[float] = []
    sender = NoticeSender(lambda batch: sends.append(time.monotonic()))
    streaming_until = time.monotonic() + 0.4
    n = 0
    while time.monotonic() < streaming_until:
        sender.add(f"job-{n} changed")
        n += 1
        time.sleep(0.0005)
    time.sleep(MAX_LINGER_SECONDS * 3)
    busy = len(sends)
    quiet_before = time.monotonic()
    sender.add("after the quiet spell")
    while len(sends) == busy and time.monotonic() < quiet_before + 1:
        time.sleep(0.001)
    sender.close()
    assert busy <= 0.4 / MAX_LINGER_SECONDS + 5, f"{busy} sends in 0.4 s: the linger did not grow"
    assert len(sends) == busy + 1 and sends[-1] - quiet_before < MAX_LINGER_SECONDS, "not sent at once"


def test_closing_the_store_sends_the_notices_still_pending(postgres_url: str) -> None:
    job_id = f"n-{secrets.token_hex(6)}"
    with listening(postgres_url) as listener:
        with repository(postgres_url) as repo:
            for _ in range(20):
                repo.publish(job_id, "cli")
        received = [notice.payload for notice in _received(listener, {job_id})]
    assert received and set(received) == {f"{job_id} cli changed"}
    assert len(received) < 20, "identical pending notices were not sent once"
