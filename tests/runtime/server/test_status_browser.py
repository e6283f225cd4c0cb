"""The status page at `/` in a real browser (headless Debian Chromium through Selenium), against
one live runtime (the demo llama, the real engine, SQLite storage, the embedded evaluator at a
compressed time scale) under a steady load with two faults injected:

- a debug block leak (`debug_leak_blocks_per_request`): FastllmMemoryGrowth must turn pending,
  then firing, on the page;
- the SwiGLU kernel corrupting a fraction of its outputs (as in the verification tests), with
  every other request verified: swiglu must show anomalies in the page's audit table.

Sizing (see tests/integration/test_alerts_embedded.py): at scale 0.01 the rule's windows are
18 s and its `for:` 6 s; the 24 h horizon is 864 s, so a leak must beat 16 MiB / 864 s ~ 19 KB/s;
64 blocks of 4 KiB per request at >= 1 request/s is more than 10x that.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from base64 import b64decode
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.models import ops
from runtime.server.status import page as status_page
from runtime.server.wiring import build_state
from tests.fixtures.browser import console_errors
from tests.integration.support import MODEL, runtime_settings
from tests.runtime.server.live import ADMIN_TOKEN, LiveServer
from tests.runtime.verify.support import corrupting

REFRESH_S = 0.5
TIME_SCALE = 0.01
ALERT = "FastllmMemoryGrowth"
DOCS_SHOT = Path(__file__).parents[3] / "docs" / "status-page.png"
UNSUPPORTED = {  # a dashboard panel outside the embedded PromQL subset
    "title": "zz / test",
    "uid": "zz-test",
    "templating": {"list": []},
    "panels": [
        {
            "id": 1,
            "type": "timeseries",
            "title": "Batch limit p90 over time",
            "gridPos": {"h": 6, "w": 12, "x": 0, "y": 0},
            "datasource": {"type": "prometheus", "uid": "prometheus"},
            "targets": [
                {
                    "refId": "A",
                    "expr": "quantile_over_time(0.9, fastllm_batch_size_limit[5m])",
                    "datasource": {"type": "prometheus", "uid": "prometheus"},
                }
            ],
        }
    ],
}


@dataclass
class Load:
    """Two clients: completions, every fifth one invalid (a validation failure), every fourth
    one structured (a new grammar to compile or a cached one: the grammar panels' data)."""

    url: str
    num_sent: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                bad = i % 5 == 0
                body: dict[str, Any] = {
                    "model": MODEL,
                    "prompt": f"status {k} {i}",
                    "max_tokens": -1 if bad else 6,
                }
                if i % 4 == 2:
                    body["guided_choice"] = ["yes", "no", f"{k}-{i}" if i % 8 == 2 else "maybe"]
                reply = client.post("/v1/completions", json=body)
                self.num_sent += 1
                if reply.status_code != (400 if bad else 200):
                    self.errors.append(f"{reply.status_code}: {reply.text[:200]}")

    def start(self) -> Load:
        if any(t.is_alive() for t in self._threads):  # the first test that needs traffic starts it
            return self
        self._stop.clear()  # again after a stop: a later test wants fresh rates on the page
        self._threads = []
        for k in range(2):
            thread = threading.Thread(target=self._client, args=(k,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@dataclass
class Stack:
    server: LiveServer
    load: Load

    @property
    def page_url(self) -> str:
        return f"{self.server.url}/?refresh={REFRESH_S}"


@pytest.fixture(scope="module")
def stack(
    demo_model_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    boards = tmp_path_factory.mktemp("dashboards")
    for path in status_page.DASHBOARDS_DIR.glob("*.json"):
        shutil.copy(path, boards)
    (boards / "zz_test.json").write_text(json.dumps(UNSUPPORTED))
    patch = pytest.MonkeyPatch()
    patch.setattr(status_page, "DASHBOARDS_DIR", boards)
    # every verified request runs the broken kernel; the reference path does not
    patch.setattr(ops, "swiglu", corrupting(ops.swiglu, fraction=0.05))
    settings = runtime_settings(
        demo_model_dir("llama"),
        storage_enabled=True,
        database_url=f"sqlite:///{tmp_path_factory.mktemp('db') / 'status.db'}",
        alerts_enabled=True,
        alerts_interval_s=0.5,
        alerts_time_scale=TIME_SCALE,
        kv_cache_bytes=16 << 20,
        debug_leak_blocks_per_request=64,
        verify_sample_rate=0.5,
        admin_token=ADMIN_TOKEN,
        max_num_seqs=8,
    )
    server = LiveServer(build_state(settings))
    load = Load(server.url)
    try:
        server.start()
        yield Stack(server, load)
    finally:
        load.stop()
        server.stop()
        patch.undo()


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def screenshot(driver: Any, path: Path, max_height: int | None = None) -> Path:
    """The whole page (or its top `max_height` pixels), not only the viewport (Chrome
    DevTools' beyond-viewport capture)."""
    size = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    )
    size[1] = min(size[1], max_height or size[1])
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
        },
    )
    path.write_bytes(b64decode(shot["data"]))
    assert path.stat().st_size > 10_000
    return path


PANEL_STATES = """return [...document.querySelectorAll('article.panel')].map(e => ({
    key: e.dataset.key, kind: e.dataset.kind, state: e.dataset.state,
    title: e.querySelector('h3').textContent, status: e.querySelector('.status').textContent,
    marks: e.querySelectorAll('svg path.series, svg circle, svg rect[fill]').length,
    values: [...e.querySelectorAll('[data-value]')].map(v => Number(v.dataset.value))}))"""


def test_every_panel_draws_and_the_leak_turns_the_alert_pending_then_firing(
    stack: Stack, browser: Callable[[int, int], Any], tmp_path: Path
) -> None:
    driver = browser(1280, 800)
    driver.get(stack.page_url)
    wait_for(lambda: driver.execute_script("return document.body.dataset.facts"), "the page")
    stack.load.start()  # the leak starts now, with the page watching
    seen: list[str] = []

    def alert_state() -> bool:
        found = driver.execute_script(
            f"return [...document.querySelectorAll('li.alert[data-alert=\"{ALERT}\"]')]"
            ".map(e => e.dataset.state)"
        )
        state = "firing" if "firing" in found else (found[0] if found else "inactive")
        if not seen or seen[-1] != state:
            seen.append(state)
        return state == "firing"

    wait_for(alert_state, f"{ALERT} firing on the page", timeout_s=90)
    assert "pending" in seen and seen.index("pending") < seen.index("firing"), seen

    # the page's change list (newest first, the last few) has the firing, after the pending;
    # waited for: the alert list above may show another type's firing a refresh before it
    def allocator_changes() -> list[Any] | None:
        changes = driver.execute_script(
            f"return [...document.querySelectorAll('ul.changes li[data-alert=\"{ALERT}\"]')]"
            ".map(e => [e.dataset.state, Number(e.dataset.ts), e.textContent])"
        )
        drawn = [c for c in changes if "type=allocator" in c[2]]
        return changes if any(c[0] == "firing" for c in drawn) else None

    changes = wait_for(allocator_changes, "the allocator's firing in the change list", 30)
    mine = [(state, ts) for state, ts, text in changes if "type=allocator" in text]
    fired = [ts for state, ts in mine if state == "firing"]
    pending = [ts for state, ts in mine if state == "pending"]
    assert fired and (not pending or min(pending) < min(fired)), changes
    badge = driver.find_element("css selector", f'[data-key="memory-2"] [data-alert="{ALERT}"]')
    assert badge.get_attribute("data-state") == "firing"

    def drawn(p: dict[str, Any]) -> bool:
        if p["kind"] in ("timeseries", "state-timeline"):
            return p["marks"] > 0
        return bool(p["values"]) if p["kind"] in ("stat", "bargauge") else True

    # waited for drawn marks too, not only "ok": a quantile panel's query can answer series of
    # NaN only (no request ended in its rate window, seen once under the full suite's load:
    # "Queue wait" blank), and the next refresh draws it
    def all_drawn() -> list[dict[str, Any]] | None:
        panels = driver.execute_script(PANEL_STATES)
        promql = [p for p in panels if p["state"] not in ("sql", "unsupported")]
        return panels if all(p["state"] == "ok" and drawn(p) for p in promql) else None

    panels = wait_for(all_drawn, "every PromQL panel drawn with data", timeout_s=60)
    for p in panels:
        if p["state"] == "ok" and p["kind"] in ("timeseries", "state-timeline"):
            assert p["marks"] > 0, p  # a line, a point or a state band: drawn, not blank
        if p["state"] == "ok" and p["kind"] in ("stat", "bargauge"):
            assert p["values"], p
    sql = [p for p in panels if p["state"] == "sql"]
    assert len(sql) == 3 and all("PostgreSQL" in p["status"] for p in sql)
    [odd] = [p for p in panels if p["state"] == "unsupported"]
    assert odd["title"] == "Batch limit p90 over time" and "quantile_over_time" in odd["status"]
    assert "outside the embedded PromQL subset" in odd["status"]
    assert console_errors(driver) == []
    screenshot(driver, tmp_path / "status-desktop.png")
    screenshot(driver, tmp_path / "status-top.png", max_height=1500)
    if os.environ.get("FASTLLM_UPDATE_DOCS_SHOT") == "1":  # the README's picture, under load
        shutil.copy(tmp_path / "status-top.png", DOCS_SHOT)
    assert stack.load.errors == []


def _metrics_totals(url: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("model") == MODEL:
                totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


def test_numbers_match_metrics_anomalies_show_and_the_admin_sees_owners(
    stack: Stack, browser: Callable[[int, int], Any], tmp_path: Path
) -> None:
    stack.load.start()
    wait_for(lambda: stack.load.num_sent >= 20, "some traffic")
    stack.load.stop()  # quiet: the counters stand still and the page catches up with them
    driver = browser(1280, 800)
    driver.get(stack.page_url)
    totals = _metrics_totals(stack.server.url)
    wanted = {
        "Requests succeeded": totals["fastllm_request_success_total"],
        "Requests failed": totals["fastllm_request_failure_total"],
        "Prompt tokens": totals["fastllm_prompt_tokens_total"],
        "Generated tokens": totals["fastllm_generation_tokens_total"],
    }
    assert wanted["Requests succeeded"] > 0 and wanted["Requests failed"] > 0

    def shown() -> dict[str, float] | None:
        panels = {p["title"]: p["values"] for p in driver.execute_script(PANEL_STATES)}
        values = {title: panels.get(title) for title in wanted}
        return values if values == {k: [v] for k, v in wanted.items()} else None

    wait_for(shown, f"the page's totals to read {wanted}", timeout_s=60)
    texts = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('article.panel')].map("
        "e => [e.querySelector('h3').textContent, e.querySelector('.stat-value')?.textContent]))"
    )
    assert texts["Requests succeeded"] == str(int(wanted["Requests succeeded"]))

    def swiglu_anomalies() -> int:  # read in the page: the table is redrawn every refresh
        found = driver.execute_script(
            "return document.querySelector('#audit tr[data-op=\"swiglu\"]')?.dataset.anomalies"
        )
        return int(found or 0)

    assert wait_for(swiglu_anomalies, "swiglu anomalies in the audit table") > 0
    assert driver.find_elements("css selector", "#memory tr[data-owner]") == []
    assert "admin token" in driver.find_element("id", "memory").text
    token = driver.find_element("id", "token")
    token.send_keys(ADMIN_TOKEN)
    driver.find_element("id", "token-use").click()
    owners = wait_for(
        lambda: driver.execute_script(
            "return [...document.querySelectorAll('#memory tr[data-owner]')].length"
        ),
        "owner rows",
    )
    assert owners > 0 and driver.find_element("id", "viewer").text.startswith("admin")
    assert console_errors(driver) == []
    screenshot(driver, tmp_path / "status-admin.png")


def test_the_page_fits_a_phone(
    stack: Stack, browser: Callable[[int, int], Any], tmp_path: Path
) -> None:
    # traffic again: the earlier test stopped it, and once its rate windows pass, the rate panels
    # read "no data" (how many depends on how slow the machine is: CI saw 7 where 2 were allowed)
    stack.load.start()
    driver = browser(390, 844)
    driver.get(stack.page_url)
    wait_for(lambda: driver.execute_script("return document.body.dataset.refreshed"), "panels")
    width = driver.execute_script("return window.innerWidth")
    assert width == 390
    overflow = driver.execute_script(
        "return [document.documentElement.scrollWidth, Math.max(...[...document"
        ".querySelectorAll('article')].map(e => e.getBoundingClientRect().right))]"
    )
    assert overflow[0] <= width and overflow[1] <= width, overflow

    def mostly_drawn() -> list[dict[str, Any]] | None:
        # 3 SQL panels and the unsupported one never draw; two more may still be waiting on a
        # window (a utilization sample, an alert that has not fired again yet)
        panels = driver.execute_script(PANEL_STATES)
        drawn = [p for p in panels if p["state"] == "ok"]
        return panels if len(drawn) >= len(panels) - 6 else None

    try:
        panels = wait_for(mostly_drawn, "the panels drawn on a phone", timeout_s=60)
    finally:
        stack.load.stop()
    states = [p["state"] for p in panels]
    assert set(states) <= {"ok", "nodata", "sql", "unsupported"}, panels
    assert console_errors(driver) == []
    screenshot(driver, tmp_path / "status-phone.png")
    driver.save_screenshot(str(tmp_path / "status-phone-viewport.png"))
