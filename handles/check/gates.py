"""The gates `handles check` runs: each drives the server over the public wire and keeps its evidence."""

from __future__ import annotations

import functools
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp_types import Tool

from handles.check.plan import CheckPlan, JobPlan
from handles.check.wire import (
    REQUEST_SECONDS,
    Caller,
    Reply,
    Transcript,
    altered,
    made_up_id,
    settle,
    settle_task,
    start,
)
from handles.client.manifest import JobManifest, Manifest, list_tools
from handles.client.task_messages import TERMINAL_STATUSES
from handles.states import Status, can_transition
from handles.tool_layout import FOLLOW_VERBS

Ask = Callable[[Caller, str], Awaitable[Reply]]
"""One request about an id, sent as a caller."""

SETTLED_SECONDS = 1.0
"""How long an ended job is watched for a status that changes again."""


@dataclass
class Findings:
    """A gate's evidence: one line per claim checked, naming the request that showed it."""

    evidence: list[str] = field(default_factory=list)
    failed: bool = False
    applied: bool = False

    def expect(self, ok: bool, claim: str, reply: Reply | None = None) -> bool:
        self.applied = True
        shown = "" if reply is None else f" [{reply.request}]" if ok else f" [{reply.shown()}]"
        self.evidence.append(f"{'ok' if ok else 'FAILED'}: {claim}{shown}")
        self.failed |= not ok
        return ok

    def note(self, line: str) -> None:
        self.evidence.append(line)


@dataclass
class Run:
    """What every gate works with: the plan, the owner and the other principal (declaring the Tasks
    extension, and again connected at 2025-11-25), the owner without the extension, what the server lists."""

    plan: CheckPlan
    owner: Caller
    other: Caller | None
    plain: Caller
    older: Caller
    older_other: Caller | None
    manifest: Manifest
    tools: dict[str, Tool]
    older_tools: dict[str, Tool]
    transcript: Transcript
    reconnect: Callable[[], AbstractAsyncContextManager[Caller]]
    """A new connection of the owner's."""

    @classmethod
    async def read(
        cls,
        plan: CheckPlan,
        callers: list[Caller | None],
        reconnect: Callable[[], AbstractAsyncContextManager[Caller]],
    ) -> Run:
        owner, other, plain, older, older_other = callers
        assert owner is not None and plain is not None and older is not None
        listed, older_listed = await list_tools(owner.client), await list_tools(older.client)
        manifest = Manifest.of(owner.client, listed)
        tools, older_tools = ({tool.name: tool for tool in each} for each in (listed, older_listed))
        transcript = owner.transcript
        return cls(
            plan, owner, other, plain, older, older_other, manifest, tools, older_tools, transcript, reconnect
        )

    def jobs(self, *roles: str) -> list[tuple[JobPlan, JobManifest]]:
        """The planned jobs the server lists with every one of `roles` (`start`, `progress`, `plain`, ...)."""
        found = [(plan, self.manifest.job(plan.name)) for plan in self.plan.jobs]
        return [(plan, job) for plan, job in found if job is not None and set(roles) <= set(job.tools)]

    async def finish(self, caller: Caller, plan: JobPlan, job: JobManifest, handle: str) -> Reply:
        """End a job this run started: cancel it when the plan allows, then wait for its end."""
        if plan.cancel and "cancel" in job.tools:
            await caller.call(job.tools["cancel"], {"handle": handle})
        return await settle(caller, job, plan, handle)

    def task_designs(self) -> list[tuple[Caller, Caller | None, list[JobPlan]]]:
        """Each tasks design the server offers (the extension; the 2025-11-25 design on a handshake): the
        owner's and the other principal's callers, and the planned jobs whose tool may answer a task."""
        designs = []
        if self.manifest.tasks_offered:
            designs.append((self.owner, self.other, [plan for plan, _ in self.jobs("plain")]))
        if self.older.client.server_capabilities.tasks is not None:
            marked = {name for name, tool in self.older_tools.items() if _takes_task(tool)}
            designs.append((self.older, self.older_other, [p for p in self.plan.jobs if p.name in marked]))
        return designs

    async def create_task(self, caller: Caller, plan: JobPlan) -> str | None:
        """The task of `plan`'s plain tool, as `caller`'s design asks for one; None when no task came."""
        if caller is self.older:
            params = {"name": plan.name, "arguments": plan.arguments, "task": {}}
            created = await caller.send(f"tools/call {plan.name} (a task)", "tools/call", params)
            task_id = None if created.error else (created.body.get("task") or {}).get("taskId")
        else:
            created = await caller.call(plan.name, plan.arguments)
            task = not created.error and created.body.get("resultType") == "task"
            task_id = created.body.get("taskId") if task else None
        return None if task_id is None else self.transcript.label(str(task_id), "the owner's task id")

    async def tasks(self, cancel: bool = False) -> AsyncIterator[tuple[Caller, Caller | None, JobPlan, str]]:
        """A new task of each planned job (with `cancel`, of those that may be cancelled) in each design:
        the owner's caller, the other principal's, the job and the task id."""
        for owner, other, plans in self.task_designs():
            for plan in plans:
                if (plan.cancel or not cancel) and (task_id := await self.create_task(owner, plan)):
                    yield owner, other, plan, task_id

    async def finish_task(self, caller: Caller, plan: JobPlan, task_id: str) -> Reply:
        if plan.cancel:
            await caller.task("tasks/cancel", task_id)
        return await settle_task(caller, plan, task_id)


