"""The rule file and its unit tests, checked by Prometheus' own promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

from alerts.rules import DEFAULT_RULES_PATH
from tests.conftest import require_binary

ROOT = Path(__file__).parents[2]
TEST_FILES = sorted((ROOT / "alerts" / "tests").glob("*.yml"))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(DEFAULT_RULES_PATH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


def test_promtool_test_rules() -> None:
    assert len(TEST_FILES) >= 4
    result = _promtool("test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES)


def test_promtool_test_rules_catches_a_wrong_expectation(tmp_path: Path) -> None:
    # the harness can fail: the utilization test expecting another severity than the rule's
    source = (ROOT / "alerts" / "tests" / "utilization.test.yml").read_text()
    broken = source.replace("severity: warning", "severity: critical", 1)
    assert broken != source
    target = tmp_path / "broken.test.yml"
    target.write_text(broken.replace("../rules/", str(DEFAULT_RULES_PATH.parent) + "/"))
    result = _promtool("test", "rules", str(target))
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
