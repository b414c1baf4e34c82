"""Who may use the console: the operator token, a signed session cookie (keyed by the token, so a new
token ends every session), and CSRF tokens for forms."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request

from handles.console.throttle import LoginThrottle

COOKIE = "handles_console"
SESSION_SECONDS = 12 * 3600
BEARER_OPERATOR_HEADER = "x-handles-operator"
"""Whom a request with the bearer token speaks for (default `console`): recorded as `operator:<name>`."""
MAX_NAME = 100


@dataclass(frozen=True)
class Operator:
    """An authenticated operator; `csrf` is None for bearer requests (no ambient credential to forge)."""

    name: str
    csrf: str | None

    @property
    def recorded_as(self) -> str:
        return f"operator:{self.name}"


def clean_name(name: str) -> str:
    """An operator's name as recorded: printable, trimmed, at most `MAX_NAME` characters."""
    return "".join(c for c in name if c.isprintable()).strip()[:MAX_NAME]


class Gate:
    """Checks the operator token, issues and reads session cookies, and makes and checks CSRF tokens."""

    def __init__(self, token: str, throttle: LoginThrottle | None = None) -> None:
        if len(token) < 16:
            raise ValueError(
                "The console's operator token must be at least 16 characters (`handles keygen` makes one)."
            )
        self._token = token.encode()
        self._key = hmac.new(self._token, b"handles-console-session", hashlib.sha256).digest()
        self.throttle = throttle or LoginThrottle()

    def token_matches(self, offered: str, client: str) -> bool:
        """Whether `offered` is the operator token, counted for `client`; raises `Throttled` (and checks
        nothing) while `client` has sent too many wrong ones."""
        self.throttle.check(client)
        if hmac.compare_digest(offered.encode(), self._token):
            self.throttle.succeeded(client)
            return True
        self.throttle.failed(client)
        return False

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    def session_cookie(self, name: str) -> str:
        """A new session for `name`: base64 JSON (name, expiry, nonce) and its signature."""
        payload = json.dumps(
            {"name": name, "exp": int(time.time()) + SESSION_SECONDS, "nonce": secrets.token_hex(16)}
        ).encode()
        return base64.urlsafe_b64encode(payload).decode() + "." + self._sign(payload)

    def _session(self, cookie: str) -> dict[str, str] | None:
        encoded, _, signature = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded.encode())
        except ValueError:
            return None
        if not _same(self._sign(payload), signature):
            return None
        session = json.loads(payload)
        if not isinstance(session, dict) or session.get("exp", 0) < time.time():
            return None
        return {"name": str(session["name"]), "nonce": str(session["nonce"])}

    def operator(self, request: Request) -> Operator | None:
        """The operator making `request`, or None when it carries no valid credential; raises `Throttled`
        for a bearer token from a client that sent too many wrong ones."""
        scheme, _, offered = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and offered:
            if not self.token_matches(offered.strip(), client_of(request)):
                return None
            return Operator(clean_name(request.headers.get(BEARER_OPERATOR_HEADER, "")) or "console", None)
        session = self._session(request.cookies.get(COOKIE, ""))
        if session is None:
            return None
        return Operator(session["name"], self._sign(b"csrf:" + session["nonce"].encode()))

    @staticmethod
    def csrf_ok(operator: Operator, offered: str | None) -> bool:
        """A form's CSRF token matches the session's (bearer requests need none)."""
        if operator.csrf is None:
            return True
        return offered is not None and _same(offered, operator.csrf)


def _same(offered: str, expected: str) -> bool:
    """`offered == expected` in constant time; any text (compare_digest takes only ASCII `str`)."""
    return hmac.compare_digest(offered.encode(), expected.encode())


def client_of(request: Request) -> str:
    """The address the throttle counts a request against (behind a proxy uvicorn trusts, the one it reports)."""
    return request.client.host if request.client is not None else "unknown"
