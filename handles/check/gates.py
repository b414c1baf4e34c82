"""The gates `handles check` runs: each drives the server over the public wire and keeps its evidence."""

from __future__ import annotations

import asyncio
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

from handles.check.plan import CheckPlan, JobPlan, LoadPlan
from handles.check.wire import (
    REQUEST_SECONDS,
    Caller,
    Followed,
    Reply,
    Transcript,
    altered,
    made_up_id,
    start,
)
from handles.client.manifest import JobManifest, Manifest, list_tools, read_manifest
from handles.client.tasks import TERMINAL_STATUSES
from handles.states import Status, can_transition
from handles.tool_layout import FOLLOW_VERBS

SETTLED_SECONDS = 1.0
"""How long an ended job is watched for a status that changes again."""


@dataclass
class Findings:
    """A gate's evidence: one line per claim checked, naming the request that showed it."""

    evidence: list[str] = field(default_factory=list)
    failed: bool = False
    applied: bool = False

    def ended(self, reply: Reply, claim: str = "then it ended") -> bool:
        """Expect `reply` to show a terminal status."""
        return self.expect(reply.status in TERMINAL_STATUSES, f"{claim} ({reply.status})", reply)

    def expect(self, ok: bool, claim: str, reply: Reply | None = None) -> bool:
        self.applied = True
        shown = "" if reply is None else f" [{reply.request}]" if ok else f" [{reply.shown()}]"
        self.evidence.append(f"{'ok' if ok else 'FAILED'}: {claim}{shown}")
        self.failed |= not ok
        return ok


Reconnect = Callable[[], AbstractAsyncContextManager[Caller]]
"""A new connection of the owner's."""


@dataclass
class Run:
    """The connections every gate works with (see `run_gates`), and what the server lists on them."""

    plan: CheckPlan
    owner: Caller
    other: Caller | None
    plain: Caller
    older: Caller
    older_other: Caller | None
    reconnect: Reconnect
    manifest: Manifest
    older_manifest: Manifest
    tools: dict[str, Tool]

    @classmethod
    async def read(cls, plan: CheckPlan, callers: list[Caller | None], reconnect: Reconnect) -> Run:
        owner, other, plain, older, older_other = callers
        assert owner is not None and plain is not None and older is not None
        listed, older_listed = await list_tools(owner.client), await list_tools(older.client)
        manifest, older_manifest = Manifest.of(owner.client, listed), Manifest.of(older.client, older_listed)
        tools = {tool.name: tool for tool in listed}
        return cls(plan, owner, other, plain, older, older_other, reconnect, manifest, older_manifest, tools)

    @property
    def transcript(self) -> Transcript:
        return self.owner.transcript

    def jobs(self, *roles: str) -> list[tuple[JobPlan, JobManifest]]:
        """The planned jobs the server lists with every one of `roles` (`start`, `progress`, `plain`, ...)."""
        found = [(plan, self.manifest.job(plan.name)) for plan in self.plan.jobs]
        return [(plan, job) for plan, job in found if job is not None and set(roles) <= set(job.tools)]

    async def started(
        self, f: Findings, plan: JobPlan, job: JobManifest, caller: Caller | None = None
    ) -> Followed | None:
        """`plan`'s job started through its start tool (by the owner unless `caller` is given)."""
        reply = await start(caller or self.owner, job, plan)
        if not f.expect(not reply.error and "handle" in reply.body, f"{plan.name} started", reply):
            return None
        handle = self.transcript.label(str(reply.body["handle"]), "the owner's handle")
        return Followed(caller or self.owner, plan, handle, job)

    def task_designs(self) -> list[tuple[Caller, list[JobPlan]]]:
        """Each tasks design the server offers: the owner's caller, and the planned jobs it may run as tasks."""
        designs = []
        if self.manifest.tasks_offered:
            designs.append((self.owner, [plan for plan, _ in self.jobs("plain")]))
        if marked := self.older_manifest.older_task_tools:
            designs.append((self.older, [plan for plan in self.plan.jobs if plan.name in marked]))
        return designs

    async def create_task(self, caller: Caller, plan: JobPlan) -> Followed | None:
        """The task of `plan`'s plain tool, as `caller`'s design asks for one; None when no task came."""
        if caller.older:
            params = {"name": plan.name, "arguments": plan.arguments, "task": {}}
            created = await caller.send(f"tools/call {plan.name} (a task)", "tools/call", params)
            task_id = None if created.error else (created.body.get("task") or {}).get("taskId")
        else:
            created = await caller.call(plan.name, plan.arguments)
            task = not created.error and created.body.get("resultType") == "task"
            task_id = created.body.get("taskId") if task else None
        if task_id is None:
            return None
        return Followed(caller, plan, self.transcript.label(str(task_id), "the owner's task id"))

    async def followed(self, f: Findings, *roles: str, cancel: bool = False) -> AsyncIterator[Followed]:
        """A new job of each planned job with the tools of `roles`, then a new task of each, in each design."""
        for plan, job in self.jobs("start", "progress", *roles):
            if (plan.cancel or not cancel) and (followed := await self.started(f, plan, job)):
                yield followed
        async for task in self.tasks(cancel):
            yield task

    async def tasks(self, cancel: bool = False) -> AsyncIterator[Followed]:
        for caller, plans in self.task_designs():
            for plan in plans:
                if (plan.cancel or not cancel) and (task := await self.create_task(caller, plan)):
                    yield task

    def other_of(self, caller: Caller) -> Caller | None:
        """The other principal on the same kind of connection as `caller`."""
        return self.older_other if caller.older else self.other


