"""Rollout state across replicas. Each replica keeps its own RolloutController (the state stays
where it is); a `RolloutSync` thread makes the replicas agree:

- every `interval_s` it reads each peer's GET /admin/rollout and `adopt`s the peer's last event
  when it is newer than its own (runtime/serving/rollout.py: newest event wins, the peer's timestamp
  kept, so nothing bounces back);
- when this replica decides something itself (an automatic rollback, an operator action), it
  nudges every peer (POST /admin/rollout/sync), which runs a round at once instead of waiting.

So a rollback on one replica shows on the others within one interval, or one round trip when the
nudge gets through. Peers are the URLs of `rollout_peers` plus what `rollout_peers_dns` resolves
to each round (replicas come and go); a replica finding itself among them is harmless (its own
event is never newer than itself). Peer calls use this replica's admin token: replicas share it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from runtime.errors import FastllmError
from runtime.serving.rollout import RolloutController, RolloutEvent

log = logging.getLogger("fastllm.rollout")
EVENT_FIELDS = ("action", "stable", "canary", "canary_weight", "reason", "automatic", "ts")


def event_from_status(status: dict[str, Any], url: str) -> RolloutEvent | None:
    """The peer's last event as a RolloutEvent (origin: where it was decided), or None."""
    last = status.get("last_event")
    if not isinstance(last, dict) or not all(k in last for k in EVENT_FIELDS):
        return None
    return RolloutEvent(
        model=str(status["model"]),
        action=str(last["action"]),
        stable=str(last["stable"]),
        canary=last["canary"],
        canary_weight=float(last["canary_weight"]),
        reason=str(last["reason"]),
        automatic=bool(last["automatic"]),
        detail=str(last.get("detail") or ""),
        delta=last.get("delta"),
        ts=float(last["ts"]),
        origin=str(last.get("origin") or url),
    )


class RolloutSync:
    def __init__(
        self,
        controller: RolloutController,
        peers: Callable[[], list[str]],
        *,
        admin_token: str,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.controller = controller
        self.peers = peers
        self.interval_s = interval_s
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {admin_token}"}, timeout=timeout_s
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rollout-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        self._client.close()

    def nudge(self) -> None:
        """Run a round now (a peer decided something)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync_once()
            except Exception:  # a bad round must not end the thread; the next one retries
                log.exception("rollout sync round failed")

    def sync_once(self) -> list[RolloutEvent]:
        """Read every peer once; returns the events adopted."""
        adopted = []
        models = [m for m, r in self.controller.router.routes.items() if r.canary is not None]
        for url in self.peers() if models else []:
            for model in models:
                event = self._peer_event(url, model)
                if event is None:
                    continue
                try:
                    done = self.controller.adopt(event)
                except FastllmError as exc:  # e.g. a weight this router refuses
                    log.warning("cannot adopt %s's rollout event: %s", url, exc)
                    continue
                if done is not None:
                    log.info("adopted %s of %s from %s", done.action, model, done.origin)
                    adopted.append(done)
        return adopted

    def _peer_event(self, url: str, model: str) -> RolloutEvent | None:
        try:
            response = self._client.get(f"{url}/admin/rollout", params={"model": model})
        except httpx.HTTPError as exc:  # down, starting, or gone: the next round retries
            log.debug("rollout peer %s unreachable: %s", url, exc)
            return None
        if response.status_code != 200:
            log.debug("rollout peer %s answered %s", url, response.status_code)
            return None
        try:
            return event_from_status(response.json(), url)
        except (ValueError, KeyError, TypeError):
            log.warning("rollout peer %s sent an unreadable status", url)
            return None

    def notify_peers(self) -> None:
        """Nudge every peer, off the calling thread (an automatic rollback runs on the engine's)."""
        threading.Thread(target=self._notify, name="rollout-notify", daemon=True).start()

    def _notify(self) -> None:
        for url in self.peers():
            try:
                self._client.post(f"{url}/admin/rollout/sync")
            except httpx.HTTPError as exc:  # its own round picks the event up later
                log.debug("cannot nudge rollout peer %s: %s", url, exc)
