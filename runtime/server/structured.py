"""From a request body's structured-output fields to the engine's `ConstraintSpec`.

OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` (one of
json / regex / choice / grammar) and vLLM's older `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar`. At most one constraint per request: two are a 400 naming the
second. Whether the engine can take it (a schema feature, a regex, a grammar) is decided by the
engine's parse (runtime.engine.constraints.spec), which names the field too.
"""

from __future__ import annotations

from runtime.engine.constraints import ConstraintSpec
from runtime.errors import InvalidRequestError
from runtime.server.structured_schemas import StructuredFields

__all__ = ["constraint_of"]


def constraint_of(body: StructuredFields) -> ConstraintSpec | None:
    found: list[ConstraintSpec] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(ConstraintSpec("json_object", "", "response_format"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise InvalidRequestError(
                "response_format.json_schema.schema is required for type json_schema",
                param="response_format",
            )
        found.append(ConstraintSpec.json_schema(fmt.json_schema.schema_, "response_format"))
    so = body.structured_outputs
    if so is not None:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(so, k) is not None]
        if len(given) != 1:
            raise InvalidRequestError(
                "structured_outputs takes exactly one of json, regex, choice, grammar",
                param="structured_outputs",
            )
        found.append(_spec(given[0].rstrip("_"), getattr(so, given[0]), "structured_outputs"))
    for kind in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{kind}")
        if value is not None:
            found.append(_spec(kind, value, f"guided_{kind}"))
    if len(found) > 1:
        raise InvalidRequestError(
            f"{found[1].param}: only one structured-output constraint per request "
            f"({found[0].param} is already one)",
            param=found[1].param,
        )
    return found[0] if found else None


def _spec(kind: str, value: object, param: str) -> ConstraintSpec:
    if kind == "json":
        return ConstraintSpec.json_schema(value, param)
    if kind == "choice":
        return ConstraintSpec.choice(value, param)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param}: must be a non-empty string", param=param)
    return ConstraintSpec(kind, value, param)
