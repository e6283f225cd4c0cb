"""Tenants of the prefix cache: who may reuse whose cached prompt pages.

With `api_keys` configured each key is a tenant, named by its position (`key-1` is the first key
in the settings): the key itself never leaves runtime.server.auth's comparison, and no hash of it
is kept (a hash of a short key would be a guessable stand-in for it). A request's prefix-cache
salt (GenerationRequest.cache_salt) is its tenant's name, unless `prefix_cache_shared_across_keys`
is on, plus the body's optional `cache_salt` (vLLM's field): two requests share cached pages only
when both parts match, so tenant B neither reuses tenant A's pages nor learns from
`cached_tokens` or the time to first token that A sent a prompt. Without API keys there is one
tenant and only `cache_salt` separates requests.

`TenantCacheTally` is a stats sink that adds up prompt and cached tokens per tenant for the admin
token (GET /admin/prefix-cache): each tenant sees nothing of the others, the operator sees all.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.engine.stats import RequestStats, StepStats, VerificationResult
from runtime.server.auth import key_index

OPEN_TENANT = "open"  # the one tenant of a server without API keys
MAX_PENDING = 65_536  # requests awaiting their stats; older entries are dropped (bounded memory)


def tenant_of(authorization: str | None, api_keys: Sequence[str]) -> str | None:
    """`key-<n>` for the n-th configured key this header carries; None without API keys (or for
    a header that matches none: the auth dependency has refused such a request already)."""
    if not api_keys:
        return None
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret:
        return None
    index = key_index(secret, api_keys)  # every key compared, in constant time each
    return None if index is None else f"key-{index + 1}"


def prefix_salt(tenant: str | None, cache_salt: str | None, *, shared: bool) -> str:
    """The engine's cache salt: "" (the shared namespace) only when neither part applies. JSON
    keeps the two parts apart, so no `cache_salt` can spell another tenant's namespace."""
    tenant_part = None if shared else tenant
    if tenant_part is None and not cache_salt:
        return ""
    return json.dumps([tenant_part, cache_salt or ""])


@dataclass(frozen=True)
class TenantCacheRow:
    tenant: str  # key-<n>, or "open" without API keys
    requests: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class TenantCacheTally:
    """A StatsSink: `expect(request_id, tenant)` before submit; the request's finished stats then
    count for that tenant."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, str] = OrderedDict()
        self._totals: dict[str, list[int]] = {}  # tenant -> [requests, prompt, cached]
        self._lock = threading.Lock()

    def expect(self, request_id: str, tenant: str | None) -> None:
        with self._lock:
            self._pending[request_id] = tenant or OPEN_TENANT
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        if not finished:
            return
        with self._lock:
            for stats in finished:
                tenant = self._pending.pop(stats.request_id, None)
                if tenant is None:
                    continue
                totals = self._totals.setdefault(tenant, [0, 0, 0])
                totals[0] += 1
                totals[1] += stats.prompt_tokens
                totals[2] += stats.cached_tokens

    def rows(self) -> list[TenantCacheRow]:
        with self._lock:
            return [
                TenantCacheRow(tenant, *totals) for tenant, totals in sorted(self._totals.items())
            ]

    @property
    def num_pending(self) -> int:
        return len(self._pending)