def _takes_task(tool: Tool) -> bool:
    return tool.execution is not None and tool.execution.task_support in ("optional", "required")


async def _as_made_up(
    f: Findings, run: Run, callers: tuple[Caller, Caller | None], owned: str, noun: str, ask: Ask
) -> None:
    """The other principal asks about the owner's id and an altered one, the owner about the altered one:
    each answer must be the error a made-up id gets, word for word once the id is blanked out."""
    owner, other = callers
    forged = run.transcript.label(altered(owned), f"an altered {noun}")
    made_up = run.transcript.label(made_up_id(), f"a made-up {noun}")
    others = [] if other is None else [(other, owned), (other, forged)]
    for caller, used in [*others, (owner, forged)]:
        baseline, got = await ask(caller, made_up), await ask(caller, used)
        same = got.text.replace(used, "<id>") == baseline.text.replace(made_up, "<id>")
        f.expect(got.error and baseline.error and same, f"answers like a made-up {noun}", got)


async def _ask_tool(tool: str, extra: dict[str, Any], caller: Caller, handle: str) -> Reply:
    return await caller.call(tool, {"handle": handle, **extra})


async def _ask_task(method: str, params: dict[str, Any], caller: Caller, task_id: str) -> Reply:
    return await caller.task(method, task_id, **params)


async def isolation(run: Run) -> Findings:
    """Another principal's handle or task id, and an altered one, get exactly what a made-up one gets."""
    f = Findings()
    if run.other is None:
        f.note("one principal only: another principal's access is not tested, altered ids are")
    for plan, job in run.jobs("start", "progress"):
        started = await start(run.owner, job, plan)
        if not f.expect(not started.error and "handle" in started.body, f"{plan.name} started", started):
            continue
        handle = run.transcript.label(str(started.body["handle"]), "the owner's handle")
        for verb in (verb for verb in FOLLOW_VERBS if verb in job.tools):
            extra = {"responses": {"q1": plan.answer or {}}} if verb == "respond" else {}
            ask = functools.partial(_ask_tool, job.tools[verb], extra)
            await _as_made_up(f, run, (run.owner, run.other), handle, "handle", ask)
        after = await run.owner.call(job.tools["progress"], {"handle": handle})
        f.expect(not after.error and after.status != "cancelled", "the owner's job was left alone", after)
        await run.finish(run.owner, plan, job, handle)
    async for owner, other, plan, task_id in run.tasks():
        accept = {"inputResponses": {"q1": {"action": "accept", "content": plan.answer or {}}}}
        asks: dict[str, dict[str, Any]] = {"tasks/get": {}, "tasks/cancel": {}}
        asks.update({"tasks/result": {}} if owner is run.older else {"tasks/update": accept})
        for method, params in asks.items():
            await _as_made_up(
                f, run, (owner, other), task_id, "task id", functools.partial(_ask_task, method, params)
            )
        if owner is run.older and other is not None:
            listed = await other.send("tasks/list", "tasks/list", {})
            f.expect(
                task_id not in listed.text, "another principal's tasks/list shows none of the owner's", listed
            )
        after = await owner.task("tasks/get", task_id)
        f.expect(not after.error and after.status != "cancelled", "the owner's task was left alone", after)
        await run.finish_task(owner, plan, task_id)
    return f


