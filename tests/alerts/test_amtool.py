"""deploy/alertmanager.yml passes Alertmanager's own config check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_binary

CONFIG = Path(__file__).parents[2] / "deploy" / "alertmanager.yml"


def test_amtool_check_config() -> None:
    amtool = require_binary("amtool")
    result = subprocess.run(
        [amtool, "check-config", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_routes_to_a_webhook_that_hears_resolutions() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    hooks = receivers[config["route"]["receiver"]]["webhook_configs"]
    assert hooks and all(h["send_resolved"] for h in hooks)
