"""The console's Starlette app: routes, the operator check on every one, and form handling."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.datastructures import FormData, MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handles.config import HandlesConfig
from handles.console import pages
from handles.console.auth import COOKIE, SESSION_SECONDS, Gate, Operator, clean_name, client_of
from handles.console.operations import PAGE_SIZE, Filters, Operations, cursor_of, parse_cursor
from handles.console.throttle import Throttled
from handles.errors import InvalidArguments
from handles.liveness import LeaseTiming
from handles.sealing import Sealer
from handles.store import JobRepository, Store

if TYPE_CHECKING:
    from handles.app import Handles

Handler = Callable[[Request, Operator], Awaitable[Response]]

SECURITY_HEADERS = {
    # No inline script, nothing fetched from elsewhere, no framing by another site.
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

REFUSED = "Sign in to the handles console first (operator token required)."


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _wants_json(request: Request) -> bool:
    """A script's request (the feed, or one that asks for JSON): refused with JSON, not the login page."""
    return "/api/" in request.url.path or "application/json" in request.headers.get("accept", "")


def form_answer(schema: dict[str, Any], form: FormData) -> dict[str, Any]:
    """The answer a question's form sends, as the JSON object `*_respond` would get."""
    answer: dict[str, Any] = {}
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type", "string")
        if kind == "array":
            answer[name] = [str(v) for v in form.getlist(name)]
            continue
        raw = form.get(name)
        if not isinstance(raw, str) or raw == "":
            continue  # left empty: absent (a required field is then reported missing)
        value: Any = raw
        if kind == "boolean" and raw in ("true", "false"):
            value = raw == "true"
        elif kind in ("integer", "number"):
            with contextlib.suppress(ValueError):
                number = float(raw)
                value = int(number) if kind == "integer" and number.is_integer() else number
        answer[name] = value
    return answer


class _SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every response of the console (pages, feed, refusals alike)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_secured)


