"""Questions a job asks: form-elicitation schemas and answer checks that need only the stored schema."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, validators  # type: ignore[import-untyped]
from pydantic import BaseModel

_PRIMITIVES = {"string", "number", "integer", "boolean"}

_STRING_FORMATS: dict[str, tuple[Callable[[str], object], str]] = {
    "date": (date.fromisoformat, "expected an ISO date"),
    "date-time": (datetime.fromisoformat, "expected an ISO date-time"),
    "email": (
        lambda v: "@" in v and not v.startswith("@") and not v.endswith("@"),
        "expected an email address",
    ),
    "uri": (lambda v: ":" in v, "expected a URI"),
}
"""The string formats form elicitation carries: the check of an answer (false or raising fails it), and
what a misfit is told. `jsonschema`'s own checks would skip `uri` and `date-time` without extra packages."""

_FORMAT_CHECKER = FormatChecker(formats=())
for _format, (_check, _) in _STRING_FORMATS.items():
    _FORMAT_CHECKER.checks(_format, raises=(ValueError, TypeError))(_check)

_FieldValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "number",
        lambda _, value: (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        ),
    ),
)
"""Draft 2020-12, where a number is finite (JSON has no NaN or infinity; Python's parser lets them in)."""

_KINDS = {
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "array": "a list of choices",
}
"""What a field of each type holds, as a caller is told (any other: "a string")."""
_LIMITS = {
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "exclusiveMinimum": "must be greater than {}",
    "exclusiveMaximum": "must be less than {}",
    "minLength": "must be at least {} characters",
    "maxLength": "must be at most {} characters",
    "minItems": "choose at least {} of the choices",
    "maxItems": "choose at most {} of the choices",
    "multipleOf": "must be a multiple of {}",
    "pattern": "must match the regular expression {}",
}


class SchemaError(ValueError):
    """A schema that form elicitation cannot carry."""


def elicitation_schema(schema: type[BaseModel] | dict[str, Any]) -> dict[str, Any]:
    """The requested-schema dict for `schema`, checked to be an object of primitive fields."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        raw = schema.model_json_schema()
        raw.pop("title", None)
        raw = _inline_enum_refs(raw)
    elif isinstance(schema, dict):
        raw = dict(schema)
    else:
        raise SchemaError("ask() needs a pydantic model class or a JSON schema dict")
    if raw.get("type") != "object" or not isinstance(raw.get("properties"), dict):
        raise SchemaError('an elicitation schema is {"type": "object", "properties": {...}}')
    raw["properties"] = {name: _sensitive_as_plain_string(prop) for name, prop in raw["properties"].items()}
    for name, prop in raw["properties"].items():
        _check_property(name, prop)
    required = raw.get("required", [])
    if not isinstance(required, list) or any(r not in raw["properties"] for r in required):
        raise SchemaError("'required' must list property names")
    return {k: v for k, v in raw.items() if k in {"type", "properties", "required", "title", "description"}}


def _sensitive_as_plain_string(prop: Any) -> Any:
    """A `SecretStr` field (`writeOnly`, format `password`) as form elicitation carries it: a string that
    stays `writeOnly` (a client may mask it; `handles` seals its answer, see handles/sealing.py)."""
    if isinstance(prop, dict) and prop.get("writeOnly") and prop.get("format") == "password":
        return {key: value for key, value in prop.items() if key != "format"}
    return prop


def _inline_enum_refs(raw: dict[str, Any]) -> dict[str, Any]:
    """Replace `$ref`s to enum definitions (pydantic emits them for Enum fields) with the definitions."""
    defs = raw.pop("$defs", {})
    properties = {}
    for name, prop in raw.get("properties", {}).items():
        ref = prop.get("$ref") if isinstance(prop, dict) else None
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = dict(defs.get(ref.removeprefix("#/$defs/"), {}))
            target.pop("title", None)
            prop = {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
        properties[name] = prop
    raw["properties"] = properties
    return raw


def _check_property(name: str, prop: Any) -> None:
    if not isinstance(prop, dict):
        raise SchemaError(f"field {name!r}: a property schema must be an object")
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items")
        if not (isinstance(items, dict) and (isinstance(items.get("enum"), list) or "anyOf" in items)):
            raise SchemaError(f"field {name!r}: arrays are allowed only as multi-select enums")
        return
    if "oneOf" in prop and kind in (None, "string"):
        return
    if kind not in _PRIMITIVES:
        raise SchemaError(
            f"field {name!r}: type must be one of string, number, integer, boolean (got {kind!r})"
        )
    fmt = prop.get("format")
    if fmt is not None and (kind != "string" or fmt not in _STRING_FORMATS):
        raise SchemaError(f"field {name!r}: format {fmt!r} is not supported by form elicitation")


def validate_answer(schema: dict[str, Any], answer: Any) -> list[str]:
    """Problems with `answer` against a stored elicitation schema; empty when it fits."""
    if not isinstance(answer, dict):
        return ["the answer must be a JSON object of field values"]
    problems: list[str] = []
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in answer:
            problems.append(f"{name}: required")
    for name, value in answer.items():
        prop = properties.get(name)
        if prop is None:
            problems.append(
                f"{name}: not a field of this question (fields: {', '.join(properties) or 'none'})"
            )
            continue
        errors = list(_FieldValidator(prop, format_checker=_FORMAT_CHECKER).iter_errors(value))
        if errors:
            problems.append(f"{name}: {_problem(prop, errors)}")
    return problems


def _problem(prop: dict[str, Any], errors: list[Any]) -> str:
    """What a caller should fix about one field, from its `jsonschema` errors (the first that applies)."""
    own = {error.validator: error for error in errors if not error.path}
    if own.keys() & {"enum", "oneOf", "anyOf"}:
        return f"must be one of {_allowed_values(prop)}"
    if "type" in own:
        return "expected " + _KINDS.get(prop.get("type", "string"), "a string")
    if bad := {error.path[0]: error.instance for error in errors if error.path}:
        return f"not among the choices {_allowed_values(prop.get('items', {}))}: {list(bad.values())}"
    for keyword, text in _LIMITS.items():
        if keyword in own:
            return text.format(own[keyword].validator_value)
    if "format" in own:
        return _STRING_FORMATS[own["format"].validator_value][1]
    return str(errors[0].message)  # another keyword the schema carries, in jsonschema's words


def describe_fields(schema: dict[str, Any]) -> str:
    """What an answer to a stored question holds: `approve (true or false, required), note (a string)`."""
    required = set(schema.get("required", ()))
    parts = [
        f"{name} ({_expects(prop)}{', required' if name in required else ''})"
        for name, prop in schema.get("properties", {}).items()
    ]
    return ", ".join(parts) or "no fields (answer {})"


def _expects(prop: dict[str, Any]) -> str:
    kind = prop.get("type", "string")
    if kind == "array":
        allowed = _allowed_values(prop.get("items", {}))
        return _KINDS[kind] + (f" from {', '.join(map(repr, allowed))}" if allowed else "")
    allowed = _allowed_values(prop)
    if allowed is not None:
        return "one of " + ", ".join(map(repr, allowed))
    return _KINDS.get(kind, "a string")


def _allowed_values(prop: dict[str, Any]) -> list[Any] | None:
    if isinstance(prop.get("enum"), list):
        return list(prop["enum"])
    for key in ("oneOf", "anyOf"):
        if isinstance(prop.get(key), list):
            return [option.get("const") for option in prop[key] if isinstance(option, dict)]
    return None
