"""Issue 39, item 2 re-run: what `/health` and a plain chat see while clients send the heavy
requests that used to run on the event loop.

    python -m bench.event_loop --quick [--only 0] [--reference-tree /tmp/ref]  # before/after

Starts `fastllm serve` on the random demo llama (or `--url` of a running server), then runs phases
of the same length: idle (only the probes), each attack alone (1 MB-class `/tokenize` calls,
880 KB prompts past the context, `echo` + `logprobs: 20` completions with `n`, a body past
`max_response_bytes`) and all of them mixed. Prints each phase's /health and plain-chat p50/p99,
/health p99 against idle, whether it is <= 100 ms (the issue's bound), the server's RSS peak (a
server it started) and the attack's status counts (no 5xx expected).

`/health` is timed from its own process: a probe thread beside the heavy clients would wait for
this process's GIL while they read multi-MB bodies, and count that as the server's latency.
`--reference-tree DIR` also serves the model from another checkout, phase by phase in turn with
this one, so both see the same load (shared machine: compare within a run, never across runs).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.batching_parts import Server, start_server

_TOKENIZE_PROMPT = "lorem ipsum dolor sit amet " * 36_000  # 972,000 characters
_LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 20_000  # past any context
ATTACKS = ("tokenize 1 MB", "prompt past context", "echo+logprobs 20", "past max_response_bytes")
HEALTH_BOUND_S = 0.100  # issue 39: /health <= 100 ms under every attack
HANG_S = 120.0  # a request with no answer by then counts as a hang
Body = tuple[str, dict[str, Any]]  # (path, JSON body)
Phase = tuple[str, int, list[Body]]  # (label, heavy clients, their bodies)


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100)[q - 1]


def expected_rows(path: str, body: dict[str, Any], status: str) -> int:
    """`inference_log` rows the server owes a request (storage.rows): one per prompt of an
    answered /v1 request (a batch's prompts are engine requests of their own), one for a refused
    one, none outside /v1 (/tokenize, /health)."""
    if not path.startswith("/v1/"):
        return 0
    prompt = body.get("prompt")
    if status == "200" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def heavy_bodies(model: str) -> list[Body]:
    ids = list(range(3, 503))
    logprobs = {
        "model": model,
        "prompt": [ids] * 4,
        "n": 4,
        "max_tokens": 8,
        "echo": True,
        "logprobs": 20,
    }
    return [
        ("/tokenize", {"model": model, "prompt": _TOKENIZE_PROMPT}),
        ("/v1/completions", {"model": model, "prompt": _LONG_PROMPT, "max_tokens": 1}),
        ("/v1/completions", logprobs),
        ("/v1/completions", {**logprobs, "prompt": [ids] * 8, "n": 16, "max_tokens": 1000}),
    ]


def start_probe(url: str, seconds: float) -> subprocess.Popen[str]:
    """`/health` timed from a process of its own for `seconds`; `probe_result` collects it."""
    probe = [sys.executable, "-m", "bench.event_loop", "--ping", url, "--seconds", str(seconds)]
    return subprocess.Popen(probe, stdout=subprocess.PIPE, text=True)


def probe_result(pinger: subprocess.Popen[str]) -> list[float]:
    health: list[float] = json.loads(pinger.communicate()[0])
    return health


def _ping(url: str, seconds: float) -> None:
    """The probe's own process: `/health` every 20 ms, the latencies as JSON on stdout."""
    stop = time.monotonic() + seconds
    health: list[float] = []
    with httpx.Client(timeout=HANG_S) as http:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            http.get(f"{url}/health")
            health.append(time.monotonic() - t0)
            time.sleep(0.02)
    print(json.dumps(health))


def post(http: httpx.Client, url: str, path: str, body: dict[str, Any]) -> str:
    """The status code as text, "hang" when no answer came within HANG_S, else the transport
    error's name (a dropped connection: counted with the 5xx by bench.attacks)."""
    try:
        return str(http.post(f"{url}{path}", json=body).status_code)
    except httpx.TimeoutException:
        return "hang"
    except httpx.TransportError as exc:
        return type(exc).__name__


def phase(
    url: str,
    model: str,
    seconds: float,
    heavy_clients: int,
    bodies: list[Body],
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A plain chat in a loop and `heavy_clients` sending `bodies` in turn for `seconds`, with
    /health probed meanwhile. Returns percentiles, status counts by path and the rows owed."""
    stop = time.monotonic() + seconds
    chats: list[float] = []
    statuses: Counter[str] = Counter()
    rows = [0]
    lock = threading.Lock()
    pinger = start_probe(url, seconds)

    def send(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
        status = post(http, url, path, body)
        with lock:
            statuses[f"{path} {status}"] += 1
            rows[0] += expected_rows(path, body, status)

    def chatter() -> None:
        body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=HANG_S, headers=headers) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                send(http, "/v1/chat/completions", body)
                chats.append(time.monotonic() - t0)
                time.sleep(0.05)

    def heavy(i: int) -> None:
        n = i
        with httpx.Client(timeout=HANG_S, headers=headers) as http:
            while time.monotonic() < stop:
                send(http, *bodies[n % len(bodies)])
                n += 1

    threads = [threading.Thread(target=chatter)]
    threads += [threading.Thread(target=heavy, args=(i,)) for i in range(heavy_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    health = probe_result(pinger)
    return {
        "health_p50": pct(health, 50),
        "health_p99": pct(health, 99),
        "chat_p50": pct(chats, 50),
        "chat_p99": pct(chats, 99),
        "statuses": dict(statuses),
        "rows": rows[0],
    }


def with_rss(pid: int | None, run_phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run_phase()` plus the server's RSS peak over it, bytes (every 0.1 s; None: no pid)."""
    peak, done = [0], threading.Event()
    proc = psutil.Process(pid) if pid is not None else None

    def sample() -> None:
        while proc is not None and not done.wait(0.1):
            peak[0] = max(peak[0], proc.memory_info().rss)

    (sampler := threading.Thread(target=sample)).start()
    try:
        r = run_phase()
    finally:
        done.set()
        sampler.join()
    return {**r, "rss_peak": peak[0] if proc is not None else None}


def _row(server: str, phase: str, r: dict[str, Any], idle: dict[str, Any] | None) -> str:
    ratio = "" if idle is None else f"  x{r['health_p99'] / idle['health_p99']:5.1f} idle"
    met = r["health_p99"] <= HEALTH_BOUND_S
    bound = "" if idle is None else ("  <=100ms" if met else "  >100ms")
    rss = "" if r["rss_peak"] is None else f"   RSS peak {r['rss_peak'] / 2**20:6.0f} MB"
    return (
        f"{server:9s} {phase:24s} /health p50 {r['health_p50'] * 1e3:6.1f} p99 "
        f"{r['health_p99'] * 1e3:6.1f} ms{ratio}{bound}   chat p50 {r['chat_p50'] * 1e3:6.1f} "
        f"p99 {r['chat_p99'] * 1e3:7.1f} ms{rss}"
    )


def attack_phases(model: str, clients: int, only: int | None = None) -> list[Phase]:
    """(label, heavy clients, bodies): idle, each attack alone (or `only`), then all mixed."""
    bodies = heavy_bodies(model)
    phases: list[Phase] = [("idle", 0, [])]
    picked = range(len(ATTACKS)) if only is None else [only]
    phases += [(ATTACKS[i], clients, [bodies[i]]) for i in picked]
    if only is None:
        phases.append(("all mixed", clients, bodies))
    return phases


def run(
    servers: dict[str, str],
    model: str,
    seconds: float,
    clients: int,
    only: int | None = None,
    pids: dict[str, int] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Idle, then each attack (or `only`), then all mixed; each phase on every server in turn.
    Returns {server: {phase: result}}; prints a row per phase (RSS peak: servers in `pids`)."""
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in servers}
    for label, num_clients, bodies in attack_phases(model, clients, only):
        for name, url in servers.items():
            run_phase = functools.partial(phase, url, model, seconds, num_clients, bodies)
            r = results[name][label] = with_rss((pids or {}).get(name), run_phase)
            print(_row(name, label, r, None if label == "idle" else results[name]["idle"]))
            if label != "idle":
                print(f"{'':9s}   {r['statuses']}")
        sys.stdout.flush()
    for name, per_phase in results.items():
        attacks = {k: v for k, v in per_phase.items() if k != "idle"}
        worst = max(attacks, key=lambda k: attacks[k]["health_p99"])
        fives = sum(
            n
            for r in attacks.values()
            for k, n in r["statuses"].items()
            if k.split()[-1].startswith("5") or k.endswith("hang")
        )
        met = attacks[worst]["health_p99"] <= HEALTH_BOUND_S
        print(
            f"{name}: idle /health p99 {per_phase['idle']['health_p99'] * 1e3:.1f} ms; worst "
            f"attack '{worst}' p99 {attacks[worst]['health_p99'] * 1e3:.1f} ms "
            f"(bound 100 ms: {'met' if met else 'NOT met'}); 5xx or hangs under load: {fives}"
        )
    summary = {
        name: {label: round(r["health_p99"] * 1e3, 1) for label, r in per_phase.items()}
        for name, per_phase in results.items()
    }
    print(json.dumps({"health_p99_ms": summary}))  # the benches' last line (Makefile)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model", default="llama", help="the model name (with --url)")
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--clients", type=int, default=8, help="heavy clients")
    parser.add_argument("--only", type=int, default=None, help="one heavy body (its index)")
    parser.add_argument("--quick", action="store_true", help="8 s phases, 6 heavy clients")
    parser.add_argument("--reference-tree", default=None, help="also serve from this checkout")
    parser.add_argument("--ping", default=None, help=argparse.SUPPRESS)  # the probe process
    args = parser.parse_args()
    if args.ping is not None:
        _ping(args.ping, args.seconds)
        return
    if args.quick:
        args.seconds, args.clients = 8.0, 6
    if args.url is not None:
        run({"server": args.url}, args.model, args.seconds, args.clients, args.only)
        return
    from runtime.models.demo import make_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(Path(tmp) / "llama", arch="llama")
        started: dict[str, Server] = {}
        try:
            if args.reference_tree is not None:  # its code first on the server's path
                tree = str(Path(args.reference_tree).resolve())
                started["reference"] = start_server(str(model), "cpu", {"PYTHONPATH": tree})
            started["this tree"] = start_server(str(model), "cpu", {})
            url = next(iter(started.values())).url
            name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
            servers = {label: s.url for label, s in started.items()}
            pids = {label: s.proc.pid for label, s in started.items()}
            run(servers, name, args.seconds, args.clients, args.only, pids)
        finally:
            for server in started.values():
                server.stop()


if __name__ == "__main__":
    main()
