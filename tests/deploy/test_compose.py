"""docker-compose.yml checked without a Docker engine: it parses, every mounted file exists, health
checks probe ports their service listens on, `service:port` references across the configs land on
listening ports, the runtime scales (no fixed host port) and is configured only with settings it
reads, and secrets come from .env (gitignored, documented in .env.example) with no defaults."""

from __future__ import annotations

import re

import pytest

from runtime.config import Settings
from tests.deploy import stack

EXPECTED_SERVICES = {
    "proxy",
    "runtime",
    "postgres",
    "prometheus",
    "alertmanager",
    "grafana",
    "otel-collector",
    "jaeger",
}
SECRETS = ("POSTGRES_PASSWORD", "GRAFANA_PG_PASSWORD", "GRAFANA_ADMIN_PASSWORD")


def test_compose_parses_with_the_stack_services() -> None:
    data = stack.compose()
    assert set(data["services"]) == EXPECTED_SERVICES
    for name, service in data["services"].items():
        assert "image" in service or "build" in service, name


def test_every_mounted_host_path_exists_and_named_volumes_are_declared() -> None:
    declared = set(stack.compose().get("volumes") or {})
    for name, service in stack.services().items():
        for mount in stack.mounts(service):
            if mount.is_bind:
                path = stack.host_path(mount)
                assert path.exists(), f"{name} mounts {mount.source}, which is not in the repo"
                assert stack.REPO in path.parents, f"{name} mounts {mount.source} outside the repo"
            else:
                assert mount.source in declared, f"{name}: volume {mount.source} not declared"


def test_mounted_directories_hold_what_the_service_reads() -> None:
    svc = stack.services()
    by_target = {
        (name, m.target): stack.host_path(m)
        for name, s in svc.items()
        for m in stack.mounts(s)
        if m.is_bind
    }
    assert list(by_target["prometheus", "/etc/prometheus/rules"].glob("*.yml"))
    assert list(by_target["grafana", "/var/lib/grafana/dashboards"].glob("*.json"))
    provisioning = by_target["grafana", "/etc/grafana/provisioning"]
    assert list((provisioning / "datasources").glob("*.yml"))
    assert list((provisioning / "dashboards").glob("*.yml"))


def test_runtime_build_context_has_the_dockerfile_and_entrypoint() -> None:
    build = stack.services()["runtime"]["build"]
    context = stack.REPO / build["context"]
    assert (context / build.get("dockerfile", "Dockerfile")).is_file()
    assert (stack.REPO / "deploy" / "entrypoint.sh").is_file()


@pytest.mark.parametrize("name", sorted(EXPECTED_SERVICES))
def test_healthcheck_targets_a_port_the_service_listens_on(name: str) -> None:
    service = stack.services()[name]
    if "healthcheck" not in service:
        # distroless images (collector, jaeger) have no shell or client to probe with
        assert name in {"otel-collector", "jaeger"}, f"{name} has no healthcheck"
        return
    probed = stack.healthcheck_ports(service)
    assert probed, f"{name}'s healthcheck names no port"
    assert probed <= stack.listening_ports(service), (name, probed, stack.listening_ports(service))


def test_runtime_health_is_readiness_on_its_configured_port() -> None:
    runtime = stack.services()["runtime"]
    test = " ".join(runtime["healthcheck"]["test"])
    assert "/ready" in test
    port = int(runtime["environment"]["FASTLLM_PORT"])
    assert stack.healthcheck_ports(runtime) == {port} == stack.listening_ports(runtime)
    assert runtime["environment"]["FASTLLM_HOST"] == "0.0.0.0"  # reachable from other containers


def test_runtime_publishes_no_fixed_host_port_so_it_scales() -> None:
    runtime = stack.services()["runtime"]
    assert stack.published_host_ports(runtime) == []
    assert "container_name" not in runtime


def test_published_ports_bind_loopback_only() -> None:
    for name, service in stack.services().items():
        for port in stack.published_host_ports(service):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def _config_texts() -> dict[str, str]:
    texts = {
        str(path.relative_to(stack.REPO)): path.read_text()
        for path in [
            stack.REPO / "deploy" / "prometheus.yml",
            stack.REPO / "deploy" / "otel-collector.yaml",
            stack.REPO / "deploy" / "alertmanager.yml",
            stack.REPO / "deploy" / "haproxy" / "haproxy.cfg",
            *sorted((stack.REPO / "deploy" / "grafana").rglob("*.yml")),
        ]
    }
    for name, service in stack.services().items():  # environment values, not image tags
        env = service.get("environment") or {}
        texts[f"docker-compose.yml:{name}.environment"] = "\n".join(map(str, env.values()))
    return texts


def test_service_references_land_on_listening_ports() -> None:
    svc = stack.services()
    refs = [
        (where, host, port)
        for where, text in _config_texts().items()
        for host, port in stack.service_references(text, set(svc))
    ]
    assert {host for _, host, _ in refs} >= {
        "runtime",
        "proxy",
        "postgres",
        "prometheus",
        "alertmanager",
        "otel-collector",
        "jaeger",
    }
    for where, host, port in refs:
        assert port in stack.listening_ports(svc[host]), f"{where}: {host}:{port} not listened on"


def test_runtime_environment_is_settings_the_runtime_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = stack.services()["runtime"]["environment"]
    fields = set(Settings.model_fields)
    for key in env:
        if key.startswith("OTEL_"):
            continue
        assert key.startswith("FASTLLM_"), f"runtime env {key} is neither FASTLLM_* nor OTEL_*"
        assert key.removeprefix("FASTLLM_").lower() in fields, f"{key} is not a Settings field"
    for key in [k for k in list(__import__("os").environ) if k.startswith("FASTLLM_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, stack.interpolate(str(value), {}))
    settings = Settings()  # the values validate too (e.g. FASTLLM_API_KEYS must be JSON)
    assert settings.database_url.startswith("postgresql+psycopg://fastllm:")
    assert settings.alerts_enabled is False and settings.port == 8000


def test_dockerfile_env_and_healthcheck() -> None:
    text = (stack.REPO / "Dockerfile").read_text().replace("\\\n", " ")
    fields = set(Settings.model_fields)
    for key in re.findall(r"\b(FASTLLM_[A-Z_]+)=", text):
        assert key.removeprefix("FASTLLM_").lower() in fields, key
    assert re.search(r"^HEALTHCHECK .*/ready", text, re.M)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    for source in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (stack.REPO / source).exists(), f"Dockerfile copies missing {source}"
    # memory flat by default: the image has jemalloc and insists on it (compose inherits it)
    assert re.search(r"^RUN .*apt-get install .*\blibjemalloc2\b", text, re.M)
    assert re.search(r"\bFASTLLM_MALLOC=jemalloc\b", text)


def test_secrets_come_from_env_without_defaults() -> None:
    raw = stack.COMPOSE.read_text()
    for secret in SECRETS:
        uses = re.findall(r"\$\{" + secret + r"(:?[-?])?[^}]*\}", raw)
        assert uses, f"{secret} is not used"
        assert all(kind in (":?", "?") for kind in uses), f"{secret} must be required, no default"
    example = (stack.REPO / ".env.example").read_text()
    documented = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)=(.*)$", example, re.M))
    assert stack.interpolated_names(raw) <= set(documented)
    assert all(documented[s] == "" for s in SECRETS), ".env.example must not carry secrets"
    ignored = (stack.REPO / ".gitignore").read_text().split()
    assert ".env" in ignored
    for name, service in stack.services().items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert str(value).startswith("${"), f"{name}: {key} is a literal, not from .env"
