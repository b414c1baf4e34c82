"""What answers to a job's questions must be before anything is stored, on every face that takes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from handles.elicitation import describe_fields, validate_answer
from handles.errors import InvalidArguments
from handles.limits import clean_message
from handles.sealing import Sealer, sensitive_fields
from handles.store import InputRequestRecord

SHOWN_KEYS = 5
"""How many of a reply's unknown keys an error names (the rest are counted)."""


def checked_answers(
    sealer: Sealer, pending: Mapping[str, InputRequestRecord], responses: dict[str, Any], retry: str
) -> dict[str, Any]:
    """`responses` checked against the schemas of the `pending` questions they answer, sensitive fields
    sealed; raises `InvalidArguments` naming every misfit."""
    problems: list[str] = []
    expected: list[str] = []
    for key, answer in responses.items():
        request = pending.get(key)
        if request is None:
            continue
        found = validate_answer(request.requested_schema, answer)
        problems.extend(f"{key}.{p}" for p in found)
        if found:
            expected.append(f"{key} expects {describe_fields(request.requested_schema)}.")
    if problems:
        raise InvalidArguments(
            "Some answers do not fit the requested schema: "
            + "; ".join(problems)
            + ". "
            + " ".join(expected),
            f"Fix those fields and {retry}; nothing was stored.",
        )
    return {
        key: sealer.seal(answer, sensitive_fields(pending[key].requested_schema))
        if key in pending and isinstance(answer, dict)
        else answer
        for key, answer in responses.items()
    }


def unasked_answers(
    responses: Mapping[str, Any], open_keys: Sequence[str], *, status: str, again: str, follow: str
) -> InvalidArguments:
    """The error for a reply none of whose keys is a question the job asked: it answers nothing."""
    unknown = [clean_message(key, 60) or "''" for key in list(responses)[:SHOWN_KEYS]]
    more = len(responses) - len(unknown)
    named = ", ".join(unknown) + (f" and {more} more" if more > 0 else "")
    what = f"This job never asked {named}" if responses else "responses is empty"
    data = {"open_questions": list(open_keys)}
    if not open_keys:
        return InvalidArguments(
            f"{what}, and it has no open questions (it is {status}): this reply answers nothing; "
            "nothing was stored.",
            f"Nothing needs an answer now. Follow the job with {follow} and this handle.",
            data=data,
        )
    waiting = ", ".join(open_keys)
    return InvalidArguments(
        f"{what}: this reply answers nothing; nothing was stored. The job waits for an answer to {waiting}.",
        f"Call {again} again with this handle and responses keyed by {waiting}, each an object of the fields "
        f"its requested_schema asks for (see input_requests in the {follow} reply).",
        data=data,
    )