Ask = Callable[[Caller, str], Awaitable[Reply]]


async def _as_made_up(f: Findings, run: Run, owner: Caller, owned: str, noun: str, ask: Ask) -> None:
    """`ask` about the owner's `owned` id (by another principal) or an altered id: as about a made-up id."""
    other = run.other_of(owner)
    forged = run.transcript.label(altered(owned), f"an altered {noun}")
    made_up = run.transcript.label(owned[: owned.rfind("/") + 1] + made_up_id(), f"a made-up {noun}")
    others = [] if other is None else [(other, owned), (other, forged)]
    for caller, used in [*others, (owner, forged)]:
        baseline, got = await ask(caller, made_up), await ask(caller, used)
        same = got.text.replace(used, "<id>") == baseline.text.replace(made_up, "<id>")
        f.expect(got.error and baseline.error and same, f"answers like a made-up {noun}", got)


async def _pushes_alike(f: Findings, run: Run, task: Followed) -> None:
    """`subscriptions/listen` treats another principal's or an altered task id as a made-up one."""
    forged = run.transcript.label(altered(task.id), "an altered task id")
    made_up = run.transcript.label(made_up_id(), "a made-up task id")
    own = await task.caller.listen([task.id, forged, made_up])
    pushes = "pushes" if task.id in own.body["honored"] else "does not push"
    f.evidence.append(f"the server {pushes} the owner's task status to the owner [{own.request}]")
    other = run.other_of(task.caller)
    for reply in [own] if other is None else [own, await other.listen([task.id, forged, made_up])]:
        honored, pushed = reply.body["honored"], reply.body["pushed"]
        strangers = [forged] if reply is own else [task.id, forged]
        alike = all((id_ in honored) == (made_up in honored) and id_ not in pushed for id_ in strangers)
        f.expect(alike, "pushes nothing it would not push for a made-up task id", reply)


def _links(body: Any) -> set[str]:
    """The result links in an answer: `resource_link` items and `result_link` fields (of parts, the first)."""
    found, todo = set(), [body]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
            for link in (item, item.get("result_link")):
                named = link is not item or item.get("type") == "resource_link"
                if named and isinstance(link, dict) and isinstance(link.get("uri"), str):
                    parts = link.get("parts")
                    found.add(link["uri"] + ("/parts/0" if isinstance(parts, int) and parts > 1 else ""))
    return found


