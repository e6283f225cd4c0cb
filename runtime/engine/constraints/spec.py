"""What a request constrains its output to, and the check that turns a bad one into a 400.

`ConstraintSpec.parse()` runs XGrammar's own front end (JSON Schema -> grammar, regex -> grammar,
EBNF parser) on the request thread: it is cheap next to the tokenizer-dependent compile (cache.py)
and it is what finds a schema, regex or grammar the engine cannot take. Its message goes back to
the client with the field that carried the constraint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.engine.constraints.limits import GrammarLimits
from runtime.engine.constraints.rules import check_schema, check_size, engine_message
from runtime.errors import InvalidRequestError

if TYPE_CHECKING:  # XGrammar is imported where it is used: it pulls in transformers (~0.8 s)
    import xgrammar as xgr

__all__ = ["CONSTRAINT_KINDS", "ConstraintSpec"]

# kind -> what `source` holds
CONSTRAINT_KINDS = {
    "json": "a JSON Schema (JSON text)",
    "json_object": "any JSON object (source unused)",
    "regex": "a regular expression",
    "choice": "a JSON list of the allowed strings",
    "grammar": "an EBNF grammar (XGrammar's GBNF dialect)",
}


@dataclass(frozen=True)
class ConstraintSpec:
    kind: str  # one of CONSTRAINT_KINDS
    source: str  # see CONSTRAINT_KINDS
    param: str  # the request field it came from (named in a 400)
    label: str = ""  # RequestStats.constraint / metrics / spans; default: the kind's family

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidRequestError(f"unknown constraint kind {self.kind!r}", param=self.param)

    @property
    def stats_label(self) -> str:
        """none | json | regex | choice | grammar | tools (the inference_log vocabulary)."""
        return self.label or ("json" if self.kind == "json_object" else self.kind)

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.kind, self.source)

    @classmethod
    def json_schema(cls, schema: Any, param: str, label: str = "") -> ConstraintSpec:
        """A schema given as a dict (or JSON text): the key is its canonical text, so the same
        schema sent with its keys in another order hits the same compiled grammar."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise InvalidRequestError(f"{param}: not valid JSON ({exc})", param=param) from exc
        if not isinstance(schema, dict | bool):
            raise InvalidRequestError(f"{param}: a JSON Schema must be an object", param=param)
        return cls("json", json.dumps(schema, sort_keys=True, separators=(",", ":")), param, label)

    @classmethod
    def choice(cls, choices: Any, param: str) -> ConstraintSpec:
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise InvalidRequestError(
                f"{param}: a choice is a non-empty list of non-empty strings", param=param
            )
        return cls("choice", json.dumps(choices), param)

    def check(self, limits: GrammarLimits | None = None) -> xgr.Grammar:
        """Every check a constraint passes before its compile (rules.py), then XGrammar's parse:
        its grammar, or InvalidRequestError naming the field."""
        limits = limits or GrammarLimits()
        check_size(self.kind, self.source, self.param, limits)
        if self.kind == "json":
            check_schema(json.loads(self.source), self.param, limits)
        return self.to_grammar()

    def to_grammar(self) -> xgr.Grammar:
        """XGrammar's grammar for this spec; InvalidRequestError with XGrammar's message."""
        import xgrammar as xgr

        try:
            if self.kind == "json":
                return xgr.Grammar.from_json_schema(self.source, any_whitespace=False)
            if self.kind == "json_object":
                return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.source)
            if self.kind == "choice":
                # one alternative per choice; json.dumps quotes are also EBNF string literals
                alternatives = " | ".join(json.dumps(c) for c in json.loads(self.source))
                return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
            return xgr.Grammar.from_ebnf(self.source)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = engine_message(exc)
            raise InvalidRequestError(
                f"{self.param}: the grammar engine refused it: {message}", param=self.param
            ) from exc