async def _stays(f: Findings, read: Callable[[], Awaitable[Reply]], ended: Reply) -> None:
    """Read the ended job twice more, `SETTLED_SECONDS` apart: its status must not move."""
    for _ in range(2):
        await anyio.sleep(SETTLED_SECONDS)
        again = await read()
        f.expect(again.status == ended.status, f"{ended.status} stays {ended.status}", again)


def _along_edges(path: list[str | None]) -> bool:
    """Whether every status is one of the Tasks extension's, and each change an allowed edge."""
    known = [Status(status) for status in path if status is not None and status in Status._value2member_map_]
    return len(known) == len(path) and all(can_transition(a, b) for a, b in itertools.pairwise(known))


async def transitions(run: Run) -> Findings:
    """Status moves only along the allowed edges; fetching early, answering or cancelling an ended job and
    cancelling twice move nothing wrongly; an ended job stays ended."""
    f = Findings()
    for plan, job in run.jobs("start", "progress", "fetch"):
        started = await start(run.owner, job, plan)
        if not f.expect(not started.error, f"{plan.name} started", started):
            continue
        handle = run.transcript.label(str(started.body.get("handle")), f"{plan.name}'s handle")
        early = await run.owner.call(job.tools["fetch"], {"handle": handle})
        if early.status in TERMINAL_STATUSES:
            f.note(f"{plan.name} ended before it could be fetched early [{early.request}]")
        else:
            f.expect(
                not early.error and not early.body.get("result"), "an early fetch gives no result", early
            )
        seen = [started.status, early.status]
        ended = await settle(run.owner, job, plan, handle, seen)
        if not _ended_along_edges(f, plan.name, seen, ended):
            continue
        late = []
        if "cancel" in job.tools:
            late.append(await run.owner.call(job.tools["cancel"], {"handle": handle}))
        if "respond" in job.tools:
            answers = {"q1": plan.answer or {}}
            late.append(await run.owner.call(job.tools["respond"], {"handle": handle, "responses": answers}))
        for reply in late:
            moved = reply.status not in (None, ended.status) or bool(reply.body.get("accepted"))
            f.expect(reply.error or not moved, "after the end, it changes nothing", reply)
        await _stays(f, functools.partial(run.owner.call, job.tools["progress"], {"handle": handle}), ended)
    for plan, job in run.jobs("start", "progress", "cancel"):
        if not plan.cancel or (started := await start(run.owner, job, plan)).error:
            continue
        handle = run.transcript.label(str(started.body.get("handle")), f"{plan.name}'s handle")
        for _ in range(2):
            f.expect(
                not (ack := await run.owner.call(job.tools["cancel"], {"handle": handle})).error,
                "cancel acknowledged",
                ack,
            )
        ended = await settle(run.owner, job, plan, handle)
        f.expect(ended.status in TERMINAL_STATUSES, f"cancelled twice, it ended ({ended.status})", ended)
    async for owner, _, plan, task_id in run.tasks():
        early = await owner.task("tasks/get", task_id)
        done_early = early.status == "completed"
        f.expect(
            not early.error and ("result" not in early.body or done_early), "no result before the end", early
        )
        seen = [early.status]
        ended = await settle_task(owner, plan, task_id, seen)
        if not _ended_along_edges(f, f"{plan.name}'s task", seen, ended):
            continue
        if owner is run.older:
            first, again = [await owner.task("tasks/result", task_id) for _ in range(2)]
            same = first.text == again.text and first.error == (ended.status == "failed")
            f.expect(same, "tasks/result of the ended task answers its end, the same twice", again)
            _refused_after_end(f, await owner.task("tasks/cancel", task_id))
        else:
            accept = {"q1": {"action": "accept", "content": plan.answer or {}}}
            for method in ("tasks/cancel", "tasks/cancel", "tasks/update"):
                acked = await owner.task(method, task_id, inputResponses=accept)
                f.expect(not acked.error, "after the end, acknowledged", acked)
        await _stays(f, functools.partial(owner.task, "tasks/get", task_id), ended)
    return f


def _refused_after_end(f: Findings, reply: Reply) -> None:
    """The 2025-11-25 design refuses `tasks/cancel` of an ended task with -32602."""
    f.expect(reply.error and reply.body.get("code") == -32602, "tasks/cancel after the end is -32602", reply)


