"""Real `fastllm serve` processes on loopback (the demo llama), started together, each with its own
port and log; their metrics read straight from each replica (not through the proxy)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.ready import fastllm_command, free_port, wait_ready

MODEL = "llama-tiny"


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    # one client for every metric read: the tests poll /metrics every 10-50 ms, and `httpx.get`
    # builds a client and its SSL context per call (~28 ms of CPU: a polling loop was a busy one)
    _client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5), repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples `name` whose labels include `labels`, from this replica's /metrics."""
        text = self._client.get(f"{self.url}/metrics").text
        want = set(labels.items())
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and want <= set(s.labels.items())
        )

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def stop(self) -> None:
        if self.is_running:
            self.process.kill()
        self.process.wait(30)
        self._client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def start_replicas(
    count: int, model_dir: Path, workdir: Path, env: Mapping[str, str] = {}
) -> list[Replica]:
    """`count` servers of `model_dir` (served as MODEL); returns once every one is ready."""
    model = workdir / MODEL
    if not model.exists():
        model.symlink_to(model_dir, target_is_directory=True)
    base_env = {
        **os.environ,
        "FASTLLM_STORAGE_ENABLED": "false",
        "FASTLLM_ALERTS_ENABLED": "false",
        "FASTLLM_TRACING_ENABLED": "false",
        "FASTLLM_VERIFY_SAMPLE_RATE": "0",
        "FASTLLM_DEVICE": "cpu",
        **env,
    }
    replicas = []
    for i in range(count):
        port = free_port()
        log_path = workdir / f"replica{i}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*fastllm_command(), "serve", "--model", str(model), "--port", str(port)],
                env=base_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        replicas.append(Replica(process, port, log_path))
    try:
        for replica in replicas:
            if not wait_ready(f"{replica.url}/ready", replica.process, 120.0):
                raise AssertionError(f"replica {replica.url} never became ready: {replica.log()}")
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    return replicas
