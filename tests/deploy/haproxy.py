"""The shipped HAProxy config (deploy/haproxy/haproxy.cfg) rendered for static loopback addresses,
and a real `haproxy` running it.

`render_static` changes only what compose's network provides: the `server-template` (DNS
discovery of `runtime`) becomes one `server` line per address, and the `bind` lines move to
loopback ports. Everything else (balancing, health checks, retries, timeouts) is the shipped file's,
so the live tests exercise the config compose runs.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import require_binary
from tests.deploy.stack import REPO
from tests.fixtures.ready import free_port, wait_ready

CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
API_PORT, METRICS_PORT = 8000, 8404  # what the shipped file binds (compose publishes/scrapes)
TEMPLATE = re.compile(r"^(\s*)server-template\s+(\S+)\s+\S+\s+(\S+):(\d+)\b.*$", re.M)


def sections(text: str) -> dict[str, list[str]]:
    """`frontend api` -> its directive lines (comments and blank lines dropped)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        bare = line.split("#", 1)[0].rstrip()
        if not bare.strip():
            continue
        if not bare[0].isspace():
            current = " ".join(bare.split())
            found[current] = []
        elif current is not None:
            found[current].append(" ".join(bare.split()))
    return found


def render_static(text: str, *, servers: list[str], api_port: int, metrics_port: int) -> str:
    """The config with static `server` lines for `servers` ("127.0.0.1:PORT") and loopback binds."""
    templates = TEMPLATE.findall(text)
    assert len(templates) == 1, "expected exactly one server-template in the shipped config"
    indent, name, _host, _port = templates[0]
    static = "\n".join(f"{indent}server {name}{i} {addr}" for i, addr in enumerate(servers, 1))
    text = TEMPLATE.sub(lambda _: static, text)
    for shipped, port in ((API_PORT, api_port), (METRICS_PORT, metrics_port)):
        text, count = re.subn(
            rf"^(\s*)bind :{shipped}\s*$", rf"\1bind 127.0.0.1:{port}", text, flags=re.M
        )
        assert count == 1, f"expected one `bind :{shipped}` in the shipped config"
    return text


@dataclass
class HAProxy:
    process: subprocess.Popen[bytes]
    api_url: str
    metrics_url: str
    log_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def start_haproxy(workdir: Path, servers: list[str]) -> HAProxy:
    binary = require_binary("haproxy", "/usr/sbin/haproxy")
    for _attempt in range(3):  # a free port can be taken between probe and bind
        api_port, metrics_port = free_port(), free_port()
        config = workdir / "haproxy.cfg"
        config.write_text(
            render_static(
                CONFIG.read_text(), servers=servers, api_port=api_port, metrics_port=metrics_port
            )
        )
        log_path = workdir / "haproxy.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        proxy = HAProxy(
            process,
            f"http://127.0.0.1:{api_port}",
            f"http://127.0.0.1:{metrics_port}",
            log_path,
        )
        if wait_ready(f"{proxy.metrics_url}/healthz", process, 20.0):
            return proxy
        proxy.stop()
    raise RuntimeError(f"haproxy did not start: {proxy.log()}")
