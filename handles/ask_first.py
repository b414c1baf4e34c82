"""Questions a job asks before any work starts (a confirmation, a choice).

A job declared with `ask_first=AskFirst(message, schema)` needs one answer before it
may run. How the question reaches the caller depends on what the caller can do:

- a 2026-07-28 request that declares elicitation, calling the plain tool `<job>`
  (with or without the Tasks extension), gets it first as a multi round-trip
  `InputRequiredResult`; its retry with `inputResponses` starts the job (or creates
  the task) with the answer. Nothing is stored before the answer arrives, and no
  state has to travel: the retry carries the arguments again.
- any other caller (`<job>_start`, older clients, clients without elicitation) gets
  a job that waits in `input_required` with the question under key `q0`, answered
  like any other question (`<job>_respond`, `tasks/update`); the job starts then.
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

    `message` is the text, or a function of the job's (validated, JSON) arguments that
    returns it. `schema` is a pydantic model of primitive fields (the job reads the
    answer as that model from `ctx.first_answer`) or a form-elicitation schema dict.
    """

    message: str | Callable[[dict[str, Any]], str]
    schema: type[BaseModel] | dict[str, Any]

    def requested_schema(self) -> dict[str, Any]:
        return elicitation_schema(self.schema)

    def render(self, arguments: dict[str, Any]) -> str:
        text = self.message(arguments) if callable(self.message) else self.message
        return clean_message(text) or "Confirm before the job starts."

    def typed(self, answer: dict[str, Any]) -> Any:
        if isinstance(self.schema, type) and issubclass(self.schema, BaseModel):
            return self.schema.model_validate(answer)
        return answer
