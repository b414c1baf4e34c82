"""Minting and verifying handles.

A handle is an itsdangerous-signed token (HMAC-SHA256, a salt of its own) over
`[version, job_id, kind, expires_at, principal_tag]`:

- `job_id`: 144 random bits, the primary key of the stored job;
- `kind`: the job's name, so one job's tools refuse another job's handle;
- `expires_at`: the end of the job's retention, so expiry is decided from the
  handle's own signed time;
- `principal_tag`: an HMAC of the job id and the principal under a key derived
  from the signing key. It binds the principal without showing it, and cannot be
  checked against guessed principals without the key.

Keys are a list, newest first: the newest signs, every listed key verifies, so a
key can be rotated in and the old one retired later. A handle is never
authentication: the principal it was minted for is compared with the principal of
the request presenting it, on every call, before anything is read from the store.
"""

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
        # itsdangerous's URL-safe serializer writes every handle and reads its payload (compact JSON in
        # URL-safe base64, zlib-compressed behind a leading "." when that is shorter, then "." and the
        # signature). It signs with the last key of its list: the newest, first in ours.
        self._serializer = URLSafeSerializer(
            list(reversed(keys)), salt=HANDLE_SALT, signer_kwargs={"digest_method": hashlib.sha256}
        )
        # One signer per key, so that `_open` computes every key's signature and compares its text whole
        # (the serializer's own `loads` stops at the first key that verifies, and its base64 decoder reads
        # four spellings of a signature's last character as one).
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

        Forged, truncated, re-spelled, oversized, non-ASCII, retired-key and
        other-principal handles all return None, so callers cannot tell them apart,
        not even by the time the refusal takes (see `_open`).

        A pair of the exact handle string and `principal` that verified is remembered (the newest
        `REMEMBERED` of them): the same principal presenting the same string again gets the same claims
        without the signature work, as it would have anyway (the keys of a codec never change, and the
        claims are all in the string; expiry is judged by the caller on every call). Only verified pairs
        are remembered, so every refusal still does all the work: another principal presenting a genuine
        handle is refused exactly as before, and as slowly as a forged one.
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

        One spelling only: the token must be exactly the string we would write, with nothing
        around it (no whitespace either), its signature's text included (base64 leaves slack
        bits in its last character; a looser decoder would accept four spellings). Every
        well-formed handle goes through the same steps whatever it turns out to be: every
        key's signature is computed and compared, the payload is decoded and parsed, and the
        principal tag is computed and compared for every key (against a placeholder payload
        when the handle's own does not parse), with no early exit. A forged handle and another
        principal's genuine one therefore cost the same time to refuse: the refusal tells
        nobody that this server signed it.
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
