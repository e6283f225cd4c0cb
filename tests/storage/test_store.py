from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import Engine, select

from storage.models import MetricSample
from storage.store import AlertRecord, MetricStore, Sample, fingerprint


def test_samples_round_trip_with_canonical_labels(engine: Engine) -> None:
    store = MetricStore(engine)
    t0 = datetime.now(timezone.utc) - timedelta(minutes=10)
    store.add_samples(
        [
            Sample(
                "fastllm_memory_usage",
                10.0 + i,
                t0 + timedelta(minutes=i),
                {"type": "gpu", "a": "1"},
            )
            for i in range(10)
        ]
        + [Sample("fastllm_memory_usage", 99.0, t0, {"type": "cpu"})]
    )
    with engine.connect() as conn:
        labels = set(conn.execute(select(MetricSample.labels)).scalars())
    assert labels == {'{"a":"1","type":"gpu"}', '{"type":"cpu"}'}

    gpu = store.samples(
        "fastllm_memory_usage", labels={"type": "gpu", "a": "1"}, since=t0 + timedelta(minutes=5)
    )
    assert [s.value for s in gpu] == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert gpu[0].labels == {"a": "1", "type": "gpu"} and gpu[0].ts == t0 + timedelta(minutes=5)
    assert len(store.samples("fastllm_memory_usage")) == 11
    assert store.samples("other") == []


def test_alert_events_round_trip(engine: Engine) -> None:
    store = MetricStore(engine)
    t0 = datetime.now(timezone.utc)
    labels = {"severity": "warning", "device": "0"}
    store.add_alert_events(
        [
            AlertRecord("DeviceUtilLow", "pending", t0, labels, {"summary": "low"}, 0.3),
            AlertRecord("DeviceUtilLow", "firing", t0 + timedelta(minutes=5), labels, {}, 0.2),
            AlertRecord("MemoryGrowth", "firing", t0, {}, {}, None, fingerprint="custom"),
        ]
    )
    events = store.alert_events(alertname="DeviceUtilLow")
    assert [e.state for e in events] == ["pending", "firing"]
    assert events[0].labels == labels and events[0].annotations == {"summary": "low"}
    assert events[0].fingerprint == fingerprint("DeviceUtilLow", dict(reversed(labels.items())))
    firing = store.alert_events(state="firing")  # oldest first
    assert [e.alertname for e in firing] == ["MemoryGrowth", "DeviceUtilLow"]
    assert store.alert_events(alertname="MemoryGrowth")[0].fingerprint == "custom"
    assert len(store.alert_events(since=t0 + timedelta(minutes=1))) == 1


def test_a_nan_sample_is_left_out_not_a_failed_write(engine: Engine) -> None:
    """Utilization is NaN until the step-time model has a fit; SQL has no NaN (SQLite stores NULL
    and the column is NOT NULL), so the store skips it instead of failing the evaluator's round."""
    store = MetricStore(engine)
    t0 = datetime.now(timezone.utc)
    store.add_samples([Sample("u", float("nan"), t0), Sample("u", 0.5, t0 + timedelta(seconds=1))])
    store.add_samples([Sample("u", float("nan"), t0 + timedelta(seconds=2))])  # all NaN: no-op
    assert [s.value for s in store.samples("u")] == [0.5]
