"""The checks every constraint passes before its compile (runtime.engine.constraints.rules): size
bounds, local `$ref` only, one answer for a lookaround wherever a regex appears, unsatisfiable
schemas refused. `jsonschema` (the reference validator) confirms that each schema refused as
unsatisfiable accepts none of a spread of values, and that the satisfiable look-alikes accept
one."""

from __future__ import annotations

import json

import jsonschema
import pytest

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.constraints.limits import GrammarLimits
from runtime.errors import InvalidRequestError

SMALL = GrammarLimits(
    max_regex_chars=16,
    max_schema_bytes=200,
    max_schema_properties=3,
    max_schema_depth=4,
    max_grammar_rules=2,
    max_grammar_bytes=100,
)
SAMPLES = [None, True, 0, 1, 2, 5, 2.5, -3, "", "a", "abcdef", [], [1], {}, {"a": 1}, {"a": "x"}]


def refused(spec: ConstraintSpec, limits: GrammarLimits | None = None) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        spec.check(limits)
    assert caught.value.param == spec.param
    return caught.value


@pytest.mark.parametrize(
    ("spec", "setting"),
    [
        (ConstraintSpec("regex", "a" * 17, "guided_regex"), "grammar_max_regex_chars"),
        (ConstraintSpec("grammar", 'a ::= "x"\n' * 3, "guided_grammar"), "grammar_max_rules"),
        (ConstraintSpec("grammar", f'root ::= "{"x" * 100}"', "guided_grammar"), "grammar_bytes"),
        (
            ConstraintSpec.json_schema({"enum": ["x" * 300]}, "response_format"),
            "grammar_max_schema_bytes",
        ),
        (
            ConstraintSpec.json_schema(
                {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}},
                "guided_json",
            ),
            "grammar_max_schema_properties",
        ),
        (
            ConstraintSpec.json_schema(
                {"type": "array", "items": {"items": {"items": {"items": {"items": {}}}}}},
                "guided_json",
            ),
            "grammar_max_schema_depth",
        ),
        (
            ConstraintSpec.json_schema({"type": "string", "pattern": "b" * 17}, "guided_json"),
            "grammar_max_regex_chars",
        ),
    ],
)
def test_a_constraint_past_its_size_bound_is_refused_naming_field_and_setting(
    spec: ConstraintSpec, setting: str
) -> None:
    error = refused(spec, SMALL)
    assert str(error).startswith(f"{spec.param}: ") and setting in str(error)


def test_the_same_constraints_within_the_default_bounds_pass() -> None:
    ConstraintSpec("regex", "a" * 17, "guided_regex").check()
    ConstraintSpec.json_schema({"type": "string", "pattern": "b{2,3}"}, "guided_json").check()


@pytest.mark.parametrize(
    "ref", ["http://example.com/s.json", "file:///etc/passwd", "other.json#/x", "urn:x"]
)
def test_a_ref_that_is_not_local_is_refused(ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}
    assert "only local references" in str(
        refused(ConstraintSpec.json_schema(schema, "response_format"))
    )


def test_a_local_ref_still_compiles() -> None:
    schema = {
        "$defs": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}},
    }
    ConstraintSpec.json_schema(schema, "guided_json").check()


@pytest.mark.parametrize("regex", ["(?=a)a", "(?!b)a", "(?<=a)b", "(?<!a)b"])
def test_a_lookaround_gets_one_answer_wherever_a_regex_appears(regex: str) -> None:
    direct = refused(ConstraintSpec("regex", regex, "guided_regex"))
    in_schema = refused(
        ConstraintSpec.json_schema({"type": "string", "pattern": regex}, "guided_json")
    )
    as_name = refused(
        ConstraintSpec.json_schema(
            {"type": "object", "patternProperties": {regex: {"type": "integer"}}}, "guided_json"
        )
    )
    reason = str(direct).split("refused it: ")[1]
    assert reason in str(in_schema) and reason in str(as_name)


UNSATISFIABLE = [
    {"type": []},
    {"not": {}},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"const": 1, "enum": [2, 3]},
    {"type": "string", "enum": [1, 2]},
    {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "required": ["a", "b"], "maxProperties": 1},
    {"type": "object", "properties": {"x": {"allOf": [{"type": "null"}, {"type": "boolean"}]}}},
    {"type": "integer", "minimum": 5, "maximum": 1},  # XGrammar's own check
]


@pytest.mark.parametrize("schema", UNSATISFIABLE, ids=json.dumps)
def test_an_unsatisfiable_schema_is_refused(schema: dict) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    if "x" not in schema.get("properties", {}):  # a nested one: the object itself may be valid
        assert not any(validator.is_valid(v) for v in SAMPLES)  # the reference agrees
    refused(ConstraintSpec.json_schema(schema, "guided_json"))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": ["string", "integer"]},
        {"allOf": [{"type": "number"}, {"type": "integer"}]},
        {"const": 2, "enum": [2, 3]},
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    ],
    ids=json.dumps,
)
def test_satisfiable_look_alikes_pass(schema: dict) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    assert any(validator.is_valid(v) for v in SAMPLES)
    ConstraintSpec.json_schema(schema, "guided_json").check()
