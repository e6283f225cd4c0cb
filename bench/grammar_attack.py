"""Re-run of the grammar-compile DoS (issue 39) against a running server: what other clients'
constrained requests and /health see while attackers send constraints that compile for long.

    python -m bench.grammar_attack --url http://127.0.0.1:8000 --model llama-tiny --quick

Prints, for a baseline phase and an attack phase of the same length: the p50/p99 latency of
other constrained requests (each a new regex: a compile every time), /health's p99 (timed from a
process of its own, as in bench.event_loop), and status counts (the attacks should be 400s past
the compile budget, nothing a 5xx); then the ratios.
With API keys, pass two (`--attacker-key`, `--key`): the attack's share is per tenant.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.event_loop import HANG_S, pct, post, probe_result, start_probe


@dataclass
class GrammarAttack:
    url: str
    model: str
    key: str | None = None  # the other clients' API key
    attacker_key: str | None = None
    attack_chars: int = 4000  # the attack's regex length
    attackers: int = 4
    clients: int = 2
    seconds: float = 30.0


def phase(cfg: GrammarAttack, attack: bool) -> dict[str, Any]:
    """Other clients' constrained requests (and the attackers' with `attack`) for `cfg.seconds`,
    /health probed from its own process. Returns the others' p50/p99 latency, /health's, status
    counts ("hang": no answer within HANG_S) and the `inference_log` rows owed (one a request)."""
    stop = time.monotonic() + cfg.seconds
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    lock = threading.Lock()
    pinger = start_probe(cfg.url, cfg.seconds)

    def client(key: str | None, label: str, regex: Callable[[int], str]) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        n = 0
        with httpx.Client(timeout=HANG_S, headers=headers) as http:
            while time.monotonic() < stop:
                body = {
                    "model": cfg.model,
                    "prompt": "x",
                    "max_tokens": 4,
                    "guided_regex": regex(n),
                }
                t0 = time.monotonic()
                status = post(http, cfg.url, "/v1/completions", body)
                with lock:
                    statuses[f"{label} {status}"] += 1
                    if label == "other":
                        latencies.append(time.monotonic() - t0)
                n += 1

    def attacker(i: int) -> None:
        client(cfg.attacker_key, "attack", lambda n: "." * cfg.attack_chars + f"{i}-{n}")

    def other(i: int) -> None:  # distinct: a compile every time
        client(cfg.key, "other", lambda n: f"(yes|no){i}x{n}")

    threads = [threading.Thread(target=other, args=(i,)) for i in range(cfg.clients)]
    if attack:
        threads += [threading.Thread(target=attacker, args=(i,)) for i in range(cfg.attackers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    health = probe_result(pinger)
    return {
        "p50": pct(latencies, 50),
        "p99": pct(latencies, 99),
        "health_p50": pct(health, 50),
        "health_p99": pct(health, 99),
        "statuses": dict(statuses),
        "rows": sum(statuses.values()),
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
    cfg = GrammarAttack(
        args.url, args.model, args.key, args.attacker_key, args.attack_chars, args.attackers,
        args.clients, args.seconds,
    )  # fmt: skip
    base = phase(cfg, attack=False)
    hit = phase(cfg, attack=True)
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
    hangs = sum(v for k, v in hit["statuses"].items() if k.endswith("hang"))
    print(f"5xx during the attack: {fives}; hangs (no answer in {HANG_S:.0f} s): {hangs}")


if __name__ == "__main__":
    main()
