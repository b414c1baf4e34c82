"""What a server offers, read before the first call, and what a workflow needs of it (docs/client.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp_types import Tool
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    computed_field,
)

from handles.tasks_wire import TASKS_EXTENSION
from handles.tool_layout import (
    FOLLOW_VERBS,
    JOB_META_KEY,
    LAYOUTS,
    PLAIN_CALLS,
    SHARED_PREFIX,
    PlainCall,
    ToolLayout,
    ToolNames,
)

logger = logging.getLogger("handles.client")

Mode = Literal["tasks", "handles", "inline"]
"""How a job is run: through the Tasks extension, the handle tools (`<job>_start`, then progress, fetch,
cancel, respond), or one call of its plain tool `<job>` (answering its result, or its handle)."""
MODES: tuple[Mode, ...] = ("tasks", "handles", "inline")

Verb = Literal["start", "progress", "fetch", "cancel", "respond"]
"""What a workflow may need to do with a job besides running it."""
VERBS: tuple[str, ...] = ("start", *FOLLOW_VERBS)

TASK_OPERATIONS = ("tasks/get", "tasks/update", "tasks/cancel")
"""The Tasks extension's methods at 2026-07-28 (`tasks/list` and `tasks/result` are gone)."""

Connect = Callable[[], AbstractAsyncContextManager[Client]]
"""A factory of connected clients: `follow` opens (and re-opens after a lost connection) its own."""

