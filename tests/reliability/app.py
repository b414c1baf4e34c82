"""The reliability suite's server: jobs built to be attacked, served like a real deployment.

Run as a subprocess: `python -m tests.reliability.app --port N --tokens FILE` (stateless
Streamable HTTP, bearer tokens, the Tasks extension), configured by `HANDLES_*`.

- `charge(n, hold, pre_hold, step_hold, recheck)`: one durable step with an external effect (a line in
  `RELIABILITY_EFFECTS`), retried on interruption; `step_hold` keeps the process inside the step
  after the effect happened, so a kill there leaves the step's outcome unknown.
- `approve(version)`: asks a question, then performs a durable effect with the answer.
- `slow(seconds)`: reports progress ten times and stops at its next checkpoint when cancelled.
- `quick(x)`: ends at once.
- `leaky(mode)`: fails in ways whose raw text carries the server's secrets (never shown to callers).
- `noisy(message, ask)`: reports (and optionally asks) an arbitrary text: status messages are data.
- `sized(nbytes)`: returns a result of about `nbytes` bytes (the 1 MiB result limit).
- `echo(...)`: many parameter types, for fuzzing the generated schemas.
- `kept(n)`: abandoned when nobody looks for a minute (the polling keep-alive).
- `unlock(vault, passphrase, crash)`: a sensitive argument and a sensitive answer, written by the job
  into its status messages, question and exception.

The token verifier re-reads its tokens file when the file changes, so a test can revoke a
credential while the server runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field, SecretStr

from handles import Handles, HandlesConfig, JobContext, JobFailed

POLL = timedelta(milliseconds=200)
SECRET_IN_ERRORS = "reliability-db-password-Zq81"
"""Put into exception texts by `leaky`; the suite's wire scan must never see it."""

SENSITIVE_PASSPHRASE = "vault-passphrase-Qx71-sensitive"
SENSITIVE_OTP = "otp-552918-kR-sensitive"
"""What callers send to `unlock` (a `SecretStr` argument and a `SecretStr` answer); the wire scan, the
server log and the database must never hold them in the clear."""


def effects_file() -> Path | None:
    path = os.environ.get("RELIABILITY_EFFECTS")
    return Path(path) if path else None


def record_effect(line: str, hold: float = 0.0) -> str:
    """The external effect: one line, durably written, then (optionally) a pause inside the step."""
    path = effects_file()
    if path is not None:
        with path.open("a") as effects:
            effects.write(line + "\n")
            effects.flush()
            os.fsync(effects.fileno())
    if hold > 0:
        time.sleep(hold)  # runs on a worker thread: the process may be killed right here
    return line


def effect_count(line: str) -> int:
    path = effects_file()
    if path is None or not path.exists():
        return 0
    return path.read_text().splitlines().count(line)


class Outcome(BaseModel):
    n: int
    job: str
    attempt: int
    receipt: str


class Approval(BaseModel):
    approve: bool = Field(description="Go ahead?")
    note: str = Field("", description="Anything to add.")


class Shipped(BaseModel):
    version: str
    approved: bool
    note: str


class Done(BaseModel):
    steps: int


class Otp(BaseModel):
    otp: SecretStr = Field(description="The one-time code.")


class Echoed(BaseModel):
    text: str
    count: int
    ratio: float
    flag: bool
    choice: str
    items: list[int]
    nested: dict[str, Any] | None


class Blob(BaseModel):
    blob: str