async def isolation(run: Run) -> Findings:
    """Another's handle, task id or result link, or an altered one, gets what a made-up one gets."""
    f = Findings()
    if run.other is None:
        f.evidence.append("one principal only: another principal's access is not tested, altered ids are")
    async for followed in run.followed(f):
        job, owner = followed.job, followed.caller
        noun = "handle" if job is not None else "task id"
        tools = job.tools if job else ("progress", "cancel", "respond")  # a task's: tasks/get, cancel, update
        for verb in (verb for verb in FOLLOW_VERBS if verb in tools):
            ask = followed.respond if verb == "respond" else functools.partial(followed.ask, verb)
            await _as_made_up(f, run, owner, followed.id, noun, ask)
        if job is None and not owner.older:
            await _pushes_alike(f, run, followed)
        if owner.older and (other := run.other_of(owner)) is not None:
            listed = await other.send("tasks/list", "tasks/list", {})
            shown = followed.id not in listed.text
            f.expect(shown, "another principal's tasks/list shows none of the owner's", listed)
        after = await followed.read()
        f.expect(not after.error and after.status != "cancelled", "the owner's job was left alone", after)
        if job is not None and "fetch" in job.tools:  # run to its end: a result link comes with the fetch
            await followed.settle()
            ended = await followed.ask("fetch")
        else:
            ended = await followed.finish()
        for uri in _links(ended.body):
            link = run.transcript.label(uri, "the owner's result link")
            if (own := await owner.read(link)).error:
                f.evidence.append(f"the owner's own read of its result link is refused too [{own.shown()}]")
            else:
                f.expect(True, "the owner reads its result link", own)
            await _as_made_up(f, run, owner, link, "result link", Caller.read)
    return f


async def _stays(f: Findings, followed: Followed, ended: Reply) -> None:
    """Read the ended job twice more, `SETTLED_SECONDS` apart: its status must not move."""
    for _ in range(2):
        await anyio.sleep(SETTLED_SECONDS)
        again = await followed.read()
        f.expect(again.status == ended.status, f"{ended.status} stays {ended.status}", again)


def _ended_along_edges(f: Findings, name: str, seen: list[str | None], ended: Reply) -> bool:
    """Expect `seen` to follow the allowed edges of the Tasks statuses to an end; whether the job ended."""
    path = [status for index, status in enumerate(seen) if index == 0 or status != seen[index - 1]]
    known = [Status(status) for status in path if status is not None and status in Status._value2member_map_]
    along = len(known) == len(path) and all(can_transition(a, b) for a, b in itertools.pairwise(known))
    f.expect(along, f"{name} moved {' -> '.join(map(str, path))}", ended)
    return f.ended(ended, f"{name} ended")


def _refused_after_end(f: Findings, reply: Reply) -> None:
    """The 2025-11-25 design refuses `tasks/cancel` of an ended task with -32602."""
    f.expect(reply.error and reply.body.get("code") == -32602, "tasks/cancel after the end is -32602", reply)


async def transitions(run: Run) -> Findings:
    """Status moves along the allowed edges, then stays; early fetches, late answers, cancels move nothing."""
    f = Findings()
    for plan, job in run.jobs("start", "progress", "fetch"):
        if (followed := await run.started(f, plan, job)) is None:
            continue
        early = await followed.ask("fetch")
        if early.status in TERMINAL_STATUSES:
            f.evidence.append(f"{plan.name} ended before it could be fetched early [{early.request}]")
        else:
            no_result = not early.error and not early.body.get("result")
            f.expect(no_result, "an early fetch gives no result", early)
        seen = [early.status]
        if not _ended_along_edges(f, plan.name, seen, ended := await followed.settle(seen)):
            continue
        late = [await followed.cancel()] if "cancel" in job.tools else []
        if "respond" in job.tools:
            late.append(await followed.respond())
        for reply in late:
            moved = reply.status not in (None, ended.status) or bool(reply.body.get("accepted"))
            f.expect(reply.error or not moved, "after the end, it changes nothing", reply)
        await _stays(f, followed, ended)
    for plan, job in run.jobs("start", "progress", "cancel"):
        if plan.cancel and (followed := await run.started(f, plan, job)) is not None:
            for _ in range(2):
                f.expect(not (ack := await followed.cancel()).error, "cancel acknowledged", ack)
            ended = await followed.settle()
            f.ended(ended, "cancelled twice, it ended")
    async for task in run.tasks():
        early = await task.read()
        result_early = "result" in early.body and early.status != "completed"
        f.expect(not early.error and not result_early, "no result before the end", early)
        seen = [early.status]
        if not _ended_along_edges(f, f"{task.plan.name}'s task", seen, ended := await task.settle(seen)):
            continue
        if task.caller.older:
            first, again = [await task.ask("tasks/result") for _ in range(2)]
            same = first.text == again.text and first.error == (ended.status == "failed")
            f.expect(same, "tasks/result of the ended task answers its end, the same twice", again)
            _refused_after_end(f, await task.cancel())
        else:
            for acked in [await task.cancel(), await task.cancel(), await task.respond()]:
                f.expect(not acked.error, "after the end, acknowledged", acked)
        await _stays(f, task, ended)
    return f