K = TypeVar("K")
V = TypeVar("V")
FrozenMap = Annotated[Mapping[K, V], AfterValidator(MappingProxyType), PlainSerializer(dict)]
"""A mapping that cannot be changed once validated, serialised as a JSON object."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, validate_default=True)  # an empty FrozenMap default, validated


def server_identity(client: Client) -> str:
    """A stable name for the server behind `client`: its URL, its command line, or its announced name."""
    target = client.server
    if isinstance(target, str):
        return target.split("?", 1)[0]
    if isinstance(target, StdioServerParameters):
        return "stdio:" + " ".join([target.command, *target.args])
    if isinstance(target, MCPServer):
        return f"inprocess:{target.name}"
    info = client.server_info
    return f"server:{info.name if info is not None else type(target).__name__}"


async def list_tools(client: Client) -> list[Tool]:
    """Every tool the server lists, following `nextCursor` (at most 100 pages)."""
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


class JobManifest(_Frozen):
    """One job as the server lists it, and the modes this client can run it in."""

    name: str
    tools: FrozenMap[str, str]
    """The tool of each role listed for this job: `plain`, `start`, `progress`, `fetch`, `cancel`, `respond`."""
    layout: ToolLayout | None = None
    """The layout of its handle tools; None when it has none."""
    asks_input: bool = False
    """Whether it can ask questions (its answers go through `respond`, or `tasks/update`)."""
    plain_call: PlainCall | None = None
    """What its plain tool does for a caller without the Tasks extension: `"adaptive"` (answers inline, or
    a handle past its budget) or `"tasks_only"` (refuses); None when unsaid."""
    modes: tuple[Mode, ...] = ()
    """The modes this client can run it in on this connection."""


def runs_as_older_task(tool: Tool) -> bool:
    """Whether `tool` may run as a task of the 2025-11-25 design (`execution.taskSupport`)."""
    return tool.execution is not None and tool.execution.task_support in ("optional", "required")


class Manifest(_Frozen):
    """What one connection to a server offers: print it, or log `model_dump_json()`."""

    server: str
    """Where the server is: its URL, its command line, or `inprocess:<name>`."""
    server_name: str | None = None
    server_version: str | None = None
    """The server's name and version as it announced them (None when it did not)."""
    protocol_version: str
    """The negotiated MCP protocol version."""
    negotiated_by: Literal["discover", "initialize"]
    """`"discover"` (2026-07-28, no session) or `"initialize"` (a handshake, which has no Tasks extension)."""
    supported_versions: tuple[str, ...] = ()
    """The versions the server's discover answer lists (empty after an initialize handshake)."""
    tasks_offered: bool = False
    """Whether the server advertises the Tasks extension (`io.modelcontextprotocol/tasks`)."""
    tasks_declared: bool = False
    """Whether this client declares it on its requests."""
    tasks_designs: tuple[str, ...] = ()
    """The tasks designs the server serves on this connection: `"2026-07-28"` (the Tasks extension) and
    `"2025-11-25"` (the experimental design's `capabilities.tasks`)."""
    older_task_tools: tuple[str, ...] = ()
    """The tools a task of the 2025-11-25 design can run, sorted."""
    tools: tuple[str, ...] = ()
    """Every tool the server lists, sorted."""
    jobs: FrozenMap[str, JobManifest] = {}
    """The jobs found among the tools, by name."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tasks_usable(self) -> bool:
        """Whether jobs can be run through the Tasks extension on this connection."""
        return self._tasks_problem() is None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def task_operations(self) -> tuple[str, ...]:
        """The Tasks methods this client can send here (none unless `tasks_usable`)."""
        return TASK_OPERATIONS if self.tasks_usable else ()

    @classmethod
    def of(cls, client: Client, tools: Iterable[Tool], *, server: str | None = None) -> Manifest:
        """The manifest of a connected `client` whose server listed `tools` (no request is sent)."""
        info = client.server_info
        discovered = client.session.discover_result
        listed = list(tools)
        by_name = sorted(listed, key=lambda tool: tool.name)
        capabilities = client.server_capabilities
        offered = TASKS_EXTENSION in (capabilities.extensions or {})
        older = capabilities.tasks
        older_calls = bool(older and older.requests and older.requests.tools and older.requests.tools.call)
        designs = {"2026-07-28": offered, "2025-11-25": older is not None}
        declared = {getattr(extension, "identifier", None) for extension in client.extensions or ()}
        bare = cls(
            server=server or server_identity(client),
            server_name=info.name if info is not None and info.name else None,
            server_version=info.version if info is not None and info.version else None,
            protocol_version=client.protocol_version,
            negotiated_by="initialize" if discovered is None else "discover",
            supported_versions=() if discovered is None else tuple(discovered.supported_versions),
            tasks_offered=offered,
            tasks_declared=TASKS_EXTENSION in declared,
            tasks_designs=tuple(name for name, served in designs.items() if served),
            older_task_tools=tuple(tool.name for tool in by_name if older_calls and runs_as_older_task(tool)),
            tools=tuple(tool.name for tool in by_name),
        )
        tasks = bare._tasks_problem()
        jobs = {job.name: _with_modes(job, tasks) for job in _jobs(listed)}
        return bare.model_copy(update={"jobs": MappingProxyType(jobs)})

    def job(self, name: str) -> JobManifest | None:
        """The job `name`; a listed tool that is no job of a `handles` server is taken as a plain tool
        that may answer a task (the server decides); None when the server lists neither."""
        if name in self.jobs:
            return self.jobs[name]
        if name not in self.tools:
            return None
        return _with_modes(JobManifest(name=name, tools={"plain": name}), self._tasks_problem())

    def check(self, requirements: Requirements) -> Plan:
        """The mode each required job runs in: the first of its modes this connection offers; raises
        `RequirementsNotMet` listing every unmet requirement."""
        unmet: list[str] = []
        jobs, modes = requirements.jobs, requirements.modes
        if requirements.protocol_versions and self.protocol_version not in requirements.protocol_versions:
            wanted = " or ".join(sorted(requirements.protocol_versions))
            unmet.append(
                f"The connection speaks MCP {self.protocol_version}; this workflow needs {wanted}. Pin the "
                "server and the client's SDK to a version they both speak."
            )
        if not jobs:
            offered = {mode: self._offers(mode) for mode in modes}
            if all(offered.values()):
                unmet.append(
                    f"This workflow needs {_and(modes, 'or')}. "
                    + " ".join(f"Not {mode}: {problem}." for mode, problem in offered.items())
                )
        chosen = {name: self._choose(name, need, need.modes or modes) for name, need in jobs.items()}
        unmet += [said for mode, said in chosen.values() if mode is None]
        if unmet:
            raise RequirementsNotMet(unmet, self)
        fallbacks = {name: said for name, (_, said) in chosen.items() if said}
        for note in fallbacks.values():
            logger.info("%s: %s", self.server, note)
        return Plan(modes={name: mode for name, (mode, _) in chosen.items() if mode}, fallbacks=fallbacks)

    def _choose(self, name: str, need: Need, modes: tuple[Mode, ...]) -> tuple[Mode | None, str]:
        """The first of `modes` that job `name` can run in here doing what it `need`s, and why the modes
        before it were passed over; or None and what is unmet, with what to do."""
        job = self.job(name)
        if job is None:
            return None, (
                f"{name}: the server lists no such job (no {name}_start and no tool {name}; its jobs: "
                f"{', '.join(self.jobs) or 'none'}). Check the name, and which version of the server this is."
            )
        if "respond" in need.tools and not job.asks_input:
            return None, (
                f"{name}: the job asks no questions here (the server lists no respond tool for it), but this "
                "workflow expects to answer some. Check which version of the server this is."
            )
        tasks = self._tasks_problem()
        problems = {mode: _problem(job, mode, tasks, need.tools) for mode in MODES}
        usable = [mode for mode in modes if problems[mode] is None]
        passed = modes[: modes.index(usable[0])] if usable else modes
        why = " ".join(f"Not {mode}: {problems[mode]}." for mode in passed)
        if usable:
            return usable[0], f"{name} runs {usable[0]}, a declared fallback. {why}" if passed else ""
        others = tuple(mode for mode in MODES if problems[mode] is None)
        verbs = f" with {_and(sorted(need.tools))}" if need.tools else ""
        return None, f"{name} needs {_and(modes, 'or')}{verbs}. {why} " + (
            f"It could run {_and(others, 'or')} here, if the workflow declares that as a fallback."
            if others
            else "No mode serves it on this connection."
        )

    def _tasks_problem(self) -> str | None:
        """Why jobs cannot run through the Tasks extension on this connection (None: they can)."""
        if not self.tasks_declared:
            return (
                f"this client does not declare the {TASKS_EXTENSION} extension; connect with "
                "handles.client.connect(...), or Client(..., extensions=[TasksClientExtension()])"
            )
        if self.negotiated_by == "initialize" or self.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return (
                f"the connection was negotiated by an initialize handshake (MCP {self.protocol_version}), which "
                "has no Tasks extension: the server and the client must both speak 2026-07-28"
            )
        if not self.tasks_offered:
            return (
                f"the server does not advertise the {TASKS_EXTENSION} extension; a handles server offers it "
                "when its MCPServer is built with extensions=[jobs.tasks_extension()]"
            )
        return None

    def _offers(self, mode: Mode) -> str | None:
        """Why this connection offers `mode` for no job at all (None: it offers it)."""
        if mode == "tasks":
            return self._tasks_problem()
        if any(mode in job.modes for job in self.jobs.values()):
            return None
        return "no job of the server can run so"


def _one_or_many(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


def _each_once(modes: tuple[Mode, ...] | None) -> tuple[Mode, ...] | None:
    if modes is not None and (not modes or len(set(modes)) != len(modes)):
        raise ValueError("list at least one mode, each once, most wanted first")
    return modes


Modes = Annotated[tuple[Mode, ...], BeforeValidator(_one_or_many), AfterValidator(_each_once)]


class Need(_Frozen):
    """What a workflow needs of one job: `Need("respond")`, `Need(modes=("tasks",))`."""

    tools: frozenset[Verb] = frozenset()
    """What it must be able to do besides running the job (`"respond"`, `"cancel"`, ...)."""
    modes: Modes | None = None
    """The modes this job may run in, most wanted first; None: the workflow's `modes`."""

    def __init__(self, *tools: Verb, modes: Mode | Iterable[Mode] | None = None) -> None:
        BaseModel.__init__(self, tools=frozenset(tools), modes=modes)


