"""Follow a job of a `handles` server to its end, from the official `mcp` client.

```python
from handles.client import Journal, connect, follow

report = await follow(
    connect("http://127.0.0.1:8000/mcp"),  # or a connected mcp.Client
    "generate_report", {"account": "acme"},
    key="acme-report-2026-07", journal=Journal("jobs.db"), deadline=600,
    on_progress=print, on_input=ask_a_person,
)
```

One call, one job, on either face of the server:

- Creation always goes through `<job>_start` with an `idempotency_key` when the
  server lists it (every `handles` server does). The key is written to the journal
  *before* the start is sent, so a start whose answer was lost (a network error, a
  killed process) is re-sent with the same key and the server returns the same job
  (`created: false`) instead of starting a second one. The Tasks extension's own
  create (`tools/call <job>` declaring the extension) has no idempotency key, so
  it is used only on a server without `<job>_start`, and then at most once: when
  its outcome is unknown the call raises `OutcomeUnknownError` instead of guessing.
- Observation uses the Tasks extension (`tasks/get`, `tasks/update`,
  `tasks/cancel`) when the client declares it and the server advertises it, and
  otherwise the handle tools (`<job>_progress` long-poll, `<job>_respond`,
  `<job>_fetch`, `<job>_cancel`, or the shared `jobs_*` ones of a server in the
  compact layout: the names come from `tools/list`). The `taskId` is the handle, so one job can be
  followed through either face, and a restarted client may pick the other one.
- Polls are spaced by at least the server's hint (`poll_after_ms` /
  `pollIntervalMs`) plus random jitter; the deadline is absolute, so a job that
  keeps reporting progress never extends it.
- A transient failure (a lost connection, a timeout, `-32603`) is retried with backoff; an
  HTTP 401/403 is not: it raises `AuthenticationRefusedError` at once (`connect(url, token=...)`
  sends a bearer token).
- The journal (a small SQLite file) maps the caller's `key` to the server, the
  job, the idempotency key, the handle and the final outcome: a restarted client
  calling `follow` with the same key resumes the same job, and once the job has
  ended it gets the recorded outcome without asking the server again
  (`Journal.forget(key)` frees the key for new work).
- A result too large to travel inline is returned as its link (`uri`, `parts`,
  `sha256`, ...): `read_link(client, link)` yields its bytes part by part.

The Tasks extension on its own, for the official `mcp` client: `TasksClientExtension` (declare it
and a declaring `tools/call` resolves to the task's result), `follow_task`, `get_task`,
`update_task`, `cancel_task`, `listen_tasks` (see `handles.client.tasks`).

Before the first call, `read_manifest(client)` says what the server offers this connection, and
`Manifest.check(Requirements(...))` the mode each job of a workflow runs in, or raises
`RequirementsNotMet` naming every gap (see `handles.client.manifest`).
"""

from handles.client.follow import connect, follow
from handles.client.http import http_client
from handles.client.journal import Journal, JournalEntry, arguments_digest
from handles.client.links import LinkReadError, read_link
from handles.client.manifest import (
    Connect,
    JobManifest,
    Manifest,
    Mode,
    Need,
    Plan,
    Requirements,
    RequirementsNotMet,
    read_manifest,
    server_identity,
)
from handles.client.outcomes import (
    AnswerRejectedError,
    AuthenticationRefusedError,
    ConnectionLostError,
    DeadlineExceeded,
    FollowError,
    InputCallback,
    InputRequiredError,
    JobCancelledError,
    JobFailedError,
    JobLostError,
    JobToolError,
    JournalConflict,
    OutcomeUnknownError,
    Progress,
    ProgressCallback,
    Question,
    StartRefusedError,
    UnsupportedServerError,
)
from handles.client.tasks import (
    DetailedTask,
    TaskCancelled,
    TaskFailed,
    TasksClientExtension,
    cancel_task,
    follow_task,
    get_task,
    listen_tasks,
    update_task,
)

__all__ = [
    "AnswerRejectedError",
    "AuthenticationRefusedError",
    "Connect",
    "ConnectionLostError",
    "DeadlineExceeded",
    "DetailedTask",
    "FollowError",
    "InputCallback",
    "InputRequiredError",
    "JobCancelledError",
    "JobFailedError",
    "JobLostError",
    "JobManifest",
    "JobToolError",
    "Journal",
    "JournalConflict",
    "JournalEntry",
    "LinkReadError",
    "Manifest",
    "Mode",
    "Need",
    "OutcomeUnknownError",
    "Plan",
    "Progress",
    "ProgressCallback",
    "Question",
    "Requirements",
    "RequirementsNotMet",
    "StartRefusedError",
    "TaskCancelled",
    "TaskFailed",
    "TasksClientExtension",
    "UnsupportedServerError",
    "arguments_digest",
    "cancel_task",
    "connect",
    "follow",
    "follow_task",
    "get_task",
    "http_client",
    "listen_tasks",
    "read_link",
    "read_manifest",
    "server_identity",
    "update_task",
]
