"""`HandleCodec`: signed, principal-bound, expiring handles; every bad handle is just None."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from itsdangerous import URLSafeSerializer

from handles.handle import HANDLE_SALT, MAX_HANDLE_LENGTH, HandleClaims, HandleCodec, new_job_id
from tests.support import last_char_spellings, new_key, same_bytes_spellings, tampered_handles

KEY, OLD_KEY, OTHER_KEY = new_key(), new_key(), new_key()
ALICE, BOB = 'token:[null,"alice","alice"]', 'token:[null,"bob","bob"]'
EXPIRES = datetime(2030, 1, 1, 12, 30, 45, tzinfo=UTC)


def serializer(key: str, salt: str = HANDLE_SALT) -> URLSafeSerializer:
    return URLSafeSerializer(key.encode(), salt=salt, signer_kwargs={"digest_method": hashlib.sha256})


def mint(codec: HandleCodec, *, job_id: str = "job-1", kind: str = "report", principal: str = ALICE) -> str:
    return codec.mint(job_id=job_id, kind=kind, principal=principal, expires_at=EXPIRES)


def test_round_trip_gives_the_claims() -> None:
    codec = HandleCodec([KEY])
    handle = mint(codec, job_id="abc", kind="generate_report")
    assert codec.verify(handle, principal=ALICE) == HandleClaims(
        job_id="abc", kind="generate_report", expires_at=EXPIRES
    )
    assert handle.isascii() and len(handle) <= MAX_HANDLE_LENGTH
    assert all(c.isalnum() or c in "-_." for c in handle), "a handle is URL-safe"


def test_the_principal_is_bound_but_not_shown() -> None:
    handle = mint(HandleCodec([KEY]), principal="local:someone-secret")
    payload = handle.rpartition(".")[0]
    decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    assert "someone-secret" not in decoded
    assert "someone-secret" not in handle


def test_another_principal_gets_none() -> None:
    codec = HandleCodec([KEY])
    handle = mint(codec, principal=ALICE)
    assert codec.verify(handle, principal=BOB) is None
    assert codec.verify(handle, principal="") is None
    assert codec.verify(handle, principal=ALICE.upper()) is None


def test_forged_with_another_key_gets_none() -> None:
    forged = mint(HandleCodec([OTHER_KEY]))
    assert HandleCodec([KEY]).verify(forged, principal=ALICE) is None


@pytest.mark.parametrize("variant", sorted(tampered_handles("x.y")))
def test_tampered_truncated_and_made_up_handles_get_none(variant: str) -> None:
    codec = HandleCodec([KEY])
    bad = tampered_handles(mint(codec))[variant]
    assert codec.verify(bad, principal=ALICE) is None


def test_re_encoded_payload_with_the_old_signature_gets_none() -> None:
    codec = HandleCodec([KEY])
    handle = mint(codec, kind="report")
    payload, _, signature = handle.rpartition(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims[2] = "deploy"  # another job kind
    reencoded = base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).rstrip(b"=")
    assert codec.verify(reencoded.decode() + "." + signature, principal=ALICE) is None
    claims[2] = "report"  # same content, different spacing: not the signed bytes
    spaced = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert codec.verify(spaced + "." + signature, principal=ALICE) is None


def test_signed_but_malformed_payloads_get_none() -> None:
    """Even a correct signature (the key leaked into a test) does not make a malformed payload a handle."""
    signer = serializer(KEY)
    codec = HandleCodec([KEY])
    tag = signer.loads(mint(codec))[4]
    for payload in (
        {"job": "job-1"},
        [1, "job-1", "report", int(EXPIRES.timestamp())],
        [2, "job-1", "report", int(EXPIRES.timestamp()), tag],
        [1, 7, "report", int(EXPIRES.timestamp()), tag],
        [1, "job-1", "report", "2030-01-01", tag],
        [1, "job-1", "report", int(EXPIRES.timestamp()), None],
    ):
        token = signer.dumps(payload)
        assert codec.verify(token, principal=ALICE) is None, payload
    # The same serializer with the right payload is accepted: the checks above are about the payload.
    assert codec.verify(signer.dumps([1, "job-1", "report", int(EXPIRES.timestamp()), tag]), principal=ALICE)


def test_another_salt_gets_none() -> None:
    codec = HandleCodec([KEY])
    payload = serializer(KEY).loads(mint(codec))
    assert codec.verify(serializer(KEY, "another.salt").dumps(payload), principal=ALICE) is None


@pytest.mark.parametrize("value", [None, 12, b"bytes", ["list"], {"handle": "x"}, "", " ", "\u00e9" * 10])
def test_non_strings_and_junk_get_none(value: object) -> None:
    assert HandleCodec([KEY]).verify(value, principal=ALICE) is None


def test_oversized_gets_none_even_if_otherwise_genuine() -> None:
    codec = HandleCodec([KEY])
    long_kind = secrets.token_hex(MAX_HANDLE_LENGTH)  # incompressible
    handle = mint(codec, kind=long_kind)
    assert len(handle) > MAX_HANDLE_LENGTH
    assert codec.verify(handle, principal=ALICE) is None


def test_non_ascii_gets_none() -> None:
    codec = HandleCodec([KEY])
    handle = mint(codec)
    assert codec.verify(handle + "\u00e9", principal=ALICE) is None
    assert codec.verify("\uff21" + handle[1:], principal=ALICE) is None  # a full-width look-alike


def test_rotation_newest_signs_and_every_listed_key_verifies() -> None:
    old_codec = HandleCodec([OLD_KEY])
    rotated = HandleCodec([KEY, OLD_KEY])
    old_handle = mint(old_codec, job_id="old")
    assert rotated.verify(old_handle, principal=ALICE) is not None, "an old key still verifies"
    assert rotated.verify(old_handle, principal=BOB) is None, "and still checks the principal"

    new_handle = mint(rotated, job_id="new")
    assert HandleCodec([KEY]).verify(new_handle, principal=ALICE) is not None, "the newest key signs"
    assert old_codec.verify(new_handle, principal=ALICE) is None

    retired = HandleCodec([KEY])
    assert retired.verify(old_handle, principal=ALICE) is None, "a removed key no longer verifies"


def test_expiry_is_carried_not_judged() -> None:
    """The codec reports the signed expiry; the service decides what an expired handle means."""
    codec = HandleCodec([KEY])
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    handle = codec.mint(job_id="j", kind="k", principal=ALICE, expires_at=past)
    claims = codec.verify(handle, principal=ALICE)
    assert claims is not None and claims.expires_at == past


def test_needs_a_key() -> None:
    with pytest.raises(ValueError):
        HandleCodec([])


def test_job_ids_are_unguessable() -> None:
    ids = {new_job_id() for _ in range(2000)}
    assert len(ids) == 2000
    sample = next(iter(ids))
    assert len(base64.urlsafe_b64decode(sample + "=" * (-len(sample) % 4))) * 8 >= 128


def test_one_handle_has_exactly_one_spelling() -> None:
    """Re-spelling the signature's last character (base64 slack bits) or adding junk never opens the job."""
    codec = HandleCodec([KEY, OLD_KEY])
    for handle in (mint(codec), mint(HandleCodec([OLD_KEY]))):
        assert codec.verify(handle, principal=ALICE) is not None
        assert len(same_bytes_spellings(handle)) == 3
        alternatives = last_char_spellings(handle)
        assert len(alternatives) == 63
        for respelled in alternatives:
            assert codec.verify(respelled, principal=ALICE) is None, respelled
            assert codec.inspect(respelled) is None, respelled
        payload, _, signature = handle.rpartition(".")
        for junk in ("=", "==", "!"):
            assert codec.verify(f"{payload}.{signature}{junk}", principal=ALICE) is None
            assert codec.verify(f"{payload}.{signature[:5]}{junk}{signature[5:]}", principal=ALICE) is None
        for padded in (f" {handle}", f"{handle}\n", f"{handle}\t", f"  {handle}\n", f"\r\n{handle}\x0b"):
            assert codec.verify(padded, principal=ALICE) is None, f"nothing is trimmed: {padded!r}"
            assert codec.inspect(padded) is None, f"nothing is trimmed: {padded!r}"