def _needs(value: Any) -> Any:
    """Job names alone (`jobs=["generate_report"]`) need nothing besides running; verbs make a `Need`."""
    if not isinstance(value, Mapping):
        return dict.fromkeys(_one_or_many(value), Need())
    return {
        name: need if isinstance(need, Need) else Need(*_one_or_many(need)) for name, need in value.items()
    }


class Requirements(_Frozen):
    """What a workflow needs of a server: `modes` its jobs may run in, most wanted first; `jobs` it calls,
    each with the verbs it needs or a `Need`; `protocol_versions` it speaks."""

    modes: Modes
    jobs: Annotated[FrozenMap[str, Need], BeforeValidator(_needs)] = {}
    protocol_versions: Annotated[frozenset[str], BeforeValidator(_one_or_many)] = frozenset()

    def __init__(
        self,
        *,
        modes: Mode | Iterable[Mode],
        jobs: Mapping[str, Need | Iterable[Verb]] | Iterable[str] = (),
        protocol_versions: str | Iterable[str] = (),
    ) -> None:
        BaseModel.__init__(self, modes=modes, jobs=jobs, protocol_versions=protocol_versions)


class Plan(_Frozen):
    """The mode chosen for each required job; `plan["deploy_release"]`."""

    modes: FrozenMap[str, Mode] = {}
    fallbacks: FrozenMap[str, str] = {}
    """For each job that runs in a declared fallback mode: why the modes before it were passed over."""

    def __getitem__(self, job: str) -> Mode:
        return self.modes[job]


