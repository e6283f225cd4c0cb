"""The process's one APScheduler 3.x BackgroundScheduler. Evaluators add and remove jobs on
it; it starts on first use and stops at interpreter exit."""

from __future__ import annotations

import atexit
import threading

from apscheduler.schedulers.background import BackgroundScheduler

_lock = threading.Lock()
_scheduler: BackgroundScheduler | None = None


def get_scheduler() -> BackgroundScheduler:
    global _scheduler
    with _lock:
        if _scheduler is None or not _scheduler.running:
            _scheduler = BackgroundScheduler(
                daemon=True,
                job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
            )
            _scheduler.start()
            atexit.register(shutdown_scheduler)
        return _scheduler


def shutdown_scheduler() -> None:
    global _scheduler
    with _lock:
        if _scheduler is not None and _scheduler.running:
            _scheduler.shutdown(wait=False)
        _scheduler = None