@dataclass(eq=False)
class Console:
    """The console over one store; `handles` when mounted in that server (its runtime hears at once)."""

    ops: Operations
    gate: Gate

    def guarded(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """`handler`, for signed-in operators only; a POST must also carry the session's CSRF token."""

        async def endpoint(request: Request) -> Response:
            try:
                operator = self.gate.operator(request)
            except Throttled as throttled:
                return self.throttled(request, throttled)
            if operator is None:
                return self.refuse(request)
            if request.method == "POST":
                form = await request.form()
                csrf = form.get("csrf")
                if not self.gate.csrf_ok(operator, csrf if isinstance(csrf, str) else None):
                    return PlainTextResponse(
                        "This form is stale or was not sent by the console (CSRF check failed). "
                        "Reload the page and send it again.",
                        status_code=403,
                    )
            return await handler(request, operator)

        return endpoint

    def refuse(self, request: Request) -> Response:
        if request.method != "GET" or _wants_json(request):
            return JSONResponse({"error": "unauthenticated", "message": REFUSED}, status_code=401)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return HTMLResponse(pages.login(_base(request), target), status_code=401)

    def throttled(self, request: Request, throttled: Throttled, next_path: str = "") -> Response:
        """429 with `Retry-After`: the login form with the wait for a browser, JSON for a script."""
        headers = {"retry-after": str(throttled.retry_after)}
        message = (
            f"Too many wrong tokens from your address: try again in {throttled.retry_after} s "
            "(until then even the right token is refused)."
        )
        if request.url.path.endswith("/login") and not _wants_json(request):
            page = pages.login(_base(request), next_path or _base(request) + "/", message)
            return HTMLResponse(page, status_code=429, headers=headers)
        return JSONResponse({"error": "throttled", "message": message}, status_code=429, headers=headers)

    async def live_script(self, _request: Request) -> Response:
        """The jobs list's update script: no secret in it, so served without a credential."""
        return Response(pages.LIVE_SCRIPT, media_type="text/javascript")

    async def login_page(self, request: Request) -> Response:
        return HTMLResponse(pages.login(_base(request), _base(request) + "/"))

    async def login(self, request: Request) -> Response:
        form = await request.form()
        token, name, next_path = (str(form.get(k) or "") for k in ("token", "name", "next"))
        base = _base(request)
        name = clean_name(name)
        try:
            matches = self.gate.token_matches(token, client_of(request))
        except Throttled as throttled:
            return self.throttled(request, throttled, next_path)
        if not matches or not name:
            problem = "That is not the operator token." if name else "Give your name: it is recorded."
            return HTMLResponse(pages.login(base, next_path, problem), status_code=401)
        # only a path on this console: never an open redirect
        if not next_path.startswith(base + "/") or next_path.startswith("//"):
            next_path = base + "/"
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(
            COOKIE,
            self.gate.session_cookie(name),
            max_age=SESSION_SECONDS,
            path=base or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request, _operator: Operator) -> Response:
        response = RedirectResponse(_base(request) + "/login", status_code=303)
        response.delete_cookie(COOKIE, path=_base(request) or "/", httponly=True, samesite="strict")
        return response

    async def _listing(self, request: Request) -> tuple[list[dict[str, Any]], Filters, str | None]:
        filters = Filters.of(dict(request.query_params))
        found = await self.ops.page(filters, parse_cursor(request.query_params.get("after")))
        now = datetime.now(UTC)
        shown = found[:PAGE_SIZE]
        rows = [pages.row_data(job, now, _base(request), self.ops.timing) for job in shown]
        return rows, filters, cursor_of(shown[-1]) if len(found) > PAGE_SIZE else None

    async def jobs(self, request: Request, operator: Operator) -> Response:
        rows, filters, next_cursor = await self._listing(request)
        feed = f"{_base(request)}/api/jobs" + (f"?{request.url.query}" if request.url.query else "")
        return HTMLResponse(
            pages.jobs(
                rows,
                filters,
                base=_base(request),
                operator=operator,
                feed=feed,
                next_cursor=next_cursor,
                first_page="after" not in request.query_params,
            )
        )

    async def jobs_json(self, request: Request, _operator: Operator) -> Response:
        rows, _filters, next_cursor = await self._listing(request)
        return JSONResponse({"jobs": rows, "next": next_cursor})

    async def job(
        self,
        request: Request,
        operator: Operator,
        *,
        notice: str | None = None,
        problem: tuple[str, str] | None = None,
        status: int = 200,
    ) -> Response:
        """The job page; after a refused form, with its `notice` or the `(question key, problem)` shown."""
        job, questions, steps = await self.ops.job(request.path_params["job_id"])
        if job is None:
            missing = '<h1>No such job</h1><p class="muted">It may have ended and passed its retention.</p>'
            page = pages.page("No such job", missing, base=_base(request), operator=operator)
            return HTMLResponse(page, status_code=404)
        return HTMLResponse(
            pages.job_page(
                job,
                questions,
                steps,
                now=datetime.now(UTC),
                timing=self.ops.timing,
                reveal=request.query_params.get("reveal") == "1",
                base=_base(request),
                operator=operator,
                problem=problem,
                notice=notice,
            ),
            status_code=status,
        )

    async def answer(self, request: Request, operator: Operator) -> Response:
        job_id, key = request.path_params["job_id"], request.path_params["key"]
        job, questions, _steps = await self.ops.job(job_id)
        question = next((q for q in questions if q.key == key), None)
        if job is None or question is None:
            return await self.job(request, operator, notice="That question is not open any more.", status=404)
        answer = form_answer(question.requested_schema, await request.form())
        try:
            accepted = await self.ops.answer(job, key, answer, operator.recorded_as)
        except InvalidArguments as refused:
            return await self.job(
                request, operator, problem=(key, f"{refused.message} {refused.next_step}"), status=422
            )
        if not accepted:
            notice = "That question was already answered or the job has ended."
            return await self.job(request, operator, notice=notice, status=409)
        return RedirectResponse(
            f"{_base(request)}/jobs/{job_id}?{urlencode({'answered': key})}", status_code=303
        )

    async def cancel(self, request: Request, operator: Operator) -> Response:
        """The confirmation page (GET, or a POST that did not confirm), then the cancel."""
        job, _questions, _steps = await self.ops.job(request.path_params["job_id"])
        if job is None:
            return await self.job(request, operator)
        posted = request.method == "POST"
        if not posted or (await request.form()).get("confirm") != "yes":
            page = pages.cancel_confirm(job, base=_base(request), operator=operator)
            return HTMLResponse(page, status_code=400 if posted else 200)
        await self.ops.cancel(job, operator.recorded_as)
        return RedirectResponse(f"{_base(request)}/jobs/{job.id}", status_code=303)

    async def overview(self, request: Request, operator: Operator) -> Response:
        now = datetime.now(UTC)
        summary = await self.ops.overview(now)
        return HTMLResponse(pages.overview(summary, now=now, base=_base(request), operator=operator))

    def routes(self) -> list[Route]:
        g = self.guarded
        return [
            Route("/", g(self.jobs), methods=["GET"]),
            Route("/api/jobs", g(self.jobs_json), methods=["GET"]),
            Route("/overview", g(self.overview), methods=["GET"]),
            Route("/jobs/{job_id}", g(self.job), methods=["GET"]),
            Route("/jobs/{job_id}/answer/{key}", g(self.answer), methods=["POST"]),
            Route("/jobs/{job_id}/cancel", g(self.cancel), methods=["GET", "POST"]),
            Route("/live.js", self.live_script, methods=["GET"]),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", g(self.logout), methods=["POST"]),
        ]


def console_app(handles_or_database_url: Handles | str, *, token: str) -> Starlette:
    """The operator console as a Starlette app, on the store of a `Handles` or on a database URL; `token`
    (at least 16 characters) is the operator credential."""
    from handles.app import Handles

    repository: JobRepository | None = None
    if isinstance(handles_or_database_url, Handles):
        service = handles_or_database_url.service
        operations = Operations(
            service.store, service.sealer, LeaseTiming.of(service.config), service.runtime
        )
    else:
        repository = JobRepository(handles_or_database_url)
        store = Store.of(repository)
        store.origin = "console"
        config = HandlesConfig.from_env()
        operations = Operations(store, Sealer(config.resolved_secret_keys()), LeaseTiming.of(config))
    console = Console(operations, Gate(token))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if repository is not None:
                repository.dispose()

    app = Starlette(routes=console.routes(), lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    return app
