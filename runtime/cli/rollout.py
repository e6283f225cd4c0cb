"""`fastllm rollout`: steer a running server's canary through its admin API (POST /admin/rollout).

The admin token comes from --admin-token or FASTLLM_ADMIN_TOKEN (settings.admin_token)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from runtime.errors import FastllmError, PermissionDeniedError, ServiceUnavailable

EPILOG = """\b
Examples:
  fastllm rollout set --weight 0.1 --url http://127.0.0.1:8000
  fastllm rollout status
  fastllm rollout promote
  fastllm rollout rollback --model llama-tiny
"""


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--url", default="http://127.0.0.1:8000", show_default=True)(func)
    func = click.option("--admin-token", default=None, help="default: FASTLLM_ADMIN_TOKEN")(func)
    return click.option("--model", default=None, help="default: the model that has a canary")(func)


def _call(url: str, token: str | None, method: str, params: dict[str, Any]) -> dict[str, Any]:
    import httpx

    from runtime.config import load_settings

    token = token or load_settings().admin_token
    if not token:
        raise PermissionDeniedError("no admin token: pass --admin-token or set FASTLLM_ADMIN_TOKEN")
    headers = {"Authorization": f"Bearer {token}"}
    endpoint = f"{url.rstrip('/')}/admin/rollout"
    try:
        if method == "GET":
            response = httpx.get(endpoint, params=params, headers=headers, timeout=30)
        else:
            response = httpx.post(endpoint, json=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"cannot reach {endpoint}: {exc}") from exc
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise FastllmError(f"{endpoint} answered {response.status_code}: {message}")
    body: dict[str, Any] = response.json()
    return body


def _show(status: dict[str, Any]) -> None:
    click.echo(f"model: {status['model']}")
    click.echo(f"stable: {status['stable']}")
    click.echo(f"canary: {status['canary'] or 'none'} (weight {status['canary_weight']:g})")
    for v in status["versions"]:
        click.echo(
            f"  {v['role']:<6} {v['version']}: {v['num_requests']} requests, error rate "
            f"{v['error_rate']:.3f}, {v['num_verified']} verified, anomaly rate "
            f"{v['anomaly_rate']:.3f}"
        )
    event = status.get("last_event")
    if event:
        how = "automatic" if event["automatic"] else "operator"
        click.echo(f"last: {event['action']} ({how}, {event['reason']}) {event['detail']}".rstrip())


@click.group("rollout", epilog=EPILOG)
def command() -> None:
    """Canary rollout of a running server: weight, promote, rollback, status."""


@command.command("set")
@click.option("--weight", type=click.FloatRange(0.0, 1.0), required=True, help="canary share")
@_options
def set_cmd(weight: float, url: str, admin_token: str | None, model: str | None) -> None:
    """Route WEIGHT of the requests (sticky per `user`) to the canary."""
    _show(_call(url, admin_token, "POST", {"action": "set", "weight": weight, "model": model}))


@command.command("promote")
@_options
def promote_cmd(url: str, admin_token: str | None, model: str | None) -> None:
    """Make the canary the stable version (the old one drains and stops)."""
    _show(_call(url, admin_token, "POST", {"action": "promote", "model": model}))


@command.command("rollback")
@_options
def rollback_cmd(url: str, admin_token: str | None, model: str | None) -> None:
    """Send every request to the stable version again (canary weight 0)."""
    _show(_call(url, admin_token, "POST", {"action": "rollback", "model": model}))


@command.command("status")
@_options
def status_cmd(url: str, admin_token: str | None, model: str | None) -> None:
    """Versions, weight and per-version health over the rollout window."""
    _show(_call(url, admin_token, "GET", {"model": model} if model else {}))