def _ended_along_edges(f: Findings, name: str, seen: list[str | None], ended: Reply) -> bool:
    """Expect the statuses `seen` to follow the allowed edges to an end; whether the job ended."""
    path = [status for index, status in enumerate(seen) if index == 0 or status != seen[index - 1]]
    f.expect(_along_edges(path), f"{name} moved {' -> '.join(map(str, path))}", ended)
    return f.expect(ended.status in TERMINAL_STATUSES, f"{name} ended ({ended.status})", ended)


async def cancellation(run: Run) -> Findings:
    """A cancel is acknowledged, the job then reaches a terminal status, observed apart, and stays there."""
    f = Findings()
    for plan, job in run.jobs("start", "progress", "cancel"):
        if not plan.cancel or (started := await start(run.owner, job, plan)).error:
            continue
        handle = run.transcript.label(str(started.body.get("handle")), f"{plan.name}'s handle")
        ack = await run.owner.call(job.tools["cancel"], {"handle": handle})
        f.expect(not ack.error, f"{plan.name}: cancel acknowledged ({ack.status})", ack)
        ended = await settle(run.owner, job, plan, handle)
        if f.expect(ended.status in TERMINAL_STATUSES, f"then it ended ({ended.status})", ended):
            await _stays(
                f, functools.partial(run.owner.call, job.tools["progress"], {"handle": handle}), ended
            )
    async for owner, _, plan, task_id in run.tasks(cancel=True):
        ack = await owner.task("tasks/cancel", task_id)
        f.expect(not ack.error, f"{plan.name}: tasks/cancel acknowledged", ack)
        ended = await settle_task(owner, plan, task_id)
        if f.expect(ended.status in TERMINAL_STATUSES, f"then the task ended ({ended.status})", ended):
            await _stays(f, functools.partial(owner.task, "tasks/get", task_id), ended)
            if owner is run.older:
                _refused_after_end(f, await owner.task("tasks/cancel", task_id))
    return f


async def duplicate(run: Run) -> Findings:
    """A start retried with the same idempotency key leaves one job, also on a new connection after the
    first was dropped before or after the start's reply; the new connection resumes the job."""
    f = Findings()
    for plan, job in run.jobs("start", "progress"):
        properties = run.tools[job.tools["start"]].input_schema.get("properties") or {}
        if "idempotency_key" not in properties:
            f.note(f"{job.tools['start']} takes no idempotency_key")
            continue
        key = f"handles-check-{secrets.token_hex(8)}"
        first, second = [await start(run.owner, job, plan, key) for _ in range(2)]
        handles = {str(reply.body.get("handle")) for reply in (first, second) if not reply.error}
        f.expect(len(handles) == 1, f"{plan.name} started twice with one key: one job", second)
        for handle in handles:
            await run.finish(run.owner, plan, job, handle)
        for dropped in ("after", "before"):
            await _recovers(f, run, plan, job, dropped)
    return f


async def _recovers(f: Findings, run: Run, plan: JobPlan, job: JobManifest, dropped: str) -> None:
    """Start on a connection closed `dropped` the start's reply; on a new one, resume the job the reply
    named without a start, then retry the start twice with the key: one job, followed to its end."""
    key, known = f"handles-check-{secrets.token_hex(8)}", set()
    async with run.reconnect() as lost:
        with anyio.move_on_after(0 if dropped == "before" else REQUEST_SECONDS):
            if not (reply := await start(lost, job, plan, key)).error:
                known.add(run.transcript.label(str(reply.body.get("handle")), f"{plan.name}'s first handle"))
    if dropped == "before":  # whether the cancelled request reached the server is not observable
        f.note(f"{plan.name}: a start sent and dropped before its reply, its connection closed")
    async with run.reconnect() as new:
        for handle in known:
            resumed = await new.call(job.tools["progress"], {"handle": handle})
            f.expect(not resumed.error, f"{plan.name}: resumed on a new connection, without a start", resumed)
        retried = [await start(new, job, plan, key) for _ in range(2)]
        handles = known | {str(reply.body.get("handle")) for reply in retried if not reply.error}
        claim = f"{plan.name}: connection dropped {dropped} the start's reply, retried on a new one: one job"
        if f.expect(len(handles) == 1, claim, retried[-1]):
            handle = run.transcript.label(handles.pop(), f"{plan.name}'s handle")
            ended = await run.finish(new, plan, job, handle)
            f.expect(ended.status in TERMINAL_STATUSES, f"and followed to its end ({ended.status})", ended)


