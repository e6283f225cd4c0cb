"""The status page's HTTP side on a live server (the demo llama, the embedded evaluator): the page
and its files, read-only routes, who sees what, and a query API shaped like Prometheus' own (the
same requests sent to a real Prometheus give the same answers)."""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from runtime.server import create_app
from runtime.server.status.routes import STATIC_FILES
from runtime.server.wiring import build_state
from tests.fixtures.prometheus import PromHandle
from tests.runtime.server.live import ADMIN_TOKEN, API_KEY, LiveServer, light_settings

ROOT = Path(__file__).parents[3]
STATIC = ROOT / "runtime" / "server" / "status" / "static"


@pytest.fixture(scope="module")
def server(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    settings = light_settings(
        model_path=demo_model_dir("llama"),
        model_name="llama",
        alerts_enabled=True,
        alerts_interval_s=3600.0,  # one round at start; the tests tick it themselves
        debug_leak_blocks_per_request=2,  # owners the admin can see
    )
    live = LiveServer(build_state(settings)).start()
    try:
        reply = httpx.post(
            f"{live.url}/v1/completions",
            json={"model": "llama", "prompt": "hi", "max_tokens": 2},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        # request stats reach the metrics one engine-loop turn after the response: wait for the
        # counter, so that the round below samples it
        deadline = time.monotonic() + 30
        while not re.search(r"^fastllm_request_success_total\{.*\} [1-9]", _metrics(live), re.M):
            assert time.monotonic() < deadline, "the request never reached the metrics"
            time.sleep(0.05)
        live.state.alerts.tick()  # a round with the request's counters in the store
        yield live
    finally:
        live.stop()


def _metrics(server: LiveServer) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=30).text


def _get(
    server: LiveServer, path: str, token: str | None = API_KEY, **params: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}{path}", params=params, headers=headers, timeout=30)


def test_the_page_and_its_files_are_served_from_the_package_without_cdns(
    server: LiveServer,
) -> None:
    page = _get(server, "/", token=None)  # the HTML holds no data: served without a key
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    links = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert links and all(link.startswith(("/", "#", "data:")) for link in links), links
    imported: set[str] = set()
    for name in STATIC_FILES:
        reply = _get(server, f"/status/static/{name}", token=None)
        assert reply.status_code == 200, name
        assert reply.headers["x-content-type-options"] == "nosniff"
        text = reply.text.replace('"http://www.w3.org/2000/svg"', "")  # a namespace, not a load
        assert not re.search(r"(?:https?:)?//[\w-]+(?:\.[\w-]+)+", text), name  # no hosts
        imported |= set(re.findall(r'from "\./([\w.]+)"', reply.text))
    assert imported <= set(STATIC_FILES)  # every module the page imports is served
    assert {p.name for p in STATIC.iterdir()} == {*STATIC_FILES, "status.html"}
    for bad in ("app.py", "..%2Fapp.py", "status.html.bak"):
        missing = _get(server, f"/status/static/{bad}", token=None)
        assert missing.status_code == 404 and missing.json()["error"]["message"], bad


@pytest.mark.parametrize(
    "path", ["/", "/status/api/summary", "/api/v1/query", "/status/api/panels"]
)
def test_everything_is_read_only(server: LiveServer, path: str) -> None:
    for method in ("POST", "PUT", "DELETE"):
        reply = httpx.request(method, f"{server.url}{path}", timeout=30)
        assert reply.status_code == 405, (method, path)
        assert reply.json()["error"]["type"] == "invalid_request_error"


def test_api_keys_gate_the_data_and_the_admin_token_shows_owners(server: LiveServer) -> None:
    for path in ("/status/api/summary", "/status/api/panels", "/api/v1/query"):
        refused = _get(server, path, token=None, query="up")
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert _get(server, path, token="wrong", query="up").status_code == 401
    viewer = _get(server, "/status/api/summary").json()
    assert viewer["is_admin"] is False
    assert [m["owners"] for m in viewer["server"]["memory"]] == [None]  # totals only
    assert viewer["server"]["memory"][0]["bytes_in_use"] > 0
    admin = _get(server, "/status/api/summary", token=ADMIN_TOKEN).json()
    assert admin["is_admin"] is True
    owners = admin["server"]["memory"][0]["owners"]
    assert owners and all(o["reserved_bytes"] > 0 and o["num_blocks"] > 0 for o in owners)


def test_summary_says_what_is_served_and_what_alerts_say(server: LiveServer) -> None:
    body = _get(server, "/status/api/summary").json()
    [version] = body["server"]["versions"]
    assert version["model"] == "llama" and version["version"] == "stable"
    assert version["canary_weight"] == 1.0 and version["batch_size_limit"] >= 1
    assert (version["min_util"], version["max_util"]) == (0.6, 0.8)
    assert body["server"]["device"] == "cpu" and body["server"]["uptime_s"] > 0
    rules = {r["name"]: r["state"] for r in body["alerts"]["rules"]}
    shipped = {
        line.split(":", 1)[1].strip()
        for path in (Path(__file__).resolve().parents[3] / "alerts" / "rules").glob("*.yml")
        for line in path.read_text().splitlines()
        if line.strip().startswith("- alert:")
    }
    assert set(rules) == shipped and set(rules.values()) <= {"inactive", "pending", "firing"}
    assert body["audit"] == {
        "available": False,
        "reason": "storage is off (storage_enabled=false): no inference_log",
        "threshold": None,
        "since": None,
        "num_anomalies": 0,
        "per_op": [],
        "worst": None,
        "models": [],
        "instance": None,
        "per_row": True,
    }


def test_queries_read_the_evaluators_store(server: LiveServer) -> None:
    up = _get(server, "/api/v1/query", query="up").json()
    assert up["status"] == "success" and up["data"]["resultType"] == "vector"
    [sample] = up["data"]["result"]
    assert sample["metric"]["job"] == "fastllm" and sample["value"][1] == "1"
    served = _get(server, "/api/v1/query", query="sum(fastllm_request_success_total)").json()
    assert float(served["data"]["result"][0]["value"][1]) >= 1  # the fixture's request
    t = server.state.alerts.settled_ts
    matrix = _get(server, "/api/v1/query_range", query="up", start=t - 10, end=t, step=5).json()
    assert matrix["data"]["resultType"] == "matrix"
    assert [v[1] for v in matrix["data"]["result"][0]["values"]][-1] == "1"


@pytest.mark.parametrize(
    ("params", "status", "error_type", "message"),
    [
        ({}, 400, "bad_data", 'missing parameter "query"'),
        ({"query": "sum(up"}, 400, "bad_data", "parse error"),
        ({"query": "up[5m]"}, 400, "bad_data", "invalid expression type"),
        ({"query": "quantile_over_time(0.5, up[1m])"}, 400, "bad_data", "not supported"),
        ({"query": "up", "time": "yesterday"}, 400, "bad_data", "cannot parse"),
        # on(): every memory type matches every other: many-to-many, an execution error
        ({"query": "fastllm_memory_usage / on() fastllm_memory_total"}, 422, "execution", "many"),
    ],
)
def test_bad_queries_get_prometheus_errors(
    server: LiveServer,
    params: dict[str, str],
    status: int,
    error_type: str | None,
    message: str | None,
) -> None:
    reply = _get(server, "/api/v1/query", **params)
    assert reply.status_code == status, reply.text
    if error_type is not None:
        body = reply.json()
        assert body["status"] == "error" and body["errorType"] == error_type
        assert message is not None and message in body["error"]


def test_without_the_evaluator_queries_are_unavailable(
    demo_model_dir: Callable[[str], Path],
) -> None:
    settings = light_settings(model_path=demo_model_dir("llama"), alerts_enabled=False, api_keys=[])
    client = TestClient(create_app(settings))  # no lifespan: nothing loads
    reply = client.get("/api/v1/query", params={"query": "up"})
    assert reply.status_code == 503 and reply.json()["errorType"] == "unavailable"
    panels = client.get("/status/api/panels").json()
    assert panels["store"] == {
        "available": False,
        "reason": "the embedded evaluator is off (alerts_enabled=false): no samples to query",
    }


REFERENCE_QUERIES = [
    ("query", {"query": "vector(1)", "time": "1000"}),
    ("query", {"query": "1 + 1", "time": "1000.5"}),
    ("query", {"query": "time() / 4", "time": "2021-01-01T00:00:10Z"}),
    ("query_range", {"query": "vector(2) * 0.5", "start": "1000", "end": "1060", "step": "15"}),
    ("query_range", {"query": "time()", "start": "1000", "end": "1001", "step": "0.25"}),
    (
        "query_range",
        {"query": "count(absent_here) or vector(0)", "start": "10", "end": "70", "step": "1m"},
    ),
]
REFERENCE_ERRORS = [
    ("query", {"query": "sum("}),
    ("query", {}),
    ("query_range", {"query": "up", "start": "10", "end": "5", "step": "1"}),
    ("query_range", {"query": "up", "start": "0", "end": "10", "step": "0"}),
    ("query_range", {"query": "up", "start": "0", "end": "20000", "step": "1"}),
    ("query_range", {"query": "up", "start": "0", "end": "10"}),
]


def test_answers_match_a_real_prometheus(
    server: LiveServer, prometheus_server: Callable[..., PromHandle]
) -> None:
    prom = prometheus_server([])
    for path, params in REFERENCE_QUERIES:
        want = httpx.get(f"{prom.url}/api/v1/{path}", params=params, timeout=30)
        got = _get(server, f"/api/v1/{path}", **params)
        assert want.status_code == got.status_code == 200, (params, want.text)
        assert got.json() == want.json(), params
    for path, params in REFERENCE_ERRORS:
        want = httpx.get(f"{prom.url}/api/v1/{path}", params=params, timeout=30)
        got = _get(server, f"/api/v1/{path}", **params)
        assert got.status_code == want.status_code, (params, want.text, got.text)
        assert {k: got.json()[k] for k in ("status", "errorType")} == {
            k: want.json()[k] for k in ("status", "errorType")
        }, params


def test_the_package_ships_every_static_file() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    line = re.search(r'^"runtime\.server\.status" = \[(.*)\]$', text, flags=re.M)
    assert line is not None, "no package-data for runtime.server.status"
    patterns = re.findall(r'"([^"]+)"', line.group(1))
    for path in STATIC.iterdir():
        assert any(fnmatch.fnmatch(f"static/{path.name}", p) for p in patterns), path.name
