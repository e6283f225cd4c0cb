"""The `make mutate` table names real files and tests, and its mutant globs match mutmut's
naming of those files' functions (a typo would make a mechanism mutate or test nothing)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import tomllib

from tests.mutation.mechanisms import MECHANISMS, by_name
from tests.mutation.run import module_glob, mutmut_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.name)
def test_every_file_and_test_exists(mechanism) -> None:  # type: ignore[no-untyped-def]
    for path in mechanism.files:
        assert (ROOT / path).is_file(), path
    for test in mechanism.tests:
        assert (ROOT / test.split("::")[0]).exists(), test
    modules = [module_glob(p) for p in mechanism.files]
    for glob in mechanism.only:  # each names functions of one of the mutated modules
        prefix = glob.split(".x")[0]
        assert any(fnmatch.fnmatch(f"{prefix}.x_f__mutmut_1", m) for m in modules), glob


def test_the_generated_mutmut_section_parses() -> None:
    mechanism = by_name("verification")
    section = tomllib.loads(mutmut_config(mechanism, mechanism.tests))["tool"]["mutmut"]
    assert section["only_mutate"] == list(mechanism.files)
    assert section["pytest_add_cli_args_test_selection"] == list(mechanism.tests)
    assert section["process_isolation"] == "forkserver"


def test_unknown_mechanism_is_an_error() -> None:
    with pytest.raises(KeyError, match="known: allocator"):
        by_name("nope")
