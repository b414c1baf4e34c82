"""The 2025-11-25 design's questions: asked on a `tasks/result` stream, answered on any node.

On stateless HTTP the client's answer, a POSTed JSON-RPC response, has no request waiting for it:
`OlderAnswers` serves it as an `ANSWER_METHOD` request, authenticated and stored like every call.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import ElicitRequest, ElicitResult, JSONRPCRequest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handles.server.tasks_extension import elicitation_request
from handles.store import InputRequestRecord

OLDER_VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
ANSWER_METHOD = "io.github.handles/answer"
"""The request a POSTed answer becomes: `{taskId, key, result}` (no `result` for a JSON-RPC error)."""
TAKES_ANSWERS = "io.github.handles/takes-answers"
"""Set in the ASGI scope of the requests `OlderAnswers` passes on: answers POSTed back will land."""
_ID_PREFIX = "io.github.handles/question:"


def question_id(key: str, task_id: str) -> str:
    """The JSON-RPC id `ask` gives question `key` of `task_id`: what the client's answer is taken by."""
    return f"{_ID_PREFIX}{key}:{task_id}"


def asks_questions(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether an answer to a question asked on this request's stream can land: the connection carries
    it back (stdio, a stateful session), or `OlderAnswers` takes it from a POST."""
    return ctx.session.can_send_request or (
        isinstance(ctx.request, Request) and TAKES_ANSWERS in ctx.request.scope
    )


async def ask(
    ctx: ServerRequestContext[Any, Any], record: InputRequestRecord, task_id: str, seconds: float
) -> dict[str, Any] | None:
    """Send question `record` on the request's stream as an `elicitation/create` request related to the task:
    awaited (`seconds` at most) and returned where the connection carries the answer back; else written
    to the dispatcher's stream itself (the SDK's channel refuses it), its answer to come by POST (None)."""
    params = {**elicitation_request(record)["params"], "_meta": {RELATED_TASK: {"taskId": task_id}}}
    if ctx.session.can_send_request:
        question = ElicitRequest.model_validate({"method": "elicitation/create", "params": params})
        metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
        with contextlib.suppress(MCPError, ValidationError):  # no elicitation there: the handle tools answer
            result = await ctx.session.send_request(question, ElicitResult, seconds, metadata)
            return result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return None
    request = JSONRPCRequest(
        jsonrpc="2.0", id=question_id(record.key, task_id), method="elicitation/create", params=params
    )
    dispatcher = getattr(getattr(ctx.session, "_request_outbound", None), "_dispatcher", None)
    if dispatcher is not None:  # else this SDK has no stream to ask on: the handle tools answer
        await dispatcher._write(request, ServerMessageMetadata(related_request_id=ctx.request_id))
    return None


def answer_request(body: bytes) -> bytes | None:
    """The `ANSWER_METHOD` request a POSTed response to a question `ask` sent becomes; None for any other body."""
    if _ID_PREFIX.encode() not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    answered = message.get("id") if isinstance(message, dict) and "method" not in message else None
    if not isinstance(answered, str) or not answered.startswith(_ID_PREFIX):
        return None
    key, _, task_id = answered.removeprefix(_ID_PREFIX).partition(":")
    params = {"taskId": task_id, "key": key, "result": message.get("result")}
    return json.dumps({"jsonrpc": "2.0", "id": answered, "method": ANSWER_METHOD, "params": params}).encode()


class OlderAnswers:
    """ASGI middleware: a 2025-11-25 POST answering a question `ask` sent is served as an `ANSWER_METHOD` request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = dict(scope.get("headers") or ()).get(b"mcp-protocol-version")
        if scope["type"] != "http" or scope["method"] != "POST" or version != OLDER_VERSION.encode():
            await self.app(scope, receive, send)
            return
        scope = {**scope, TAKES_ANSWERS: True}
        body = await Request(scope, receive).body()
        answer = answer_request(body)
        unread = [{"type": "http.request", "body": answer or body, "more_body": False}]

        async def replay() -> Message:
            return unread.pop() if unread else await receive()

        if answer is None:
            await self.app(scope, replay, send)
            return
        kept: list[Message] = []

        async def keep(message: Message) -> None:
            kept.append(message)

        await self.app(scope, replay, keep)
        if kept and kept[0]["type"] == "http.response.start" and kept[0]["status"] < 300:
            kept = [
                {"type": "http.response.start", "status": 202, "headers": []},
                {"type": "http.response.body"},
            ]
        for message in kept:  # a refusal before the app (a missing token) reaches the client as it is
            await send(message)