class RequirementsNotMet(Exception):
    """The server or this client cannot serve the workflow's `Requirements`; nothing was called."""

    def __init__(self, unmet: list[str], manifest: Manifest) -> None:
        self.unmet = tuple(unmet)
        self.manifest = manifest
        self.message = f"{manifest.server} does not meet this workflow's requirements:\n" + "\n".join(
            f"- {line}" for line in self.unmet
        )
        super().__init__(self.message)


async def read_manifest(client: Client | Connect, *, server: str | None = None) -> Manifest:
    """The manifest of the server behind `client` (a connected `mcp.Client`, or a factory such as
    `connect(url)`, which is opened for it): its negotiated state and one `tools/list`."""
    if isinstance(client, Client):
        return Manifest.of(client, await list_tools(client), server=server)
    async with client() as connected:
        return await read_manifest(connected, server=server or getattr(client, "server_id", None))


def _job_meta(tool: Tool) -> dict[str, Any] | None:
    """A `handles` server's description of the job behind a plain tool (`JOB_META_KEY`), if well formed."""
    meta = (tool.meta or {}).get(JOB_META_KEY)
    if (
        not isinstance(meta, dict)
        or meta.get("layout") not in LAYOUTS
        or meta.get("plain_call") not in PLAIN_CALLS
        or not isinstance(meta.get("asks_input"), bool)
    ):
        return None
    return meta


def _jobs(tools: list[Tool]) -> list[JobManifest]:
    """The jobs among `tools`: the plain tools a `handles` server describes; on a server that describes
    none, each `<job>_start` listed beside handle tools or a plain tool of its name."""
    listed = {tool.name for tool in tools}
    described = {tool.name: meta for tool in tools if (meta := _job_meta(tool)) is not None}
    names = set(described) or {
        job
        for name in listed
        if name.endswith("_start")
        and (job := name.removesuffix("_start")) != SHARED_PREFIX
        and (job in listed or ToolNames.discover(job, listed) is not None)
    }
    jobs = []
    for name in sorted(names):
        meta = described.get(name)
        layout = ToolNames(meta["layout"]) if meta is not None else ToolNames.discover(name, listed)
        roles = {"plain": name} if name in listed else {}
        for verb in VERBS:
            tool = (layout or ToolNames()).name(name, verb)
            if tool in listed and (verb == "start" or layout is not None):
                roles[verb] = tool
        asks_input = meta["asks_input"] if meta is not None else "respond" in roles
        if not asks_input:
            roles.pop("respond", None)
        jobs.append(
            JobManifest(
                name=name,
                tools=roles,
                layout=layout.layout if layout is not None and "progress" in roles else None,
                asks_input=asks_input,
                plain_call=None if meta is None else meta["plain_call"],
            )
        )
    return jobs


def _problem(job: JobManifest, mode: Mode, tasks: str | None, verbs: Collection[str] = ()) -> str | None:
    """Why `job` cannot run in `mode` doing each of `verbs` (None: it can); `tasks` is why the Tasks
    extension cannot be used (when it can, tasks/get, tasks/update and tasks/cancel serve every verb)."""
    if mode == "tasks":
        return tasks
    if mode == "handles":
        return _missing(job, ("start", "progress", "fetch")) or _missing(job, sorted(verbs))
    if "plain" not in job.tools:
        return f"the server lists no plain tool {job.name}"
    if job.plain_call == "tasks_only":
        return f"{job.name} runs only as a task: its plain tool refuses callers without the Tasks extension"
    if verbs:
        return f"an inline call cannot {_and(sorted(verbs))}: it answers once, or hands back a handle"
    return None


def _missing(job: JobManifest, verbs: Iterable[str]) -> str | None:
    """Which of the tools of `verbs` the server does not list for `job` (None: it lists them all)."""
    names = ToolNames(job.layout or "per_job")
    missing = [names.name(job.name, verb) for verb in verbs if verb not in job.tools]
    return f"the server lists no {_and(missing)}" if missing else None


def _with_modes(job: JobManifest, tasks: str | None) -> JobManifest:
    """`job` with the modes it can run in, `tasks` being why the Tasks extension cannot be used."""
    return job.model_copy(update={"modes": tuple(m for m in MODES if _problem(job, m, tasks) is None)})


def _and(items: Sequence[str], last: str = "and") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"
