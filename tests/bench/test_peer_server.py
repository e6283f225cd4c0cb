"""bench.peer --server's pieces: the closed-loop streaming client against a live server (tokens,
TTFT and TPOT from what arrives), and the report's choice of llama-server's best configuration.
llama-server itself is an optional bench step (bench.peer_server_build), not run here."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import peer_server
from bench.peer_server import Window, closed_loop, summarise
from bench.peer_server_plot import configs, plot, series
from tests.integration.support import MODEL, live_runtime, runtime_settings


def test_closed_loop_counts_what_arrives_and_reads_late_requests_to_their_first_token(
    demo_model_dir: Callable[[str], Path],
) -> None:
    settings = runtime_settings(demo_model_dir("llama"))
    with live_runtime(settings) as server:
        got = asyncio.run(closed_loop(server.url, MODEL, [5, 6, 7, 8], 3, 8, 1.5))
    assert got.failed == 0
    finished = len(got.tpot_s)
    assert finished >= 3  # each of the 3 clients finished at least one 8-token request
    assert got.finished_tokens == 8 * finished  # usage of every finished request: 8 tokens
    assert 0 < got.finished_events <= got.finished_tokens  # tokens without text send no event
    # every request that got a first token was timed, finished or cut at the window's end
    assert len(got.ttft_s) >= finished and all(t > 0 for t in got.ttft_s)
    # from the first text event to the stream's last event over the tokens in between
    assert all(t >= 0 for t in got.tpot_s) and sum(got.tpot_s) > 0
    fig = got.figures()
    assert fig["tokens_per_s"] == pytest.approx(
        got.events_in_window * got.finished_tokens / got.finished_events / 1.5
    )


def test_figures_scale_events_to_tokens_and_quantiles_pick_ranks() -> None:
    w = Window(10.0, events_in_window=50, finished_events=40, finished_tokens=80)
    w.ttft_s = [0.4, 0.1, 0.3, 0.2]
    w.tpot_s = [0.05]
    fig = w.figures()
    assert fig["tokens_per_s"] == 10.0  # 50 events x 2 tokens an event over 10 s
    assert (fig["ttft_p50_s"], fig["ttft_p99_s"]) == (0.3, 0.4)
    assert math.isnan(Window(1.0).figures()["tpot_p50_s"])
    assert Window(1.0).figures()["tokens_per_event"] == 1.0  # nothing finished: events as tokens


def _fig(tps: float, ttft: float) -> dict[str, float]:
    return {"tokens_per_s": tps, "ttft_p50_s": ttft, "tpot_p50_s": 0.05}


def test_summary_takes_llama_servers_best_configuration_per_stream_count() -> None:
    per_round = {
        "llama_server_np8": {8: [_fig(100, 1.0), _fig(120, 1.2)], 32: [_fig(130, 12.0)]},
        "llama_server_np32": {8: [_fig(90, 0.5)], 32: [_fig(150, 5.0)]},
        "ours_defaults": {
            8: [_fig(110, 0.4), _fig(130, 0.6), _fig(100, 0.5)],
            32: [_fig(120, 2.5)],
        },
    }
    report = summarise(per_round, [8, 32])
    assert report["8"]["llama_server"]["config"] == "llama_server_np8"
    assert report["8"]["llama_server"]["tokens_per_s"] == 110  # the median of its rounds
    assert report["8"]["llama_server"]["tokens_per_s_spread"] == 20
    assert report["8"]["ours_defaults"]["tokens_per_s"] == 110
    assert report["8"]["ratio_defaults_vs_llama_server"] == 1.0
    assert report["32"]["llama_server"]["config"] == "llama_server_np32"
    assert report["32"]["ratio_defaults_vs_llama_server"] == 0.8
    assert report["32"]["ttft_p50_defaults_vs_llama_server"] == 0.5
    assert set(report["32"]["llama_server_configs"]) == {"llama_server_np8", "llama_server_np32"}


def test_the_plot_draws_each_side_against_streams(tmp_path: Path) -> None:
    per_round = {
        "llama_server_np8": {1: [_fig(50, 0.1)], 32: [_fig(130, 12.0)]},
        "llama_server_np32": {1: [_fig(45, 0.1)], 32: [_fig(150, 5.0)]},
        "ours_defaults": {1: [_fig(60, 0.05)], 32: [_fig(120, 2.5)]},
        "ours_throughput": {1: [_fig(60, 0.05)], 32: [_fig(155, 1.5)]},
    }
    report = {"streams": summarise(per_round, [1, 32]), "threads": 2, "max_tokens": 64}
    got = series(report)
    assert set(got) == {"llama_server", "ours_defaults", "ours_throughput"}
    assert [c for c, _ in got["llama_server"]] == [1, 32]
    assert [f["config"] for _, f in got["llama_server"]] == [
        "llama_server_np8",
        "llama_server_np32",
    ]
    each = configs(report)
    assert set(each) == {"llama_server_np8", "llama_server_np32"}
    assert [f["ttft_p50_s"] for _, f in each["llama_server_np32"]] == [0.1, 5.0]
    plot(report, tmp_path / "peer.png")
    assert (tmp_path / "peer.png").read_bytes().startswith(b"\x89PNG")


def test_a_server_that_is_not_there_counts_failures_without_a_retry_storm() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    got = asyncio.run(closed_loop(f"http://127.0.0.1:{port}", MODEL, [5], 2, 8, 0.5))
    assert got.events_in_window == 0 and not got.ttft_s
    # each client waits 0.1 s after a failure: at most ~6 tries each in half a second
    assert 2 <= got.failed <= 2 * 7


def test_ours_takes_only_known_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        peer_server.main(["--ours", "defaults,fastest", "--llama-server", "/nonexistent"])
    assert info.value.code == 2
    assert "--ours takes defaults, throughput, compiled, not 'defaults,fastest'" in (
        capsys.readouterr().err
    )
