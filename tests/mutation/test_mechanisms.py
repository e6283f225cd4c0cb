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


def test_again_retests_what_was_not_killed_and_renumbered_functions() -> None:
    from tests.mutation.run import unsettled

    statuses = {
        "m.x_f__mutmut_1": 1,  # killed: kept
        "m.x_f__mutmut_2": 0,  # survived
        "m.xǁCǁh__mutmut_10": 36,  # timed out: looked at again
        "m.x_k__mutmut_1": 33,  # no tests
        "m.x_n__mutmut_1": None,  # never run: an edit renumbered n, all of it again
        "m.x_n__mutmut_2": 0,
        "m.x_n__mutmut_3": 1,
    }
    assert unsettled(statuses) == [
        "m.x_f__mutmut_2",
        "m.x_k__mutmut_1",
        "m.x_n__mutmut_*",
        "m.xǁCǁh__mutmut_10",
    ]