async def compatibility(run: Run) -> Findings:
    """A client without the Tasks extension gets the handle tools or an inline answer for every job; a
    client that declares it gets a task (when the server offers the extension)."""
    f = Findings()
    plain = Manifest.of(run.plain.client, await list_tools(run.plain.client))
    for plan in run.plan.jobs:
        job = plain.job(plan.name)
        if job is not None and {"start", "progress"} <= set(job.tools):
            started = await start(run.plain, job, plan)
            if f.expect(not started.error, f"{plan.name} started without the extension", started):
                handle = run.transcript.label(str(started.body.get("handle")), f"{plan.name}'s handle")
                ended = await settle(run.plain, job, plan, handle)
                f.expect(
                    ended.status in TERMINAL_STATUSES, f"and followed to its end ({ended.status})", ended
                )
        elif job is not None:
            reply = await run.plain.call(plan.name, plan.arguments)
            inline = not reply.error and reply.body.get("resultType") != "task"
            f.expect(inline, f"{plan.name} answers inline without the extension", reply)
        else:
            f.expect(False, f"{plan.name} is not offered to a client without the Tasks extension")
    for owner, _, plans in run.task_designs():
        design = "the Tasks extension" if owner is run.owner else "the 2025-11-25 design"
        f.expect(bool(plans), f"a planned job takes a task of {design}, which the server advertises")
        for plan in plans:
            task_id = await run.create_task(owner, plan)
            f.expect(task_id is not None, f"{plan.name} gives a task to a client of {design}")
            if task_id is not None:
                await run.finish_task(owner, plan, task_id)
    return f


_TRACE = re.compile(r'Traceback \(most recent call last\)|File "[^"]+", line \d+')
_PATH = re.compile(r"(?<![\w.:/])/(?:home|usr|opt|var|srv|root|app|tmp|etc)/[\w.-]+|site-packages|[A-Z]:\\\w")
_SHOWN_FIELDS = ("status_message", "statusMessage", "message", "error", "tool_error", "next")


def _shown_text(reply: Reply) -> str:
    """What a person may read of an answer: the whole of an error; the messages of any other answer."""
    if reply.error:
        return reply.text
    return " ".join(str(reply.body[name]) for name in _SHOWN_FIELDS if reply.body.get(name))


async def hygiene(run: Run) -> Findings:
    """No status message or error shows a sensitive value, a stack trace or an internal path."""
    f = Findings()
    for plan, job in run.jobs("start", "progress"):
        made_up = run.transcript.label(made_up_id(), "a made-up handle")
        await run.owner.call(job.tools["progress"], {"handle": made_up})
        refused = await run.owner.call(job.tools["start"], {**plan.arguments, "idempotency_key": [0]})
        started = await start(run.owner, job, plan)
        for reply in (refused, started):
            if not reply.error and "handle" in reply.body:
                await run.finish(run.owner, plan, job, str(reply.body["handle"]))
    secrets_ = run.plan.secrets()
    for reply in list(run.transcript.replies):
        text = _shown_text(reply)
        leaks = [f"a sensitive value ({len(value)} characters)" for value in secrets_ if value in text]
        leaks += [f"a stack trace ({m.group(0)!r})" for m in [_TRACE.search(text)] if m]
        leaks += [f"an internal path ({m.group(0)!r})" for m in [_PATH.search(text)] if m]
        if leaks:
            f.expect(False, "the answer shows " + ", ".join(leaks), reply)
    f.expect(not f.failed, f"{len(run.transcript.replies)} answers read, none shows what it must not")
    return f


Gate = Callable[[Run], Awaitable[Findings]]
GATES: dict[str, Gate] = {
    "isolation": isolation,
    "transitions": transitions,
    "cancellation": cancellation,
    "duplicate": duplicate,
    "compatibility": compatibility,
    "hygiene": hygiene,
}
"""Every gate, in the order they run (hygiene last: it reads every answer the others got)."""


def describe(gate: Gate) -> str:
    """The gate's one-line meaning (its docstring)."""
    return " ".join((gate.__doc__ or "").split())
