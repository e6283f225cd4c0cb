"""A tool's `input_schema` reduced to what the grammar engine takes, for forced tool calls.

Clients send JSON Schema 2020-12 as their tool libraries write it (`$schema`, `anyOf`, `const`,
`enum`, `pattern`, `format`, `propertyNames`, `minimum`, ...). XGrammar takes most of it; what it
refuses (a lookbehind in a `pattern`, an empty `enum`, bounds it finds contradictory, an unknown
`type`) would make a 400 of a request the client cannot change, so the schema is loosened
instead: first the keywords that only narrow values are dropped, and if that is not enough the
call's input is constrained to any JSON object. The model still sees the full schema in its prompt.
"""

from __future__ import annotations

from typing import Any

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError

__all__ = ["fit_schema", "is_grammar_ready"]

ANY_OBJECT: dict[str, Any] = {"type": "object"}
MAX_DEPTH = 64  # deeper than any real tool schema; below it, every subschema is dropped
JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object", "null"}
# keywords that only narrow the values a schema allows: without them it allows more
NARROWING = frozenset(
    {
        "pattern",
        "format",
        "propertyNames",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "if",
        "then",
        "else",
        "not",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "$dynamicRef",
        "$dynamicAnchor",
    }
)


DATA = frozenset({"const", "enum", "default", "examples", "required", "description", "title"})
NAMED = frozenset({"properties", "$defs", "definitions"})


def is_grammar_ready(schema: dict[str, Any]) -> bool:
    try:
        ConstraintSpec.json_schema(schema, "tools").to_grammar()
    except InvalidRequestError:
        return False
    return True


def fit_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """`schema` itself when the grammar engine takes it, else the loosest step that it takes."""
    if not schema:
        return ANY_OBJECT
    if is_grammar_ready(schema):
        return schema
    loose = _loosen(schema, 0)
    if isinstance(loose, dict) and is_grammar_ready(loose):
        return loose
    return ANY_OBJECT


def _loosen(node: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return {}
    if isinstance(node, list):
        return [_loosen(item, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in NARROWING:
            continue
        if key == "enum" and (not isinstance(value, list) or not value):
            continue
        if key == "type" and not _is_known_type(value):
            continue
        if key in DATA:  # values, not schemas: kept as they are
            out[key] = value
        elif key in NAMED and isinstance(value, dict):  # names -> subschemas
            out[key] = {name: _loosen(sub, depth + 1) for name, sub in value.items()}
        else:
            out[key] = _loosen(value, depth + 1)
    return out


def _is_known_type(value: Any) -> bool:
    if isinstance(value, str):
        return value in JSON_TYPES
    return isinstance(value, list) and bool(value) and all(v in JSON_TYPES for v in value)
