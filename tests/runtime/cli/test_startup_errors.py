"""Finding 5 of issue 17: every startup error of `fastllm serve` is one line naming the setting
and its variable, and exit code 2; list settings take a comma list as well as JSON. The server
itself is never built here (stand-ins for create_app / run_server fail the test if reached)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import runtime.server
from runtime.cli import main
from runtime.config import load_settings
from runtime.errors import ConfigError


@pytest.fixture
def serve(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    demo_model_dir: Callable[[str], Path],
) -> Callable[..., tuple[int, str]]:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the settings passed the startup checks: the server would start")

    monkeypatch.setattr(runtime.server, "create_app", never)
    monkeypatch.setattr(runtime.server, "run_server", never)
    model = str(demo_model_dir("llama"))

    def run(**env: str) -> tuple[int, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--model", model, "--port", "0"])
        return int(exc.value.code or 0), capsys.readouterr().err

    return run


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"FASTLLM_DATABASE_URL": "sqlite:////proc/nope/x.db"}, "database_url"),
        ({"FASTLLM_DATABASE_URL": "notaurl://x"}, "database_url"),
        ({"FASTLLM_DATABASE_URL": "postgresql+nodriver://u:s3cret@h/db"}, "database_url"),
        ({"FASTLLM_DATABASE_URL": "::"}, "database_url"),
        ({"FASTLLM_LOG_SPOOL_PATH": "/proc/nope/spool.jsonl"}, "log_spool_path"),
        ({"FASTLLM_LATENCY_BUCKETS_S": "[0.1, 0.5"}, "latency_buckets_s"),
        ({"FASTLLM_DEVICE": "tpu"}, "device"),
        ({"FASTLLM_DTYPE": "fp8"}, "dtype"),
        ({"FASTLLM_BODY_READ_TIMEOUT_S": "0"}, "body_read_timeout_s"),
    ],
    ids=lambda v: next(iter(v.values())) if isinstance(v, dict) else v,
)
def test_one_line_naming_the_setting_and_exit_2(
    serve: Callable[..., tuple[int, str]], env: dict[str, str], setting: str
) -> None:
    code, err = serve(**env)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: invalid setting {setting}"), err
    assert f"FASTLLM_{setting.upper()}" in err
    assert "expected" in err or "should" in err  # what would be right
    assert "Traceback" not in err and "s3cret" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_requested_without_a_cuda_device(serve: Callable[..., tuple[int, str]]) -> None:
    code, err = serve(FASTLLM_DEVICE="cuda")
    assert code == 2 and "FASTLLM_DEVICE" in err and "no CUDA device" in err


@pytest.mark.parametrize(
    ("value", "keys"),
    [("k1", ["k1"]), ("k1, k2", ["k1", "k2"]), ('["k1","k2"]', ["k1", "k2"])],
)
def test_api_keys_as_a_comma_list_or_json(
    monkeypatch: pytest.MonkeyPatch, value: str, keys: list[str]
) -> None:
    monkeypatch.setenv("FASTLLM_API_KEYS", value)
    assert load_settings().api_keys == keys


def test_other_list_settings_take_a_comma_list_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLLM_LATENCY_BUCKETS_S", "0.1, 0.5,2")
    assert load_settings().latency_buckets_s == [0.1, 0.5, 2.0]
    monkeypatch.setenv("FASTLLM_LATENCY_BUCKETS_S", "0.1,fast")
    with pytest.raises(ConfigError, match=r"latency_buckets_s\[1\] \(FASTLLM_LATENCY_BUCKETS_S"):
        load_settings()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize(
    ("env", "setting", "says"),
    [
        ({"FASTLLM_QUANTIZATION": "fp8"}, "quantization", "compute capability"),
        ({"FASTLLM_QUANTIZATION": "int3"}, "quantization", "should match"),
        ({"FASTLLM_QUANTIZATION": "int4", "FASTLLM_QUANT_GROUP_SIZE": "48"}, "quant_group_size",
         "group size"),
        ({"FASTLLM_NUM_THREADS": "-1"}, "num_threads", "greater than or equal"),
    ],
)  # fmt: skip
def test_quantization_settings_that_cannot_work_here(
    serve: Callable[..., tuple[int, str]], env: dict[str, str], setting: str, says: str
) -> None:
    code, err = serve(**env)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: invalid setting {setting}"), err
    assert says in err and "Traceback" not in err
