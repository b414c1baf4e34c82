"""Follow a job of a `handles` server to its end, from the official `mcp` client (see docs/client.md)."""

from handles.client import outcomes
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
from handles.client.outcomes import *  # noqa: F403  (its __all__, re-exported below)
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
    "Connect",
    "DetailedTask",
    "JobManifest",
    "Journal",
    "JournalEntry",
    "LinkReadError",
    "Manifest",
    "Mode",
    "Need",
    "Plan",
    "Requirements",
    "RequirementsNotMet",
    "TaskCancelled",
    "TaskFailed",
    "TasksClientExtension",
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
__all__ += outcomes.__all__