async def cancellation(run: Run) -> Findings:
    """A cancel is acknowledged, the job then reaches a terminal status, observed apart, and stays there."""
    f = Findings()
    async for followed in run.followed(f, "cancel", cancel=True):
        ack = await followed.cancel()
        f.expect(not ack.error, f"{followed.plan.name}: cancel acknowledged ({ack.status})", ack)
        ended = await followed.settle()
        if f.ended(ended):
            await _stays(f, followed, ended)
            if followed.caller.older:
                _refused_after_end(f, await followed.cancel())
    return f


async def duplicate(run: Run) -> Findings:
    """A start retried with its key after a dropped connection leaves one job, resumed without a start."""
    f = Findings()
    for plan, job in run.jobs("start", "progress"):
        properties = run.tools[job.tools["start"]].input_schema.get("properties") or {}
        if "idempotency_key" not in properties:
            f.evidence.append(f"{job.tools['start']} takes no idempotency_key")
            continue
        for dropped in ("after", "before"):
            key, known, named = f"handles-check-{secrets.token_hex(8)}", set(), f"{plan.name}'s handle"
            async with run.reconnect() as lost:
                with anyio.move_on_after(0 if dropped == "before" else REQUEST_SECONDS):
                    if not (reply := await start(lost, job, plan, key)).error:
                        known.add(run.transcript.label(str(reply.body.get("handle")), named))
            if dropped == "before":  # whether the cancelled request reached the server is not observable
                f.evidence.append(f"{plan.name}: a start sent, then its connection closed before the reply")
            async with run.reconnect() as new:
                for resumed in [await Followed(new, plan, handle, job).read() for handle in known]:
                    f.expect(
                        not resumed.error, f"{plan.name}: resumed on a new connection, no start", resumed
                    )
                retried = [await start(new, job, plan, key) for _ in range(2)]
                handles = known | {str(reply.body.get("handle")) for reply in retried if not reply.error}
                claim = f"{plan.name}: dropped {dropped} the start's reply, started twice more with its key: one job"
                if f.expect(len(handles) == 1, claim, retried[-1]):
                    handle = run.transcript.label(handles.pop(), named)
                    f.ended(await Followed(new, plan, handle, job).finish(), "and followed to its end")
    return f


async def compatibility(run: Run) -> Findings:
    """Without the Tasks extension every job runs (handle tools or inline); each advertised design serves."""
    f = Findings()
    plain = await read_manifest(run.plain.client)
    for plan in run.plan.jobs:
        job = plain.job(plan.name)
        if job is not None and {"start", "progress"} <= set(job.tools):
            if followed := await run.started(f, plan, job, run.plain):
                f.ended(await followed.settle(), "and followed to its end")
        elif job is not None:
            reply = await run.plain.call(plan.name, plan.arguments)
            inline = not reply.error and reply.body.get("resultType") != "task"
            f.expect(inline, f"{plan.name} answers inline without the extension", reply)
        else:
            f.expect(False, f"{plan.name} is not offered to a client without the Tasks extension")
    for caller, plans in run.task_designs():
        design = "the 2025-11-25 design" if caller.older else "the Tasks extension"
        f.expect(bool(plans), f"a planned job takes a task of {design}, which the server advertises")
        for plan in plans:
            task, created = await run.create_task(caller, plan), run.transcript.replies[-1]  # its tools/call
            f.expect(task is not None, f"{plan.name} gives a task to a client of {design}", created)
            if task is not None:
                await task.finish()
    return f


