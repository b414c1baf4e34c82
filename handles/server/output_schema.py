"""Output schemas written flat (references inlined, optionals as `"type": [X, "null"]`), cheaper to check."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

_NULL = {"type": "null"}

# Keywords unaffected by adding null to the value's type; a schema with any other keeps its `anyOf`.
_TYPE_SCOPED = frozenset(
    {
        "type", "format", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minLength", "maxLength", "pattern",
        "items", "prefixItems", "minItems", "maxItems", "uniqueItems",
        "properties", "required", "additionalProperties", "minProperties", "maxProperties",
    }
)  # fmt: skip

# Keywords whose value is data, not a schema: never walked.
_DATA = frozenset({"default", "examples", "const", "enum", "required", "title", "description"})

# Keywords whose value maps names to schemas: each schema is walked, never the map itself.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class FlatSchemaModel(BaseModel):
    """A model whose JSON schema is written flat (see the module's docstring)."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        own = handler.resolve_ref_schema(schema)
        # Every `$ref` inlined (except a model's reference to itself, directly or through others) and every
        # optional plain value written as a type list.
        flat = _walk(own, lambda ref: handler.resolve_ref_schema({"$ref": ref}), frozenset())
        # In place: `schema` may be a reference to `own`, which pydantic publishes (definitions no longer
        # referenced are then left out of `$defs`).
        own.clear()
        own.update(flat)
        return schema


def _walk(node: Any, resolve: Callable[[str], dict[str, Any]], inlining: frozenset[str]) -> Any:
    """One schema (or a list of schemas) walked: references inlined, optional plain values as type lists."""
    if isinstance(node, list):
        return [_walk(item, resolve, inlining) for item in node]
    if not isinstance(node, dict):
        return node  # a boolean schema
    ref = node.get("$ref")
    if isinstance(ref, str) and ref not in inlining:
        target = _walk(copy.deepcopy(resolve(ref)), resolve, inlining | {ref})
        # Keywords beside the reference (a field's description, default) win over the target's own.
        return _nullable({**target, **{key: value for key, value in node.items() if key != "$ref"}})
    walked: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DATA:
            walked[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            walked[key] = {name: _walk(schema, resolve, inlining) for name, schema in value.items()}
        else:
            walked[key] = _walk(value, resolve, inlining)
    return _nullable(walked)


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """`{"anyOf": [X, {"type": "null"}], ...}` as `{...X, "type": [X's type, "null"], ...}` where equivalent."""
    options = node.get("anyOf")
    if not (isinstance(options, list) and len(options) == 2 and _NULL in options):
        return node
    other = options[0] if options[1] == _NULL else options[1]
    kind = other.get("type")
    if not (isinstance(kind, str) and kind != "null" and set(other) <= _TYPE_SCOPED):
        return node
    merged = {key: value for key, value in node.items() if key != "anyOf"}
    for key, value in other.items():
        merged.setdefault(key, value)
    merged["type"] = [kind, "null"]
    return merged
