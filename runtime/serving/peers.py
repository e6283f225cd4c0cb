"""Replica base URLs from a list, or from a DNS name that answers one A record per replica
(compose's `runtime`, a Kubernetes headless Service): what `fastllm rollout` fans out to and
what each replica's rollout sync polls.

    replica_urls(["http://10.0.0.5:8000"], None)   -> ["http://10.0.0.5:8000"]
    replica_urls([], "runtime:8000")               -> ["http://172.18.0.4:8000", "http://172.18.0.7:8000"]
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from runtime.errors import ConfigError


def split_host_port(target: str) -> tuple[str, int]:
    """`runtime:8000` -> ("runtime", 8000); a missing or bad port is a ConfigError."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"expected NAME:PORT, got {target!r}", param="dns")
    return host, int(port)


def resolve(target: str) -> list[str]:
    """One `http://ip:port` per IPv4 address `NAME` resolves to now (sorted; [] when it does not
    resolve: the replicas may not be up yet)."""
    host, port = split_host_port(target)
    try:
        infos = socket.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({f"http://{info[4][0]}:{port}" for info in infos})


def replica_urls(urls: Sequence[str], dns: str | None) -> list[str]:
    """The listed URLs (trailing slashes dropped) plus those `dns` resolves to, without repeats."""
    found = [url.rstrip("/") for url in urls]
    if dns:
        found += resolve(dns)
    return list(dict.fromkeys(found))