def test_refusals_do_the_same_work_whatever_the_handle_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged handle, another principal's genuine one and junk all reach the same steps (no timing oracle)."""
    codec = HandleCodec([KEY, OLD_KEY])
    steps: list[str] = []
    real_parse, real_tag = codec._parse, HandleCodec._tag

    def parse(value: str) -> object:
        steps.append("parse")
        return real_parse(value)

    def tag(key: bytes, job_id: str, principal: str) -> str:
        steps.append("tag")
        return real_tag(key, job_id, principal)

    monkeypatch.setattr(codec, "_parse", parse)
    monkeypatch.setattr(HandleCodec, "_tag", staticmethod(tag))
    genuine_other = mint(codec, principal=BOB)
    forged = mint(HandleCodec([OTHER_KEY]), principal=ALICE)
    traces = []
    for handle in (genuine_other, forged, forged[:-1] + "A", "not-a-real-handle", "x.y"):
        steps.clear()
        assert codec.verify(handle, principal=ALICE) is None
        traces.append(list(steps))
    assert all(trace == ["parse", "tag", "tag"] for trace in traces), traces


def test_a_handle_verified_for_its_principal_is_remembered_for_that_principal_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll repeats the same handle: once verified for its principal, the same string from the same principal
    skips the signature work; any other principal, a forged or re-spelled handle, still does all of it and is
    refused (so a refusal still costs what it did, and tells nobody the handle is genuine)."""
    codec = HandleCodec([KEY, OLD_KEY])
    handle = mint(codec, principal=ALICE)
    opened: list[str | None] = []
    real_open = codec._open

    def counted(token: object, principal: str | None) -> HandleClaims | None:
        opened.append(principal)
        return real_open(token, principal)

    monkeypatch.setattr(codec, "_open", counted)
    first = codec.verify(handle, principal=ALICE)
    assert first is not None
    assert codec.verify(handle, principal=ALICE) == first
    assert opened == [ALICE], "the second call of the same principal does no signature work"
    assert codec.verify(handle, principal=BOB) is None
    assert codec.verify(handle, principal=BOB) is None
    assert opened == [ALICE, BOB, BOB], "another principal is never answered from memory"
    respelled = last_char_spellings(handle)[0]
    assert codec.verify(respelled, principal=ALICE) is None
    assert codec.verify(f" {handle}", principal=ALICE) is None
    assert opened == [ALICE, BOB, BOB, ALICE, ALICE], "only the exact string that verified is remembered"
    assert codec.inspect(handle) == first
    assert opened[-1] is None, "inspect (the operator's) always does the work"


def test_the_memory_of_verified_handles_is_bounded() -> None:
    codec = HandleCodec([KEY])
    handles = [mint(codec, job_id=new_job_id()) for _ in range(HandleCodec.REMEMBERED + 10)]
    for handle in handles:
        assert codec.verify(handle, principal=ALICE) is not None
    assert len(codec._verified) == HandleCodec.REMEMBERED
    assert codec.verify(handles[0], principal=ALICE) is not None, "a forgotten handle is verified again"


def test_a_codec_with_other_keys_remembers_nothing_of_another() -> None:
    """A new codec (new keys: a rotation that retired the key) starts with an empty memory."""
    handle = mint(HandleCodec([OLD_KEY]))
    old = HandleCodec([KEY, OLD_KEY])
    assert old.verify(handle, principal=ALICE) is not None
    assert HandleCodec([KEY]).verify(handle, principal=ALICE) is None


GOLDEN_KEY = "golden-key-for-format-checks-only"
GOLDEN = {
    "generate_report": (
        "WzEsIkdqNHgwS3E3YzJWYk44c0xyMVR6UHdBZSIsImdlbmVyYXRlX3JlcG9ydCIsMTg5MzUwMTA0NSwiVTVMVjhTSzNzWDlFd3hf"
        "eEJrekV2QSJd.TqfPf11MUn0FkZwQ5r4mmlaHR2Suh4hdDpm93hzy0u0"
    ),
    "report_" * 7: (
        ".eJyLNtRRcs8yqTDwLjRPNgpL8rMo9ikyDKkKKHdMVdJRKkotyC8qiSeeUtIxtLA0NjUwNDAx1VEKNfUJswj2Ni6OsHQtr4ivcMquci1z"
        "VIoFAIuBKJ4.Lb6b-VQEPT1wZPaDisqyZJ6Vg0xhO0WwLlU10wZ9ruI"
    ),
}
"""Handles minted by an earlier version of the codec (which wrote itsdangerous's bytes itself), one
plain and one zlib-compressed, for job `Gj4x0Kq7c2VbN8sLr1TzPwAe` of ALICE."""


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_handles_already_issued_still_open_and_are_minted_the_same(kind: str) -> None:
    """The format is itsdangerous's serializer's: a handle a deployed server issued opens after an
    upgrade, and the same job gets the very same handle string (an idempotent start, a journal)."""
    codec = HandleCodec([GOLDEN_KEY])
    claims = HandleClaims(job_id="Gj4x0Kq7c2VbN8sLr1TzPwAe", kind=kind, expires_at=EXPIRES)
    assert codec.verify(GOLDEN[kind], principal=ALICE) == claims
    assert mint(codec, job_id=claims.job_id, kind=kind) == GOLDEN[kind]
    assert HandleCodec([KEY, GOLDEN_KEY]).verify(GOLDEN[kind], principal=ALICE) == claims, "an older key"


def test_a_minted_handle_is_what_itsdangerous_writes() -> None:
    """`mint` is itsdangerous's serializer's `dumps`, compressed by its rule where zlib shortens the
    payload: so a job's handle is the same string whichever version minted it."""
    codec = HandleCodec([KEY, OLD_KEY])
    for kind in ("generate_report", "report_" * 7):
        handle = mint(codec, kind=kind)  # job-1, ALICE
        assert serializer(KEY).dumps(serializer(KEY).loads(handle)) == handle
        assert codec.verify(handle, principal=ALICE) == HandleClaims(
            job_id="job-1", kind=kind, expires_at=EXPIRES
        )
    assert not mint(codec, kind="generate_report").startswith(".")
    assert mint(codec, kind="report_" * 7).startswith("."), "a payload zlib shortens is compressed"


@pytest.mark.parametrize(
    "kind",
    [
        'say "hi"',
        "back\\slash",
        "tab\there",
        "line\nbreak",
        "del\x7f",
        "caf\u00e9",
        "\u2028",
        "\U0001f600",
        "",
    ],
)
def test_a_name_json_escapes_or_keeps_is_written_as_itsdangerous_writes_it(kind: str) -> None:
    """A job name with a quote, a backslash or a control character (or a character JSON keeps as it is,
    like an accent) gives the same bytes as itsdangerous's serializer, and verifies."""
    codec = HandleCodec([KEY])
    handle = mint(codec, kind=kind)
    assert serializer(KEY).dumps(serializer(KEY).loads(handle)) == handle
    assert codec.verify(handle, principal=ALICE) == HandleClaims(
        job_id="job-1", kind=kind, expires_at=EXPIRES
    )


@settings(max_examples=300, deadline=None)
@given(job_id=st.text(max_size=40), kind=st.text(max_size=60), principal=st.text(max_size=40))
def test_any_minted_handle_is_what_itsdangerous_writes(job_id: str, kind: str, principal: str) -> None:
    codec = HandleCodec([KEY])
    handle = codec.mint(job_id=job_id, kind=kind, principal=principal, expires_at=EXPIRES)
    assert serializer(KEY).dumps(serializer(KEY).loads(handle)) == handle
    if len(handle) <= MAX_HANDLE_LENGTH:
        assert codec.verify(handle, principal=principal) == HandleClaims(
            job_id=job_id, kind=kind, expires_at=EXPIRES
        )