async def _hold(ctx: JobContext, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        await ctx.checkpoint()
        await asyncio.sleep(min(0.05, max(deadline - loop.time(), 0)))


async def charge(
    ctx: JobContext,
    n: int,
    hold: Annotated[float, Field(ge=0, le=60)] = 0.0,
    pre_hold: Annotated[float, Field(ge=0, le=60)] = 0.0,
    step_hold: Annotated[float, Field(ge=0, le=60)] = 0.0,
    recheck: bool = False,
) -> Outcome:
    """Hold `pre_hold` s, charge `n` once (a durable step with an external effect), then hold `hold` s."""
    line = f"{ctx.job_id} charge {n}"
    await ctx.progress(0, 2, "charging")
    await _hold(ctx, pre_hold)

    def look_up() -> str:
        return f"recheck:{effect_count(line)}"

    receipt = await ctx.step("charge", record_effect, line, step_hold, recheck=look_up if recheck else None)
    await ctx.progress(1, 2, "charged")
    await _hold(ctx, hold)
    return Outcome(n=n, job=ctx.job_id, attempt=ctx.attempt, receipt=str(receipt))


async def approve(ctx: JobContext, version: str, hold: Annotated[float, Field(ge=0, le=60)] = 0.0) -> Shipped:
    """Ask for an approval, then ship (a durable effect) with the answer."""
    await _hold(ctx, hold)
    answer = await ctx.ask(f"Ship {version}?", Approval)
    if answer.approve:
        await ctx.step("ship", record_effect, f"{ctx.job_id} ship {version} {answer.note}")
    return Shipped(version=version, approved=answer.approve, note=answer.note)


async def slow(ctx: JobContext, seconds: Annotated[float, Field(ge=0, le=600)] = 1.0) -> Done:
    """Work for `seconds`, reporting progress ten times."""
    for step in range(10):
        await ctx.checkpoint()
        await asyncio.sleep(seconds / 10)
        await ctx.progress(step + 1, 10, f"Step {step + 1} of 10")
    return Done(steps=10)


async def quick(ctx: JobContext, x: int = 0) -> Done:
    """End at once."""
    return Done(steps=x)


async def leaky(ctx: JobContext, mode: str = "exception") -> Done:
    """Fail in a way whose raw text carries secrets, paths and a fake traceback."""
    key = os.environ.get("HANDLES_SECRET_KEYS", "")
    tokens = os.environ.get("RELIABILITY_TOKEN_HINT", "")
    raw = (
        f'Traceback (most recent call last):\n  File "{__file__}", line 1\n'
        f"db password {SECRET_IN_ERRORS} keys {key} tokens {tokens}"
    )
    if mode == "step":

        def explode() -> None:
            raise RuntimeError(raw)

        await ctx.step("explode", explode)
    if mode == "keyerror":
        {}[raw]  # a KeyError carrying the text
    if mode == "recursion":

        def deep(depth: int) -> int:
            return deep(depth + 1) + 1

        deep(0)
    raise RuntimeError(raw)


async def unlock(ctx: JobContext, vault: str, passphrase: SecretStr, crash: bool = False) -> Done:
    """Writes its sensitive argument and answer into every text it can; they must show nowhere."""
    secret = passphrase.get_secret_value()
    await ctx.progress(1, 3, f"unlocking {vault} with {secret}")
    answer = await ctx.ask(f"One-time code for {vault}? (we used {secret})", Otp)
    otp = answer.otp.get_secret_value()
    await ctx.progress(2, 3, f"code {otp} accepted")
    if crash:
        raise RuntimeError(f"the vault refused {secret} and {otp}")
    if (secret, otp) != (SENSITIVE_PASSPHRASE, SENSITIVE_OTP):
        raise JobFailed("the job did not get the values the caller sent")
    return Done(steps=2)


async def noisy(ctx: JobContext, message: str, ask: bool = False, hold: float = 30.0) -> Done:
    """Report `message` as progress (and ask it as a question when `ask`), then hold."""
    await ctx.progress(1, 2, message)
    if ask:
        await ctx.ask(message, Approval)
    await _hold(ctx, min(hold, 60))
    return Done(steps=1)


async def sized(ctx: JobContext, nbytes: Annotated[int, Field(ge=0, le=4_000_000)]) -> Blob:
    """A result of about `nbytes` bytes."""
    return Blob(blob="x" * nbytes)


async def echo(
    ctx: JobContext,
    text: str,
    count: Annotated[int, Field(ge=0, le=1000)] = 1,
    ratio: Annotated[float, Field(ge=0, le=1)] = 0.5,
    flag: bool = False,
    choice: Literal["a", "b"] = "a",
    items: list[int] | None = None,
    nested: dict[str, Any] | None = None,
) -> Echoed:
    """Echo every argument back."""
    return Echoed(
        text=text, count=count, ratio=ratio, flag=flag, choice=choice, items=items or [], nested=nested
    )


async def kept(ctx: JobContext, seconds: float = 30.0) -> Done:
    """Hold; cancelled when nobody looks at it for a minute."""
    await _hold(ctx, seconds)
    return Done(steps=1)


def create_jobs(config: HandlesConfig | None = None) -> Handles:
    jobs = Handles(config)
    jobs.job(poll_after=POLL, on_interrupt="retry", max_attempts=3)(charge)
    jobs.job(poll_after=POLL, asks_input=True, on_interrupt="retry", max_attempts=3)(approve)
    jobs.job(poll_after=POLL)(slow)
    jobs.job(poll_after=POLL, plain_call="adaptive", inline_budget=timedelta(seconds=2))(quick)
    jobs.job(poll_after=POLL)(leaky)
    jobs.job(poll_after=POLL, asks_input=True)(noisy)
    jobs.job(poll_after=POLL, asks_input=True)(unlock)
    jobs.job(poll_after=POLL)(sized)
    jobs.job(poll_after=POLL)(echo)
    jobs.job(poll_after=POLL, abandon_after=timedelta(minutes=1))(kept)
    return jobs


class ReloadingTokenVerifier:
    """Bearer tokens from a JSON file {token: principal}, re-read whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: float | None = None
        self._tokens: dict[str, str] = {}

    def _load(self) -> dict[str, str]:
        stamp = self._path.stat().st_mtime_ns
        if stamp != self._stamp:
            self._tokens = json.loads(self._path.read_text())
            self._stamp = stamp
        return self._tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        principal = self._load().get(token)
        if principal is None:
            return None
        return AccessToken(token=token, client_id=principal, subject=principal, scopes=[])


def build_server(jobs: Handles, tokens: Path | None, port: int) -> MCPServer[Any]:
    options: dict[str, Any] = {}
    if tokens is not None:
        base = f"http://127.0.0.1:{port}"
        options["token_verifier"] = ReloadingTokenVerifier(tokens)
        options["auth"] = AuthSettings(
            issuer_url=base,  # type: ignore[arg-type]
            resource_server_url=f"{base}/mcp",  # type: ignore[arg-type]
            validate_token_resource=False,
        )
    server: MCPServer[Any] = MCPServer("handles-reliability", extensions=[jobs.tasks_extension()], **options)
    jobs.bind(server)
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.app")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    from handles import serve_http

    jobs = create_jobs()
    server = build_server(jobs, args.tokens, args.port)
    # As a deployment serves it (serve_http: uvicorn, its request-head limit, the drain on SIGTERM).
    asyncio.run(serve_http(server, jobs, host="127.0.0.1", port=args.port))


if __name__ == "__main__":
    main()
