"""The compose entry point without a Docker engine: `haproxy -c` accepts the shipped config (no
warnings), and the config, the compose `proxy` service, the runtime and Prometheus agree on
ports, paths and the drain timing. tests/deploy/test_proxy_live.py runs the same config."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import require_binary
from tests.deploy import stack
from tests.deploy.haproxy import API_PORT, CONFIG, METRICS_PORT, render_static, sections


def _duration_s(value: str) -> float:
    """HAProxy time: `2s`, `500ms`, `10m` (a bare number is milliseconds)."""
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 0.001}[unit]


def _server_options() -> dict[str, str]:
    line = next(
        d
        for d in sections(CONFIG.read_text())["backend runtime"]
        if d.startswith("default-server ")
    )
    words = line.split()[1:]
    options: dict[str, str] = {}
    for i, word in enumerate(words):
        if word in {"inter", "fastinter", "downinter", "rise", "fall", "observe", "on-error"}:
            options[word] = words[i + 1]
    options["check"] = "check" if "check" in words else ""
    return options


def test_haproxy_accepts_the_shipped_config_without_warnings(tmp_path: Path) -> None:
    haproxy = require_binary("haproxy", "/usr/sbin/haproxy")
    rendered = tmp_path / "static.cfg"
    rendered.write_text(
        render_static(CONFIG.read_text(), servers=["127.0.0.1:1"], api_port=1, metrics_port=2)
    )
    for path in (CONFIG, rendered):  # the compose file and the one the live tests run
        done = subprocess.run(
            [haproxy, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "Configuration file is valid" in output and "WARNING" not in output, output


def test_proxy_service_publishes_the_api_on_loopback_and_mounts_the_config() -> None:
    proxy = stack.services()["proxy"]
    assert stack.published_host_ports(proxy) == [f"127.0.0.1:{API_PORT}:{API_PORT}"]
    assert stack.listening_ports(proxy) == {API_PORT, METRICS_PORT}
    (mount,) = stack.mounts(proxy)
    assert mount.is_bind and mount.target == "/usr/local/etc/haproxy"  # the image's default
    assert stack.host_path(mount) == CONFIG.parent and CONFIG.name == "haproxy.cfg"
    assert re.fullmatch(r"haproxy:2\.6(\.\d+)?", proxy["image"])  # the branch CI checks with
    assert stack.healthcheck_ports(proxy) == {METRICS_PORT}
    assert "/healthz" in " ".join(proxy["healthcheck"]["test"])


def test_config_binds_what_compose_exposes_and_discovers_the_runtime() -> None:
    found = sections(CONFIG.read_text())
    assert f"bind :{API_PORT}" in found["frontend api"]
    assert f"bind :{METRICS_PORT}" in found["frontend metrics"]
    metrics = found["frontend metrics"]
    assert "monitor-uri /healthz" in metrics
    assert "http-request use-service prometheus-exporter if { path /metrics }" in metrics
    runtime_port = int(stack.services()["runtime"]["environment"]["FASTLLM_PORT"])
    (template,) = [d for d in found["backend runtime"] if d.startswith("server-template ")]
    assert f" runtime:{runtime_port} " in template and "resolvers docker" in template
    assert "parse-resolv-conf" in found["resolvers docker"]  # Docker's DNS, 127.0.0.11


def test_balancing_health_checks_and_retries() -> None:
    found = sections(CONFIG.read_text())
    backend, defaults = found["backend runtime"], found["defaults"]
    assert "balance leastconn" in backend
    assert "http-check send meth GET uri /ready" in backend
    assert "http-check expect status 200" in backend
    assert _server_options()["check"] == "check"
    # only connection failures are retried (no request that reached a replica is replayed)
    assert [d for d in defaults + backend if d.startswith("retry-on")] == ["retry-on conn-failure"]
    assert "option redispatch 1" in defaults
    assert "option http-no-delay" in defaults
    assert not [d for d in defaults + backend if d.startswith(("compression", "filter"))]


def test_the_unready_window_outlasts_the_proxy_noticing() -> None:
    """After SIGTERM the replica serves on for FASTLLM_DRAIN_UNREADY_S while /ready says 503: the
    proxy must have marked it down by then, at worst one `inter` plus (fall - 1) `fastinter`
    plus the check's own timeout after the signal."""
    options = _server_options()
    timeouts = dict(
        d.split()[1:3] for d in sections(CONFIG.read_text())["defaults"] if d.startswith("timeout ")
    )
    fall = int(options["fall"])
    worst_s = _duration_s(options["inter"]) + (fall - 1) * _duration_s(options["fastinter"])
    worst_s += _duration_s(timeouts["check"])
    runtime = stack.services()["runtime"]
    unready_s = float(runtime["environment"]["FASTLLM_DRAIN_UNREADY_S"])
    assert unready_s > worst_s, (unready_s, worst_s)
    grace_s = float(runtime["environment"].get("FASTLLM_DRAIN_GRACE_S", 30))
    assert _duration_s(runtime["stop_grace_period"]) > unready_s + grace_s


def test_prometheus_scrapes_the_proxy_exporter() -> None:
    config = stack.load_yaml(stack.REPO / "deploy" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "haproxy"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"proxy:{METRICS_PORT}"]
