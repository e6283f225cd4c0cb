"""RSS over requests from the HTTP soaks' samples (`bench.soak --samples-out FILE`), as a PNG.

    python -m bench.soak_plot --out docs/soak-rss.png gen=/tmp/gen.json embeddings=/tmp/emb.json

Each input is a JSON list of [requests finished, server RSS bytes]; one panel per input, the
warm-up (first 10% of the requests) shaded, the mean of the rest drawn with a +-2% band (the
fluctuation target).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.soak_run import WARMUP_FRACTION


def plot(series: dict[str, list[tuple[int, int]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(9, 3.2 * len(series)), squeeze=False)
    for ax, (name, samples) in zip(axes[:, 0], series.items(), strict=True):
        xs = [n for n, _ in samples]
        ys = [rss / 2**20 for _, rss in samples]
        cut = xs[-1] * WARMUP_FRACTION
        kept = [y for x, y in zip(xs, ys, strict=True) if x > cut] or ys
        mean = sum(kept) / len(kept)
        ax.axvspan(0, cut, color="0.9", label="warm-up (not counted)")
        ax.axhspan(mean * 0.98, mean * 1.02, color="tab:green", alpha=0.12, label="mean ± 2%")
        ax.plot(xs, ys, marker=".", lw=1, label="server RSS")
        ax.set_title(f"{name}: {xs[-1]:,} requests")
        ax.set_xlabel("requests finished")
        ax.set_ylabel("RSS (MiB)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("inputs", nargs="+", help="NAME=FILE (a --samples-out file)")
    args = parser.parse_args(argv)
    series = {}
    for item in args.inputs:
        name, _, file = item.partition("=")
        series[name] = [tuple(s) for s in json.loads(Path(file).read_text())]
    plot(series, args.out)


if __name__ == "__main__":
    main()
