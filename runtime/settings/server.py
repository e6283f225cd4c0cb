"""Settings of the HTTP server: listening, API keys and admin token, body and connection limits,
drain, the status page's queries, rollout peers, the offload pool, chat template sandboxes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator


class ServerSettings(BaseModel):
    # --- server ------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list, description="empty = open")
    admin_token: str | None = Field(None, description="admin endpoints are refused when unset")
    # with api_keys, each key's cached prompt pages are its own (runtime.server.openai.tenancy); on:
    # every key reuses every other's, and learns from cached_tokens what the others sent
    prefix_cache_shared_across_keys: bool = Field(
        False, description="API keys share one prefix cache (default: isolated per key)"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024)
    # a body not received in full within this is answered 408 and its connection closed, so a
    # slow or stalled client cannot hold a worker or the drain
    body_read_timeout_s: float = Field(15.0, gt=0.0)
    drain_grace_s: float = Field(30.0, ge=0.0)
    # after SIGTERM, /ready answers 503 this long while new requests are still served, so a load
    # balancer's health check takes the replica out before it refuses work (compose's HAProxy);
    # 0 under Kubernetes, where the preStop hook gives the Service that time
    drain_unready_s: float = Field(0.0, ge=0.0)
    # connections (runtime.server.edge.connections): a request head longer than this is a 431;
    # one not complete this long after its first byte (or the connection's opening) closes it; an
    # idle kept-alive connection is closed after keep_alive_timeout_s; past max_connections a new
    # connection gets a 503 and is closed
    max_header_bytes: int = Field(32 << 10, ge=1024, le=16 << 20)
    header_read_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    keep_alive_timeout_s: float = Field(5.0, gt=0.0, le=3600.0)
    max_connections: int = Field(512, ge=1)
    # the status page's query API (runtime.server.status.query_runner): Prometheus'
    # query.timeout and query.max-samples, a response-size bound and the queries evaluated at once
    query_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    query_max_samples: int = Field(500_000, ge=1000)
    query_max_response_bytes: int = Field(16 << 20, ge=1 << 16)
    query_max_concurrency: int = Field(4, ge=1, le=64)
    # other replicas' admin URLs (or a DNS name:port answering one A record per replica): an
    # automatic rollback or any newer rollout event on one replica is adopted by the others
    rollout_peers: list[str] = Field(default_factory=list)
    rollout_peers_dns: str | None = Field(None, description="e.g. runtime:8000 (compose)")
    rollout_sync_interval_s: float = Field(1.0, gt=0, description="peer rollout poll period")
    access_log: bool = Field(True, description="uvicorn's one line per request at INFO")
    # which parts the server wires around the engines (tests and benchmarks switch them off)
    metrics_enabled: bool = True
    tracing_enabled: bool = True
    storage_enabled: bool = True

    # --- heavy work off the event loop (runtime.server.offload, runtime.server.prompts) --------
    # threads rendering chat templates, tokenizing long prompts and serialising large responses
    offload_workers: int = Field(4, ge=1, le=64)
    # a non-streamed completion whose largest possible response (choices × tokens × logprobs
    # alternatives) passes this is a 400 before it runs
    max_response_bytes: int = Field(64 << 20, ge=1 << 16)

    # --- checkpoint chat templates (runtime.models.template_sandbox) ---------------------------
    chat_template_timeout_s: float = Field(1.0, gt=0.0, le=60.0, description="per render")
    chat_template_max_output_chars: int = Field(4 << 20, ge=1 << 10)
    chat_template_max_memory_bytes: int = Field(512 << 20, ge=64 << 20, description="per worker")
    chat_template_workers: int = Field(2, ge=1, le=64, description="renders at once")

    @field_validator("api_keys", "rollout_peers", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value
