"""Questions a job asks before any work starts (a confirmation, a choice).

A 2026-07-28 caller with elicitation gets the question in-band before anything is stored; any other
caller gets a job waiting in `input_required` with the question under key `q0`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from handles.elicitation import elicitation_schema
from handles.limits import clean_message

FIRST_KEY = "q0"
"""The key of the question asked before the job starts; questions asked while it runs are q1, q2, ..."""


@dataclass(frozen=True)
class AskFirst:
    """The question a job needs answered before it starts.

    `message` is the text, or a function of the job's validated arguments that returns it. `schema` is a
    pydantic model of primitive fields (read back from `ctx.first_answer`) or a form-elicitation schema dict.
    """

    message: str | Callable[[dict[str, Any]], str]
    schema: type[BaseModel] | dict[str, Any]

    def requested_schema(self) -> dict[str, Any]:
        return elicitation_schema(self.schema)

    def render(self, arguments: dict[str, Any]) -> str:
        text = self.message(arguments) if callable(self.message) else self.message
        return clean_message(text) or "Confirm before the job starts."
