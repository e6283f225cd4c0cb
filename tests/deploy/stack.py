"""Reading docker-compose.yml and the configs it mounts, without a Docker engine: mounts, the ports
each service listens on, health-check targets, `${VAR}` interpolation and `service:port`
references between the files."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
# host:port inside URLs and endpoints; the host is checked against the service names
SERVICE_PORT = re.compile(r"(?<![\w.-])([a-z][a-z0-9-]*):(\d{2,5})\b")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE)
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


@dataclass(frozen=True)
class Mount:
    source: str  # host path (relative to the repo) or a named volume
    target: str  # path in the container
    is_bind: bool


def mounts(service: Mapping[str, Any]) -> list[Mount]:
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:  # long syntax
            source, target = volume.get("source", ""), volume["target"]
        is_bind = source.startswith((".", "/", "~"))
        found.append(Mount(source, target, is_bind))
    return found


def host_path(mount: Mount) -> Path:
    return (REPO / mount.source).resolve()


def listening_ports(service: Mapping[str, Any]) -> set[int]:
    """Container ports: `expose` plus the container side of `ports` ("127.0.0.1:9090:9090")."""
    ports = {int(str(p).split("/")[0]) for p in service.get("expose", [])}
    for port in service.get("ports", []):
        spec = str(port["target"]) if isinstance(port, dict) else str(port)
        ports.add(int(spec.split("/")[0].rsplit(":", 1)[-1]))
    return ports


def published_host_ports(service: Mapping[str, Any]) -> list[str]:
    return [str(p) for p in service.get("ports", [])]


def healthcheck_ports(service: Mapping[str, Any]) -> set[int]:
    """Ports a health check probes: URLs (host:port/), bash's /dev/tcp/host/port and
    pg_isready's `-p`."""
    test = service.get("healthcheck", {}).get("test", [])
    text = " ".join(test) if isinstance(test, list) else str(test)
    ports = {int(p) for p in re.findall(r"(?:127\.0\.0\.1|localhost)[:/](\d+)", text)}
    ports |= {int(p) for p in re.findall(r"(?:^|\s)-p\s+(\d+)", text)}
    return ports


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's substitution: the variable's value, else the default, else a placeholder."""

    def sub(match: re.Match[str]) -> str:
        name, kind, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        if env.get(name):
            return env[name]
        return arg if kind.endswith("-") else f"placeholder-{name.lower()}"

    return INTERPOLATION.sub(sub, value)


def interpolated_names(text: str) -> set[str]:
    return {m.group(1) for m in INTERPOLATION.finditer(text)}


def service_references(text: str, names: set[str]) -> Iterator[tuple[str, int]]:
    """(service, port) for every `service:port` in `text` whose host is a compose service."""
    for host, port in SERVICE_PORT.findall(text):
        if host in names:
            yield host, int(port)
