"""`Handles`: the object a server author creates, decorates jobs on, and binds to a server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, cast, overload

from mcp.server.mcpserver import MCPServer

from handles.config import HandlesConfig
from handles.errors import ConfigurationError
from handles.handle import HandleCodec
from handles.job_operations import JobOperations
from handles.jobs import JobOptions, JobSpec
from handles.principal import PrincipalResolver, default_resolver
from handles.runtime import Runtime
from handles.sealing import Sealer
from handles.server.bind_mcpserver import add_tools, handle_tool, is_fastmcp
from handles.server.handle_tools import JobTools, SharedTools
from handles.server.older_tasks import serve_tasks
from handles.server.plain_tool import PlainCallPolicy, PlainTool
from handles.server.result_links import ResultLinks
from handles.server.tasks_extension import TasksExtension
from handles.server.tool_shapes import ToolDefinition
from handles.store import Clock, JobRepository, Store, utc_now
from handles.store.reach import database_errors, make_sqlite_folder
from handles.store.schema import SchemaGate
from handles.tool_layout import PlainCall, ToolLayout, ToolNames

if TYPE_CHECKING:
    from fastmcp import FastMCP

logger = logging.getLogger("handles")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class Handles:
    """A set of long jobs, their durable store, and the tools that serve them.

    ```python
    jobs = Handles()  # configuration from HANDLES_* environment variables

    @jobs.job(retention=timedelta(hours=6))
    async def generate_report(ctx: JobContext, account: str, months: int = 12) -> Report:
        ...

    server = MCPServer("reports", extensions=[jobs.tasks_extension()])
    jobs.bind(server)
    ```

    Args:
        config: every setting; default `HandlesConfig.from_env()` (the `HANDLES_*` variables).
        principal_resolver: `fn(context) -> str` (or an awaitable of it) naming a request's principal.
            Default: the verified access token's issuer, client id and subject, else the local principal.
        clock: the source of "now" (an aware `datetime`); tests pass a fake one.

    Nothing is opened until first use (`start()`, `running()`, or the first tool call).
    """

    def __init__(
        self,
        config: HandlesConfig | None = None,
        *,
        principal_resolver: PrincipalResolver | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.config = config or HandlesConfig.from_env()
        self.principal_resolver = principal_resolver or default_resolver(self.config.local_principal)
        self._clock = clock
        self._specs: dict[str, JobSpec] = {}
        self._plain: dict[str, PlainCallPolicy] = {}
        self._service: JobOperations | None = None
        self._tasks: TasksExtension | None = None

    @overload
    def job(self, fn: F, /) -> F: ...

    @overload
    def job(
        self,
        /,
        *,
        plain_call: PlainCall = "adaptive",
        inline_budget: timedelta | None = None,
        **options: Unpack[JobOptions],
    ) -> Callable[[F], F]: ...

    def job(
        self,
        fn: F | None = None,
        /,
        *,
        plain_call: PlainCall = "adaptive",
        inline_budget: timedelta | None = None,
        **options: Unpack[JobOptions],
    ) -> F | Callable[[F], F]:
        """Declare an async function as a long job. Usable bare (`@jobs.job`) or with options (see `JobSpec`).

        The job is also served as the plain tool `<name>`: a call declaring the Tasks extension becomes a
        task; any other follows `plain_call`: "adaptive" answers the result if the job ends within
        `inline_budget`, else its handle; "tasks_only" refuses with -32021.
        """
        if plain_call not in ("adaptive", "tasks_only"):
            raise ConfigurationError("plain_call must be 'adaptive' or 'tasks_only'.")
        if inline_budget is not None and inline_budget < timedelta(0):
            raise ConfigurationError("inline_budget must not be negative.")

        def register(function: F) -> F:
            spec = JobSpec.from_function(function, **options)
            if spec.name in self._specs:
                raise ConfigurationError(f"A job named {spec.name!r} is already declared.")
            if self._service is not None:
                raise ConfigurationError("Declare every job before binding or starting the Handles instance.")
            self._specs[spec.name] = spec
            self._plain[spec.name] = PlainCallPolicy(mode=plain_call, inline_budget=inline_budget)
            return function

        return register(fn) if fn is not None else register

    @property
    def specs(self) -> dict[str, JobSpec]:
        return dict(self._specs)

    @property
    def service(self) -> JobOperations:
        """The shared operations every face serves, built on first use without touching the database."""
        if self._service is None:
            url = self.config.resolved_database_url()
            make_sqlite_folder(url)
            keys = self.config.resolved_secret_keys()
            with database_errors(url):
                repository = JobRepository(url, clock=self._clock)
            store = Store.of(repository)
            sealer = Sealer(keys)
            runtime = Runtime(store=store, config=self.config, specs=self._specs, sealer=sealer)
            self._service = JobOperations(
                specs=self._specs,
                store=store,
                codec=HandleCodec(keys),
                sealer=sealer,
                runtime=runtime,
                config=self.config,
                schema=SchemaGate(repository, auto_migrate=self.config.auto_migrate),
            )
        return self._service

    @property
    def runtime(self) -> Runtime:
        return self.service.runtime

    def tool_definitions(self, layout: ToolLayout = "per_job") -> list[ToolDefinition]:
        """Every handle tool of every declared job, in `layout` (see `bind`)."""
        names = ToolNames.of(layout)
        service = self.service
        tools = {name: JobTools(spec, service, names) for name, spec in self._specs.items()}
        definitions = [definition for job in tools.values() for definition in job.definitions()]
        if names.shared:
            definitions.extend(SharedTools(tools, service, names).definitions())
        return definitions

    def plain_tools(self, layout: ToolLayout = "per_job") -> list[PlainTool]:
        """The plain tool `<job>` of every declared job, pointing at the tools of `layout`."""
        names = ToolNames.of(layout)
        service = self.service
        return [PlainTool(spec, service, self._plain[name], names) for name, spec in self._specs.items()]

    def tasks_extension(self) -> TasksExtension:
        """The Tasks extension serving these jobs; pass it to `MCPServer(extensions=[...])`."""
        if self._tasks is None:
            self._tasks = TasksExtension(self)
        return self._tasks

    def bind(
        self, server: MCPServer[Any] | FastMCP[Any], *, layout: ToolLayout = "per_job", tasks: bool = True
    ) -> None:
        """Add every declared job's handle tools and its plain tool `<job>` to `server`.

        `layout="per_job"` gives each job `<job>_start`, `_progress`, `_fetch`, `_cancel` (and `_respond`);
        `layout="compact"` keeps `<job>_start` and shares `jobs_progress`, `jobs_fetch`, `jobs_cancel` (and
        `jobs_respond`). `server` may be a FastMCP 4 server: there `tasks=True` adds the Tasks face, and a
        server already serving it (`fastmcp-tasks`) is refused unless `tasks=False` (docs/fastmcp.md).
        """
        if not self._specs:
            raise ConfigurationError(
                "No jobs are declared; decorate at least one function with @handles.job."
            )
        definitions = self.tool_definitions(layout)
        plain = self.plain_tools(layout)
        names = [definition.name for definition in definitions] + [tool.name for tool in plain]
        clashes = sorted({name for name in names if names.count(name) > 1})
        if clashes:
            raise ConfigurationError(
                f"Two tools would be named {', '.join(clashes)}; rename the job that causes it."
            )
        resolver = self.principal_resolver
        tools = [handle_tool(definition, resolver) for definition in definitions]
        tools += [tool.sdk_tool(resolver) for tool in plain]
        if is_fastmcp(server):
            from handles.server.bind_fastmcp import add_fastmcp_tools

            served_tasks = self.tasks_extension() if tasks else None
            sdk_server = add_fastmcp_tools(cast("FastMCP[Any]", server), tools, served_tasks)
        elif isinstance(server, MCPServer):
            served_tasks = self._tasks  # given in MCPServer(extensions=[...]), if at all
            sdk_server = add_tools(server, tools)
        else:
            raise ConfigurationError(
                f"bind() takes the SDK's MCPServer or a FastMCP 4 server, not {type(server).__name__}."
            )
        ResultLinks.install(sdk_server, self.service, resolver)
        if served_tasks is not None:
            # The SDK's Extension seam reaches neither subscriptions/listen nor the 2025-11-25 design: middleware.
            serve_tasks(served_tasks, sdk_server)

    async def prepare(self) -> None:
        """Build the machinery and bring the schema current, without starting the runtime.

        Raises `ConfigurationError` (saying what to do) for a missing key, a bad URL, an outdated schema,
        or a database that does not answer (`DatabaseUnreachable`).
        """
        service = self.service
        assert service.schema is not None
        await service.schema.open()

    async def start(self) -> None:
        """Start the runtime now (otherwise it starts on the first tool call); raises as `prepare` does."""
        await self.prepare()
        await self.service.ensure_running()

    def reconfigure(self, **changes: Any) -> None:
        """Change settings before the runtime starts, even if the machinery was already built."""
        self.config = replace(self.config, **changes)
        if self._service is not None:
            if self._service.runtime.started:
                raise ConfigurationError("Settings cannot change once the job runtime has started.")
            self._service.config = self.config
            self._service.switches.config = self.config
            self._service.runtime.reconfigure(self.config)
            if self._service.schema is not None and not self._service.schema.is_open:
                self._service.schema = SchemaGate(
                    self._service.store.repo, auto_migrate=self.config.auto_migrate
                )

    def begin_drain(self) -> None:
        """Stop taking new work at once; running jobs go on for up to `drain_seconds` and `aclose` finishes."""
        if self._service is not None:
            self._service.runtime.begin_drain()

    def end_drain(self) -> None:
        """End the drain now (a second shutdown signal): running jobs are handed over at once (see `aclose`)."""
        if self._service is not None:
            self._service.runtime.end_drain()

    async def drained(self) -> None:
        """After `begin_drain`: return once the running jobs have ended or `drain_seconds` have passed."""
        if self._service is not None:
            self._service.runtime.begin_drain()
            await self._service.runtime.drained()

    async def aclose(self) -> None:
        """Drain (see `stop`), then close the store; the runtime never restarts afterwards."""
        if self._service is None:
            return
        await self._service.runtime.stop()
        self._service.store.repo.dispose()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Handles]:
        """`async with jobs.running():` starts the runtime and stops it cleanly on exit."""
        await self.start()
        try:
            yield self
        finally:
            await self.aclose()
