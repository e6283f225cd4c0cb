"""tok/s and TTFT against streams, llama-server against ours, from `bench.peer --server --out FILE`.

    python -m bench.peer_server_plot --out docs/peer-server.png report.json

Two panels: tokens/s (median over rounds, the rounds' spread as error bars) and TTFT p50 (log
scale), one line per side: llama-server's best configuration at each stream count (its `-np`
named at the point), ours on the defaults and with `batch_goal=throughput`; and each llama-server
configuration on its own, dashed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def series(report: dict[str, Any]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """side -> [(streams, figures)] in stream order."""
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for streams, entry in sorted(report["streams"].items(), key=lambda kv: int(kv[0])):
        for side, figures in entry.items():
            if side == "llama_server" or side.startswith("ours_"):
                out.setdefault(side, []).append((int(streams), figures))
    return out


def configs(report: dict[str, Any]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """llama-server configuration (`llama_server_np8`, ...) -> [(streams, figures)]: each one,
    not only the best, since the best by tokens/s can queue its clients (`-np 8` at 32 streams
    waits seconds for a first token where `-np 32` waits a tenth of one)."""
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for streams, entry in sorted(report["streams"].items(), key=lambda kv: int(kv[0])):
        for config, figures in entry.get("llama_server_configs", {}).items():
            out.setdefault(config, []).append((int(streams), figures))
    return out


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, (tps, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    for side, points in series(report).items():
        xs = [c for c, _ in points]
        label = "llama-server (best -np)" if side == "llama_server" else side.replace("_", " ")
        tps.errorbar(
            xs,
            [f["tokens_per_s"] for _, f in points],
            yerr=[f.get("tokens_per_s_spread", 0.0) / 2 for _, f in points],
            marker="o",
            capsize=3,
            label=label,
        )
        ttft.plot(xs, [f["ttft_p50_s"] for _, f in points], marker="o", label=label)
        if side == "llama_server":
            for c, f in points:
                tps.annotate(f["config"].removeprefix("llama_server_"), (c, f["tokens_per_s"]),
                             fontsize=7, xytext=(3, -10), textcoords="offset points")  # fmt: skip
    for config, points in configs(report).items():
        xs = [c for c, _ in points]
        label = "llama-server -np " + config.removeprefix("llama_server_np")
        for ax, key in ((tps, "tokens_per_s"), (ttft, "ttft_p50_s")):
            ax.plot(xs, [f[key] for _, f in points], ls="--", lw=1, marker=".", label=label)
    for ax in (tps, ttft):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("closed-loop streaming clients")
        ax.legend(fontsize=8)
    tps.set_ylabel("tokens/s (median of rounds; bars: spread)")
    ttft.set_ylabel("TTFT p50 (s)")
    ttft.set_yscale("log")
    threads = report.get("threads")
    fig.suptitle(f"{Path(report.get('model', '')).name}, {threads} threads, "
                 f"{report.get('max_tokens')} tokens a request")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("report", type=Path)
    args = parser.parse_args(argv)
    plot(json.loads(args.report.read_text()), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
