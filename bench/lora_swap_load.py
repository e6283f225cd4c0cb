"""Streams on a server's adapters while another adapter is loaded and unloaded: the load that
bench.lora_hot_swap runs at the issue's size and tests/runtime/lora/test_hot_swap.py at a CPU
test's.

    plan = SwapPlan(streams=16, cycles=50)
    result = run_swap_load(url, plan, prompts, expected, hot_sources, headers, admin_headers)

Each stream sends greedy completions (rotating over `prompts`' models: the base and its
adapters) until the cycles are done and it has sent `min_requests`; each answer must be the text
that model gives the prompt served alone (`expected`). Meanwhile each cycle loads the adapter
`hot` from the next of `hot_sources` (the directory of one of the streams' adapters), sends it
that adapter's prompt, and unloads it. A fresh `hot` must find none of its prompt cached
(`cached_tokens` 0: its pages are keyed by the adapter's load, never shared with the streams'
adapters or its own earlier loads) and must answer that adapter's alone text.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

HOT = "hot"


@dataclass(frozen=True)
class SwapPlan:
    streams: int = 16
    cycles: int = 50
    min_requests: int = 4  # per stream, whatever the cycles take
    max_tokens: int = 6


@dataclass
class SwapResult:
    requests_ok: int = 0  # every call: the streams' completions, hot's load, query, unload
    requests_failed: int = 0  # any non-200 answer
    status_5xx: int = 0
    stream_requests: int = 0  # the streams' completions among them
    cycles: int = 0
    mismatched_requests: int = 0  # 200 answers whose text differs from serving alone
    mismatched_streams: set[int] = field(default_factory=set)  # streams with such an answer
    hot_mismatched: int = 0  # hot's answers that differ from its source adapter's alone text
    hot_cached_tokens: int = 0  # prompt tokens a freshly loaded `hot` found cached (must be 0)
    hot_bytes: int = 0  # what the last load answered as the adapter's resident bytes
    problems: list[str] = field(default_factory=list)  # the first few, for the report
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, what: str, response: httpx.Response, stream: int = -1) -> None:
        with self._lock:
            self.stream_requests += stream >= 0
            if response.status_code == 200:
                self.requests_ok += 1
                return
            self.requests_failed += 1
            self.status_5xx += response.status_code >= 500
            self._note(f"{what}: {response.status_code} {response.text[:200]}")

    def mismatch(self, what: str, text: str, stream: int = -1) -> None:
        """`stream` -1: the hot adapter's answer."""
        with self._lock:
            self.mismatched_requests += 1
            if stream >= 0:
                self.mismatched_streams.add(stream)
            else:
                self.hot_mismatched += 1
            self._note(f"{what}: got {text!r}")

    def _note(self, problem: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(problem)

    @property
    def clean(self) -> bool:
        return not (self.requests_failed or self.mismatched_requests or self.hot_cached_tokens)


def _completion(model: str, prompt: Sequence[int], plan: SwapPlan) -> dict[str, Any]:
    return {"model": model, "prompt": list(prompt), "max_tokens": plan.max_tokens,
            "temperature": 0, "ignore_eos": True}  # fmt: skip


def run_swap_load(
    url: str,
    plan: SwapPlan,
    prompts: Mapping[str, Sequence[int]],
    expected: Mapping[str, str],
    hot_sources: Sequence[tuple[str, str]],
    headers: Mapping[str, str] | None = None,
    admin_headers: Mapping[str, str] | None = None,
) -> SwapResult:
    """`prompts` and `expected`: model name -> prompt ids / alone text; `hot_sources`: (adapter
    name, its directory) pairs the hot adapter is loaded from in turn."""
    result, done = SwapResult(), threading.Event()
    models = list(prompts)

    def stream(worker: int) -> None:
        with httpx.Client(base_url=f"{url}/v1", headers=headers, timeout=120) as client:
            i = 0
            while i < plan.min_requests or not done.is_set():
                model = models[(worker + i) % len(models)]
                i += 1
                body = _completion(model, prompts[model], plan)
                response = client.post("/completions", json=body)
                result.record(model, response, worker)
                if response.status_code != 200:
                    continue
                text = response.json()["choices"][0]["text"]
                if text != expected[model]:
                    result.mismatch(f"stream {worker} {model}", text, worker)

    workers = [threading.Thread(target=stream, args=(w,)) for w in range(plan.streams)]
    for w in workers:
        w.start()
    try:
        with httpx.Client(base_url=f"{url}/v1", headers=admin_headers, timeout=120) as admin:
            for cycle in range(plan.cycles):
                source = hot_sources[cycle % len(hot_sources)]
                _cycle(admin, result, plan, prompts, expected, source)
                result.cycles += 1
    finally:
        done.set()
        for w in workers:
            w.join(300)
    return result


def _cycle(
    admin: httpx.Client,
    result: SwapResult,
    plan: SwapPlan,
    prompts: Mapping[str, Sequence[int]],
    expected: Mapping[str, str],
    source: tuple[str, str],
) -> None:
    name, path = source
    loaded = admin.post("/load_lora_adapter", json={"lora_name": HOT, "lora_path": path})
    result.record(f"load {HOT} from {name}", loaded)
    if loaded.status_code == 200:
        result.hot_bytes = int(loaded.json().get("bytes", 0))
        hot = admin.post("/completions", json=_completion(HOT, prompts[name], plan))
        result.record(f"{HOT} ({name})", hot)
        if hot.status_code == 200:
            body = hot.json()
            details = body["usage"].get("prompt_tokens_details") or {}
            result.hot_cached_tokens += int(details.get("cached_tokens") or 0)
            if body["choices"][0]["text"] != expected[name]:
                result.mismatch(f"{HOT} ({name})", body["choices"][0]["text"])
    result.record(f"unload {HOT}", admin.post("/unload_lora_adapter", json={"lora_name": HOT}))
