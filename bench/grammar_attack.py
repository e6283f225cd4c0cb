"""Re-run of the grammar-compile DoS (issue 39) against a running server: what other clients'
constrained requests and /health see while attackers send constraints that compile for long.

    python -m bench.grammar_attack --url http://127.0.0.1:8000 --model llama-tiny --quick

Prints, for a baseline phase and an attack phase of the same length: the p50/p99 latency of
other constrained requests (each a new regex: a compile every time), /health's p99, and status
counts (the attacks should be 400s past the compile budget, nothing a 5xx); then the ratios.
With API keys, pass two (`--attacker-key`, `--key`): the attack's share is per tenant.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from typing import Any

import httpx


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _phase(args: argparse.Namespace, attack: bool) -> dict[str, Any]:
    stop = time.monotonic() + args.seconds
    latencies: list[float] = []
    health: list[float] = []
    statuses: Counter[str] = Counter()
    lock = threading.Lock()

    def post(regex: str, key: str | None, label: str) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": args.model, "prompt": "x", "max_tokens": 4, "guided_regex": regex}
        t0 = time.monotonic()
        try:
            status = str(
                httpx.post(
                    f"{args.url}/v1/completions", json=body, headers=headers, timeout=300
                ).status_code
            )
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with lock:
            statuses[f"{label} {status}"] += 1
            if label == "other":
                latencies.append(time.monotonic() - t0)

    def attacker(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            post("." * args.attack_chars + f"{i}-{n}", args.attacker_key, "attack")
            n += 1

    def other(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            post(f"(yes|no){i}x{n}", args.key, "other")  # distinct: a compile every time
            n += 1

    def pinger() -> None:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            httpx.get(f"{args.url}/health", timeout=30)
            health.append(time.monotonic() - t0)
            time.sleep(0.1)

    threads = [threading.Thread(target=other, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=pinger))
    if attack:
        threads += [threading.Thread(target=attacker, args=(i,)) for i in range(args.attackers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "p50": _pct(latencies, 50),
        "p99": _pct(latencies, 99),
        "health_p99": _pct(health, 99),
        "statuses": dict(statuses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--key", default=None, help="the other clients' API key")
    parser.add_argument("--attacker-key", default=None)
    parser.add_argument("--attack-chars", type=int, default=4000, help="regex length")
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="10 s phases")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 10.0
    base = _phase(args, attack=False)
    hit = _phase(args, attack=True)
    for name, r in (("baseline", base), ("attack", hit)):
        print(
            f"{name:8s} other p50 {r['p50']:.3f} s  p99 {r['p99']:.3f} s  "
            f"/health p99 {r['health_p99'] * 1000:.1f} ms  {r['statuses']}"
        )
    print(
        f"attack / baseline: other p99 x{hit['p99'] / base['p99']:.2f}, "
        f"/health p99 x{hit['health_p99'] / base['health_p99']:.2f}"
    )
    fives = sum(v for k, v in hit["statuses"].items() if k.split()[1].startswith("5"))
    print(f"5xx during the attack: {fives}")


if __name__ == "__main__":
    main()
