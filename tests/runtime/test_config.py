"""Invalid settings from the environment, YAML or flags are typed errors naming the setting, and
the CLI turns them into `error: ...` with exit 2 (no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import main
from runtime.config import load_settings
from runtime.errors import ConfigError


def test_bad_environment_value_names_the_setting_and_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FASTLLM_HEAP_TRIM_INTERVAL_S", "-1")
    with pytest.raises(ConfigError, match="FASTLLM_HEAP_TRIM_INTERVAL_S") as err:
        load_settings()
    assert err.value.param == "heap_trim_interval_s" and "'-1'" in err.value.message


def test_bad_yaml_value_and_cross_setting_check(tmp_path: Path) -> None:
    config = tmp_path / "fastllm.yaml"
    config.write_text("min_util: abc\n")
    with pytest.raises(ConfigError, match="invalid setting min_util"):
        load_settings(config)
    config.write_text("min_util: 0.9\nmax_util: 0.5\n")
    with pytest.raises(ConfigError, match=r"invalid settings: .*must be below max_util"):
        load_settings(config)


def test_cli_reports_a_bad_setting_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FASTLLM_MIN_UTIL", "abc")
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("error: invalid setting min_util (FASTLLM_MIN_UTIL")
    assert "Traceback" not in err


def test_batch_goal_names_a_band(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert (load_settings().min_util, load_settings().max_util) == (0.6, 0.8)
    settings = load_settings(batch_goal="throughput")
    assert (settings.min_util, settings.max_util) == (0.9, 1.0)
    monkeypatch.setenv("FASTLLM_BATCH_GOAL", "latency")
    assert (load_settings().min_util, load_settings().max_util) == (0.5, 0.7)
    monkeypatch.setenv("FASTLLM_BATCH_GOAL", "fastest")
    with pytest.raises(ConfigError, match="batch_goal"):
        load_settings()


def test_cli_batch_goal_flag_refuses_an_unknown_goal(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", "0", "--batch-goal", "fastest"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-goal" in err and "Traceback" not in err


def test_mmap_threshold_above_glibcs_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLLM_HEAP_MMAP_THRESHOLD_BYTES", str(64 << 20))
    with pytest.raises(ConfigError, match="FASTLLM_HEAP_MMAP_THRESHOLD_BYTES") as err:
        load_settings()
    assert err.value.param == "heap_mmap_threshold_bytes"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("chat_template_timeout_s", "0"),
        ("chat_template_max_output_chars", "10"),
        ("chat_template_max_memory_bytes", "1024"),
        ("chat_template_workers", "0"),
        ("offload_workers", "0"),
        ("max_response_bytes", "100"),
    ],
)
def test_request_work_limits_are_validated(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"FASTLLM_{name.upper()}", value)
    with pytest.raises(ConfigError, match=name):
        load_settings()


def test_the_template_settings_reach_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.models import template_sandbox
    from runtime.server import offload
    from runtime.server.wiring import configure_request_work

    monkeypatch.setattr(template_sandbox, "_sandbox", None)
    monkeypatch.setattr(offload, "_num_workers", offload._num_workers)
    settings = load_settings(
        chat_template_timeout_s=0.25,
        chat_template_max_output_chars=2048,
        chat_template_max_memory_bytes=128 << 20,
        chat_template_workers=3,
        offload_workers=5,
    )
    configure_request_work(settings)
    sandbox = template_sandbox.get_sandbox()
    assert sandbox.limits == template_sandbox.TemplateLimits(0.25, 2048, 128 << 20, 3)
    assert offload._num_workers == 5
    with pytest.raises(template_sandbox.TemplateFailure, match=r"0\.25 s"):
        sandbox.render(
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", {}
        )
    sandbox.close()
