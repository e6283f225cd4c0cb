"""`fastllm rollout`: steer running servers' canary through their admin API (POST /admin/rollout).

Every replica named by `--url` (repeatable) or found under `--dns NAME:PORT` (one A record per
replica) gets the call, and each answers for itself; the command then says whether they agree
(stable, canary, weight) and exits 1 when one failed or they disagree. The admin token comes from
--admin-token or FASTLLM_ADMIN_TOKEN (settings.admin_token)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from runtime.cli.params import Finite
from runtime.errors import FastllmError, PermissionDeniedError, ServiceUnavailable

EPILOG = """\b
Examples:
  fastllm rollout set --weight 0.1 --url http://127.0.0.1:8000
  fastllm rollout status --url http://10.0.0.5:8000 --url http://10.0.0.6:8000
  docker compose exec runtime fastllm rollout status --dns runtime:8000
  fastllm rollout promote
  fastllm rollout rollback --model llama-tiny
"""
DEFAULT_URL = "http://127.0.0.1:8000"


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--url", "urls", multiple=True, help=f"a replica (repeatable; default {DEFAULT_URL})"
    )(func)
    func = click.option("--dns", default=None, help="NAME:PORT answering one A record per replica")(
        func
    )
    func = click.option("--admin-token", default=None, help="default: FASTLLM_ADMIN_TOKEN")(func)
    return click.option("--model", default=None, help="default: the model that has a canary")(func)


def _targets(urls: tuple[str, ...], dns: str | None) -> list[str]:
    from runtime.serving.peers import replica_urls

    found = replica_urls(urls or ([] if dns else [DEFAULT_URL]), dns)
    if not found:
        raise ServiceUnavailable(f"{dns} resolves to no replica")
    return found


def _fan_out(
    ctx: click.Context, urls: list[str], token: str | None, method: str, params: dict[str, Any]
) -> None:
    """Call every replica, show each answer, then whether they agree. One replica: as before."""
    if len(urls) == 1:
        _show(_call(urls[0], token, method, params))
        return
    states = {}
    for url in urls:
        click.echo(f"== {url}")
        try:
            status = _call(url, token, method, params)
        except FastllmError as exc:
            click.echo(f"error: {exc.message}")
            continue
        _show(status)
        states[url] = (status["stable"], status["canary"], status["canary_weight"])
    failed = len(urls) - len(states)
    if len(set(states.values())) > 1:
        click.echo(f"replicas disagree: {states}")
        ctx.exit(1)
    if failed:
        click.echo(f"{failed} of {len(urls)} replicas did not answer")
        ctx.exit(1)
    stable, canary, weight = next(iter(states.values()))
    click.echo(
        f"all {len(urls)} replicas agree: stable {stable}, canary {canary or 'none'} "
        f"(weight {weight:g})"
    )


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
        where = f" [from {event['origin']}]" if event.get("origin") else ""
        line = f"last: {event['action']} ({how}, {event['reason']}){where} {event['detail']}"
        click.echo(line.rstrip())


@click.group("rollout", epilog=EPILOG)
def command() -> None:
    """Canary rollout of a running server: weight, promote, rollback, status."""


@command.command("set")
@click.option("--weight", type=Finite(0.0, 1.0), required=True, help="canary share")
@_options
@click.pass_context
def set_cmd(ctx: click.Context, weight: float, urls: tuple[str, ...], **kw: Any) -> None:
    """Route WEIGHT of the requests (sticky per `user`) to the canary."""
    body = {"action": "set", "weight": weight, "model": kw["model"]}
    _fan_out(ctx, _targets(urls, kw["dns"]), kw["admin_token"], "POST", body)


@command.command("promote")
@_options
@click.pass_context
def promote_cmd(ctx: click.Context, urls: tuple[str, ...], **kw: Any) -> None:
    """Make the canary the stable version (the old one drains and stops)."""
    body = {"action": "promote", "model": kw["model"]}
    _fan_out(ctx, _targets(urls, kw["dns"]), kw["admin_token"], "POST", body)


@command.command("rollback")
@_options
@click.pass_context
def rollback_cmd(ctx: click.Context, urls: tuple[str, ...], **kw: Any) -> None:
    """Send every request to the stable version again (canary weight 0)."""
    body = {"action": "rollback", "model": kw["model"]}
    _fan_out(ctx, _targets(urls, kw["dns"]), kw["admin_token"], "POST", body)


@command.command("status")
@_options
@click.pass_context
def status_cmd(ctx: click.Context, urls: tuple[str, ...], **kw: Any) -> None:
    """Versions, weight and per-version health over the rollout window, per replica."""
    params = {"model": kw["model"]} if kw["model"] else {}
    _fan_out(ctx, _targets(urls, kw["dns"]), kw["admin_token"], "GET", params)
