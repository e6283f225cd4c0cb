"""Alertmanager's wire formats: the webhook body it POSTs to receivers (version "4"), which our
webhook notifier also sends, and the alert objects of its /api/v2/alerts API."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alerts.state import FIRING, Alert

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time: what Alertmanager sends for "no end"
_FRACTION = re.compile(r"(\.\d{6})\d+")


def rfc3339(ts: float | None) -> str:
    if ts is None:
        return ZERO_TIME
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _parse_time(value: Any) -> Any:
    # Go writes nanoseconds; Python datetimes hold microseconds
    return _FRACTION.sub(r"\1", value) if isinstance(value, str) else value


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime = Field(alias="endsAt")
    generator_url: str = Field("", alias="generatorURL")
    fingerprint: str

    _times = field_validator("starts_at", "ends_at", mode="before")(_parse_time)


class WebhookPayload(BaseModel):
    """The body Alertmanager's webhook_config POSTs (and WebhookNotifier sends)."""

    model_config = ConfigDict(extra="forbid")

    version: Literal["4"]
    group_key: str = Field(alias="groupKey")
    truncated_alerts: int = Field(0, alias="truncatedAlerts")
    status: Literal["firing", "resolved"]
    receiver: str
    group_labels: dict[str, str] = Field(alias="groupLabels")
    common_labels: dict[str, str] = Field(alias="commonLabels")
    common_annotations: dict[str, str] = Field(alias="commonAnnotations")
    external_url: str = Field(alias="externalURL")
    alerts: list[WebhookAlert]


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def generator_url(external_url: str, expr: str) -> str:
    return f"{external_url.rstrip('/')}/graph?g0.expr={quote(expr)}&g0.tab=1"


def webhook_payload(
    alerts: list[Alert], *, receiver: str, external_url: str, expr_of: dict[str, str]
) -> dict[str, Any]:
    status = FIRING if any(a.state == FIRING for a in alerts) else "resolved"
    common_labels = _common([a.labels for a in alerts])
    group_labels = {"alertname": common_labels["alertname"]} if "alertname" in common_labels else {}
    body = {
        "version": "4",
        "groupKey": "{}:" + "{" + ",".join(f'{k}="{v}"' for k, v in group_labels.items()) + "}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": [
            {
                "status": FIRING if a.state == FIRING else "resolved",
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": rfc3339(a.fired_at or a.active_at),
                "endsAt": rfc3339(a.resolved_at),
                "generatorURL": generator_url(external_url, expr_of.get(a.name, "")),
                "fingerprint": a.fingerprint,
            }
            for a in alerts
        ],
    }
    WebhookPayload.model_validate(body)  # our own output obeys the format we parse
    return body


def api_v2_alerts(
    alerts: list[Alert],
    *,
    now: float,
    valid_for_s: float,
    external_url: str,
    expr_of: dict[str, str],
) -> list[dict[str, Any]]:
    """Body of POST /api/v2/alerts. A firing alert's endsAt lies `valid_for_s` ahead, so
    Alertmanager resolves it by itself should the evaluator stop re-sending (Prometheus does
    the same with 4 x its resend delay)."""
    return [
        {
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": rfc3339(a.fired_at or a.active_at),
            "endsAt": rfc3339(a.resolved_at if a.state != FIRING else now + valid_for_s),
            "generatorURL": generator_url(external_url, expr_of.get(a.name, "")),
        }
        for a in alerts
    ]