_TRACE = re.compile(r'Traceback \(most recent call last\)|File "[^"]+", line \d+')
_PATH = re.compile(r"(?<![\w.:/])/(?:home|usr|opt|var|srv|root|app|tmp|etc)/[\w.-]+|site-packages|[A-Z]:\\\w")
_SHOWN_FIELDS = ("status_message", "statusMessage", "message", "error", "tool_error", "next")


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
                await Followed(run.owner, plan, str(reply.body["handle"]), job).finish()
    secrets_ = run.plan.secrets()
    for reply in list(run.transcript.replies):
        # What a person may read of an answer: the whole of an error; the messages of any other answer.
        messages = " ".join(str(reply.body[key]) for key in _SHOWN_FIELDS if reply.body.get(key))
        text = reply.text if reply.error else messages
        leaks = [f"a sensitive value ({len(value)} characters)" for value in secrets_ if value in text]
        leaks += [f"a stack trace ({m.group(0)!r})" for m in [_TRACE.search(text)] if m]
        leaks += [f"an internal path ({m.group(0)!r})" for m in [_PATH.search(text)] if m]
        if leaks:
            f.expect(False, "the answer shows " + ", ".join(leaks), reply)
    f.expect(not f.failed, f"{len(run.transcript.replies)} answers read, none shows what it must not")
    return f


async def _paced(f: Findings, followed: Followed, reply: Reply, seconds: float) -> None:
    """Follow a job at the pace its replies ask for: each reply before its end says when to poll again."""
    began, polls = anyio.current_time(), 0
    while reply.status not in TERMINAL_STATUSES and anyio.current_time() - began < seconds:
        if not f.expect(reply.poll_ms is not None, "the reply says when to poll again", reply):
            return
        await anyio.sleep((reply.poll_ms or 0) / 1000)
        reply, polls = await followed.read(), polls + 1
    took = anyio.current_time() - began
    f.ended(reply, f"{followed.plan.name} ended after {polls} polls in {took:.1f} s, as its replies asked")


async def load(run: Run) -> Findings:
    """Opt-in: concurrent starts per principal within the declared limit and time (an over-limit start gets
    the documented refusal), each job polled as its replies ask, ended jobs cleaned within the retention."""
    f, limits = Findings(), run.plan.load or LoadPlan()
    found = [(plan, job) for plan, job in run.jobs("start", "progress") if limits.job in (None, plan.name)]
    for (plan, job), caller in itertools.product(found[:1], filter(None, (run.owner, run.other))):
        replies: list[Reply] = []
        with anyio.move_on_after(limits.seconds) as bounded:  # the starts sent at once
            replies = await asyncio.gather(*(start(caller, job, plan) for _ in range(limits.starts)))
        within = f"{caller.name}: {limits.starts} concurrent starts of {plan.name} answered within {limits.seconds:g} s"
        if not f.expect(not bounded.cancelled_caught, within):
            continue
        started = [reply for reply in replies if not reply.error and "handle" in reply.body]
        allowed = min(limits.starts, limits.limit or limits.starts)
        claim = f"{len(started)} started, the declared limit allowing {allowed}"
        f.expect(len(started) == allowed, claim, replies[-1])
        for refused in (reply for reply in replies if reply not in started):
            claim = f"the start over the limit is refused with {limits.refusal}"
            f.expect(limits.refusal in refused.text, claim, refused)
        label = functools.partial(run.transcript.label, name="a load job's handle")
        followers = [Followed(caller, plan, label(str(reply.body["handle"])), job) for reply in started]
        await asyncio.gather(*map(functools.partial(_paced, f, seconds=limits.seconds), followers, started))
        if limits.retention is None:
            f.evidence.append("clean-up not checked: [load] sets no retention the gate may wait")
            continue
        await anyio.sleep(limits.retention)
        for gone in [await followed.read() for followed in followers]:
            f.expect(gone.error, f"cleaned within the retention ({limits.retention:g} s)", gone)
    return f


Gate = Callable[[Run], Awaitable[Findings]]
GATES: dict[str, Gate] = {
    gate.__name__: gate for gate in (isolation, transitions, cancellation, duplicate, compatibility, hygiene)
}
"""The gates a run selects by default, in their order (hygiene last: it reads every answer the others got)."""

ALL_GATES: dict[str, Gate] = {**GATES, "load": load}
"""Every gate; `load` runs when `--only` names it or the checks file has a `[load]` table."""
