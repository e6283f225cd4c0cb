"""fastllm storage: the `inference_log` table and its non-blocking writer, metric samples and alert
events for the embedded evaluator, the anomaly audit, retention, and the migrations.

    open_database(url)            engine + migrations applied (what `serve` does on start)
    InferenceLogWriter(engine)    the StatsSink: record() queues, a thread writes in batches
    MetricStore(engine)           samples / alert events, synchronous
    run_audit(engine, threshold)  the guide's COUNT(*) query, per-op counts, worst rows
    prune(engine, retention_days) batched deletes of old rows
"""

from storage.audit import AuditReport, default_threshold, run_audit
from storage.db import make_engine, open_database, upgrade
from storage.models import AlertEvent, InferenceLog, MetricSample
from storage.retention import prune
from storage.store import AlertRecord, MetricStore, Sample
from storage.writer import InferenceLogWriter

__all__ = [
    "AlertEvent",
    "AlertRecord",
    "AuditReport",
    "InferenceLog",
    "InferenceLogWriter",
    "MetricSample",
    "MetricStore",
    "Sample",
    "default_threshold",
    "make_engine",
    "open_database",
    "prune",
    "run_audit",
    "upgrade",
]
