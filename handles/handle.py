"""Minting and verifying handles: signed tokens over a job id, kind, expiry and a tag binding the principal."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from itsdangerous import BadPayload, Signer, URLSafeSerializer
from itsdangerous.encoding import base64_encode

HANDLE_SALT = "handles.handle.v1"
_TAG_LABEL = b"handles.principal-binding.v1"
_FORMAT_VERSION = 1
JOB_ID_BYTES = 18
MAX_HANDLE_LENGTH = 400
_PLACEHOLDER = ("p" * 24, "placeholder", 0, "p" * 22)
"""Stands in for a payload that does not parse, so that refusing it costs what refusing a real one does."""


def new_job_id() -> str:
    """A fresh job id with 144 bits of entropy, URL-safe, never beginning with `-` (so that a command
    line never reads one as an option; dropping those draws costs a fraction of a bit)."""
    while True:
        job_id = secrets.token_urlsafe(JOB_ID_BYTES)
        if not job_id.startswith("-"):
            return job_id


@dataclass(frozen=True)
class HandleClaims:
    """What a verified handle says. Only returned once signature and principal both match."""

    job_id: str
    kind: str
    expires_at: datetime


class HandleCodec:
    """Mints and verifies handles with a list of secret keys (newest first)."""

    REMEMBERED = 4096
    """How many verified (handle, principal) pairs `verify` remembers (the oldest are forgotten first)."""

    def __init__(self, secret_keys: tuple[str, ...] | list[str]) -> None:
        if not secret_keys:
            raise ValueError("HandleCodec needs at least one secret key")
        keys = [key.encode() for key in secret_keys]
        # itsdangerous signs with the last key of its list: the newest, first in ours.
        self._serializer = URLSafeSerializer(
            list(reversed(keys)), salt=HANDLE_SALT, signer_kwargs={"digest_method": hashlib.sha256}
        )
        # One signer per key: `_open` checks every key's signature text whole, with no early exit.
        self._signers = [Signer(key, salt=HANDLE_SALT, digest_method=hashlib.sha256) for key in keys]
        self._tag_keys = [hmac.new(key, _TAG_LABEL, hashlib.sha256).digest() for key in keys]
        # (handle, principal) -> claims, for pairs that verified: a caller polls with the same handle.
        self._verified: dict[tuple[str, str], HandleClaims] = {}
        self._verified_lock = threading.Lock()

    def mint(self, *, job_id: str, kind: str, principal: str, expires_at: datetime) -> str:
        """A new handle for `job_id`, bound to `principal`, valid until `expires_at`."""
        tag = self._tag(self._tag_keys[0], job_id, principal)
        payload = [_FORMAT_VERSION, job_id, kind, int(expires_at.timestamp()), tag]
        return self._serializer.dumps(payload)

    def verify(self, token: object, *, principal: str) -> HandleClaims | None:
        """The claims of `token` if it is genuine and bound to `principal`; otherwise None.

        Every refusal looks alike and costs the same time. A verified (string, principal) pair is
        remembered, so its repeat skips the signature work; refusals are never remembered.
        """
        key = (token, principal) if type(token) is str else None
        if key is not None:
            claims = self._verified.get(key)
            if claims is not None:
                return claims
        claims = self._open(token, principal)
        if claims is not None and key is not None:
            with self._verified_lock:
                if len(self._verified) >= self.REMEMBERED:
                    del self._verified[next(iter(self._verified))]  # the oldest
                self._verified[key] = claims
        return claims

    def inspect(self, token: object) -> HandleClaims | None:
        """Operator use only: the claims of a genuine handle, whoever it belongs to (no principal check)."""
        return self._open(token, None)

    def _open(self, token: object, principal: str | None) -> HandleClaims | None:
        """The claims of a handle signed by one of our keys (and bound to `principal`, unless None).

        Only the exact spelling we write is accepted, and every well-formed token does all the work with no
        early exit, so a forged handle and another principal's genuine one take as long to refuse.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_HANDLE_LENGTH or not token.isascii():
            return None
        value, _, signature = token.rpartition(".")
        presented = signature.encode()
        data = value.encode()
        signed = [hmac.compare_digest(signer.get_signature(data), presented) for signer in self._signers]
        payload = self._parse(value)
        job_id, kind, expires, tag = payload or _PLACEHOLDER
        bound = principal is None or any(
            [hmac.compare_digest(self._tag(key, job_id, principal), tag) for key in self._tag_keys]
        )
        if not (any(signed) and payload is not None and bound):
            return None
        return HandleClaims(job_id=job_id, kind=kind, expires_at=datetime.fromtimestamp(expires, UTC))

    def _parse(self, value: str) -> tuple[str, str, int, str] | None:
        """(job_id, kind, expires, principal tag) of a handle's payload part, if it has that shape."""
        try:
            payload = self._serializer.load_payload(value.encode())
        except BadPayload:
            return None
        if not (isinstance(payload, list) and len(payload) == 5 and payload[0] == _FORMAT_VERSION):
            return None
        _, job_id, kind, expires, tag = payload
        if not (
            isinstance(job_id, str)
            and isinstance(kind, str)
            and isinstance(expires, int)
            and isinstance(tag, str)
        ):
            return None
        return job_id, kind, expires, tag

    @staticmethod
    def _tag(key: bytes, job_id: str, principal: str) -> str:
        """The principal tag: an HMAC of the job id and the principal under `key` (derived from a signing key)."""
        digest = hmac.new(key, f"{job_id}\x00{principal}".encode(), hashlib.sha256).digest()
        return base64_encode(digest[:16]).decode()
