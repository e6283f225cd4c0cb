"""The checks a constraint passes before the grammar engine sees it, the same for every field
that carries one (guided_*, response_format, structured_outputs, tools under every tool_choice):

- size: a regex, schema or grammar past its bound (limits.py) is a 400 naming the field, before
  any parse, so no request makes the engine's front end or a compile work for long;
- `$ref` is local (`#` or `#/...`): the grammar engine resolves nothing else (XGrammar 0.2.9 logs
  a warning and accepts any value in its place);
- every regex of a schema (`pattern`, `patternProperties` names) is parsed as `guided_regex` is,
  so a lookaround gets one answer wherever it appears (XGrammar ignores one inside a schema);
- a schema that no value satisfies is a 400: `type: []`, `not: {}`, an `allOf` of disjoint types,
  a `const` outside its `enum`, a required property that is `false`, ... (XGrammar refuses some
  of these itself, e.g. minimum > maximum; the compile's first-token check in worker.py the rest
  that empties the grammar at its root).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from runtime.engine.constraints.limits import GrammarLimits
from runtime.errors import InvalidRequestError

__all__ = ["check_schema", "check_size", "engine_message"]

# XGrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: "; the client needs the rest
_LOCATION = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")

# keywords whose value is a subschema / a map of them / a list of them
_ONE: tuple[str, ...] = (
    "additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
    "additionalItems", "unevaluatedProperties", "unevaluatedItems",
)  # fmt: skip
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_JSON_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def check_size(kind: str, source: str, param: str, limits: GrammarLimits) -> None:
    bound = {
        "regex": (limits.max_regex_chars, "characters", "grammar_max_regex_chars"),
        "json": (limits.max_schema_bytes, "bytes", "grammar_max_schema_bytes"),
        "grammar": (limits.max_grammar_bytes, "bytes", "grammar_max_grammar_bytes"),
        "choice": (limits.max_schema_bytes, "bytes", "grammar_max_schema_bytes"),
    }.get(kind)
    if bound is not None and len(source) > bound[0]:
        _refuse(
            param,
            f"{len(source)} {bound[1]}, more than this server takes ({bound[2]} = {bound[0]})",
        )
    if kind == "grammar" and source.count("::=") > limits.max_grammar_rules:
        rules = source.count("::=")
        _refuse(param, f"{rules} rules, more than {limits.max_grammar_rules} (grammar_max_rules)")


def check_schema(schema: Any, param: str, limits: GrammarLimits) -> None:
    """`schema`: the parsed JSON Schema (a dict or a bool)."""
    num_properties = 0
    for node, depth in _subschemas(schema):
        if depth > limits.max_schema_depth:
            _refuse(
                param, f"nested deeper than {limits.max_schema_depth} (grammar_max_schema_depth)"
            )
        if not isinstance(node, dict):
            continue
        props = node.get("properties")
        num_properties += len(props) if isinstance(props, dict) else 0
        if num_properties > limits.max_schema_properties:
            _refuse(
                param,
                f"more than {limits.max_schema_properties} properties "
                "(grammar_max_schema_properties)",
            )
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
            _refuse(param, f"$ref {ref!r}: only local references (#/...) are resolved")
        regexes = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            regexes += list(node["patternProperties"])
        for regex in regexes:
            _check_regex(regex, param, limits)
        reason = _unsatisfiable(node)
        if reason is not None:
            _refuse(param, f"no value satisfies this schema ({reason})")


def _check_regex(regex: str, param: str, limits: GrammarLimits) -> None:
    if len(regex) > limits.max_regex_chars:
        _refuse(
            param,
            f"a pattern of {len(regex)} characters (grammar_max_regex_chars = "
            f"{limits.max_regex_chars})",
        )
    import xgrammar as xgr  # here: importing it costs ~0.8 s (transformers), see spec.py

    try:  # the parse guided_regex gets: one answer for one regex
        xgr.Grammar.from_regex(regex)
    except (RuntimeError, ValueError, TypeError) as exc:
        _refuse(
            param, f"pattern {regex[:64]!r}: the grammar engine refused it: {engine_message(exc)}"
        )


def _subschemas(schema: Any) -> Iterator[tuple[Any, int]]:
    """Every subschema with its depth, iteratively (a deep schema is a 400, never a
    RecursionError)."""
    stack = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        if depth > 10_000 or not isinstance(node, dict):
            continue
        for key in _ONE:
            if isinstance(node.get(key), dict | bool):
                stack.append((node[key], depth + 1))
        for key in _MAP:
            if isinstance(node.get(key), dict):
                stack.extend((sub, depth + 1) for sub in node[key].values())
        for key in _LIST:
            if isinstance(node.get(key), list):
                stack.extend((sub, depth + 1) for sub in node[key])


def _unsatisfiable(node: dict[str, Any]) -> str | None:
    """Why no value can satisfy `node` on its own (its subschemas are checked as nodes too)."""
    types = node.get("type")
    allowed = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if allowed is not None and not allowed:
        return "type is an empty list"
    if node.get("not") is True or node.get("not") == {}:
        return "not: {} refuses every value"
    for member in node.get("allOf") or ():
        if member is False:
            return "allOf holds false"
        t = member.get("type") if isinstance(member, dict) else None
        member_types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if member_types is not None:
            allowed = member_types if allowed is None else _meet(allowed, member_types)
            if not allowed:
                return "allOf asks for types no value has at once"
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and members and all(m is False for m in members):
            return f"every {key} member is false"
    values = [node["const"]] if "const" in node else None
    if isinstance(node.get("enum"), list):
        enum = node["enum"]
        values = enum if values is None else [v for v in values if _in(v, enum)]
        if not values:
            return "const is not among enum"
    typed = [v for v in values or () if any(_JSON_TYPES.get(t, _ANY)(v) for t in allowed or ())]
    if values is not None and allowed is not None and not typed:
        return f"no const/enum value is of type {sorted(allowed)}"
    props: dict[str, Any] = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required = [r for r in node.get("required") or () if isinstance(r, str)]
    for name in required:
        if props.get(name) is False:
            return f"required property {name!r} is false"
        closed = node.get("additionalProperties") is False and not node.get("patternProperties")
        if name not in props and closed:
            return f"required property {name!r} is not allowed (additionalProperties false)"
    max_props = node.get("maxProperties")
    if isinstance(max_props, int) and len(set(required)) > max_props:
        return f"{len(set(required))} required properties, maxProperties {max_props}"
    return None


def _ANY(value: Any) -> bool:
    return True


def _meet(a: set[str], b: set[str]) -> set[str]:
    """Types in both (an integer is a number)."""
    out = a & b
    if ("number" in a and "integer" in b) or ("integer" in a and "number" in b):
        out.add("integer")
    return out


def _in(value: Any, values: list[Any]) -> bool:
    key = json.dumps(value, sort_keys=True)
    return any(json.dumps(v, sort_keys=True) == key for v in values)


def engine_message(exc: BaseException) -> str:
    """XGrammar's message for a client: its first line, without the C++ source location."""
    lines = _LOCATION.sub("", str(exc).strip()).splitlines()
    return lines[0] if lines else type(exc).__name__


def _refuse(param: str, why: str) -> None:
    raise InvalidRequestError(f"{param}: {why}", param=param)
