"""The status page's audit card counts this server's rows only (issue 39): a second server
sharing the default SQLite file showed the first one's anomalies as its own. `?audit=all` (the
card's link) shows every server's rows; each row counts against the tolerance it recorded."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from runtime.engine.stats import RequestStats, VerificationResult
from runtime.server.status.facts import audit_info
from runtime.server.wiring import build_state
from storage.db import make_engine, upgrade
from storage.writer import InferenceLogWriter
from tests.runtime.server.live import engine_for, light_settings, router_of

OTHER = "127.0.0.1:9999"  # another server writing into the same database


def _stats(rid: str, model: str) -> RequestStats:
    now = time.time()
    return RequestStats(
        request_id=rid, model=model, version="stable", queued_ts=now - 0.2,
        scheduled_ts=now - 0.1, first_token_ts=now - 0.05, finished_ts=now,
        prompt_tokens=3, completion_tokens=2, finished_reason="stop",
    )  # fmt: skip


def _logit(rid: str, model: str, error: float, tolerance: float) -> VerificationResult:
    return VerificationResult(
        rid, model, "stable", "logit", 30.0 + error, 30.0, time.time(), tolerance
    )


def test_the_audit_card_counts_this_servers_rows(
    demo_model_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    db = make_engine(url)
    upgrade(db)  # before either writer starts: two racing migrations would both create tables
    db.dispose()
    settings = light_settings(storage_enabled=True, database_url=url, port=8123)
    make_router = router_of(llama=partial(engine_for, demo_model_dir("llama"), name="llama"))
    state = build_state(settings, make_router=make_router)  # engines load lazily: nothing runs
    assert state.writer is not None
    state.writer.start()
    try:
        # the other server: an int4 model whose 13 logits were 0.08 off, checked against 0.05
        with InferenceLogWriter(url, instance=OTHER, migrate=False) as other:
            for i in range(13):
                other.record(
                    finished=[_stats(f"q{i}", "smollm2")],
                    verified=[_logit(f"q{i}", "smollm2", 0.08, 0.05)],
                )
        # this server: 4 clean logits, one 0.3 off within its recorded tolerance 0.55
        for i in range(4):
            error, tolerance = (0.3, 0.55) if i == 0 else (1e-5, 1e-3)
            state.writer.record(
                finished=[_stats(f"r{i}", "llama")],
                verified=[_logit(f"r{i}", "llama", error, tolerance)],
            )
        assert state.writer.flush(timeout=30)
        own = audit_info(state, 3600.0, is_admin=True)
        assert own.available and own.models == ["llama"] and own.instance == "127.0.0.1:8123"
        assert own.num_anomalies == 0
        assert [(p["op"], p["num_verified"]) for p in own.per_op] == [("logit", 4)]
        assert own.worst is not None and {w["request_id"] for w in own.worst} == {
            f"r{i}" for i in range(4)
        }
        every = audit_info(state, 3600.0, is_admin=False, every_server=True)
        assert every.models == [] and every.instance is None
        assert every.num_anomalies == 13 and every.per_op[0]["num_verified"] == 17
        assert every.worst is None  # request ids: the admin's only
    finally:
        for stop in reversed(state.on_stop):
            stop()
