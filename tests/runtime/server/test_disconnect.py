"""Clients that drop mid-stream: their requests are cancelled and their KV blocks released."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.runtime.engine.support import RecordingSink
from tests.runtime.server.live import API_KEY, LiveServer

NUM_CLIENTS = 20


async def _drop_after_two_events(client: httpx.AsyncClient, url: str) -> str:
    # ignore_eos: a random-weight model may draw end-of-text early; the stream must still be going
    body = {
        "model": "llama",
        "prompt": "tell me a long story",
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        events = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
            if len(events) == 2:
                break
    # leaving the block closes the connection with the stream unfinished
    return str(events[0]["id"])


async def _run_clients(url: str) -> list[str]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=NUM_CLIENTS)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(_drop_after_two_events(client, url) for _ in range(20)))


def test_dropped_streams_are_cancelled_and_free_their_kv(served: LiveServer) -> None:
    sink = RecordingSink()
    served.state.stats.add(sink)
    engine = served.state.router.pick("llama").engine
    request_ids = set(asyncio.run(_run_clients(f"{served.url}/v1/completions")))
    assert len(request_ids) == NUM_CLIENTS

    deadline = time.monotonic() + 60
    while not request_ids <= set(sink.by_id()):
        assert time.monotonic() < deadline, "cancelled requests were never reported"
        time.sleep(0.05)
    records = sink.by_id()
    assert {records[rid].finished_reason for rid in request_ids} == {"cancelled"}
    # far fewer than the 1500 tokens each asked for: they stopped when the clients left
    assert all(records[rid].completion_tokens < 1500 for rid in request_ids)
    assert engine.num_running == 0 and engine.num_waiting == 0
    owners = {block.owner for block in engine.leak_report()}
    assert not owners & request_ids, f"KV still held by {owners & request_ids}"
