"""The compiled CPU decode step (runtime.models.fast.cpu_step) against the eager forward.

    python -m bench.compiled_step [--quick] [--size tiny|small] [--formats fp32,int4]
                                  [--batches 1,8] [--threads 1,2] [--model DIR|GGUF]
    OMP_WAIT_POLICY=PASSIVE python -m bench.compiled_step --quick --keep-cache --no-restart

For each weight format (fp32, bf16, int8, int4, int4+head: int4 with the int8 LM head): the
model loads once; its decode step is compiled into a fresh cache directory (the first load's
compile time, its graphs saved there), then fresh processes start again, alternating: the load
alone (eager) and the load plus the compiled step loaded from that cache (a restart), the best
of 2 (--quick) or 3 each, and their ratio (the issue's target: <= 1.5), in wall seconds and in
the process's CPU seconds (steadier on a shared machine).
Decode: `--batches` sequences at a 32-token context, one greedy decode step at a time (the step,
the LM head, argmax), the eager forward and the compiled step alternating round by round at
each of `--threads`, best-of-rounds medians;
tok/s = batch / step seconds, and the ratio compiled / eager measured in the same run.
The last line is one JSON object: {"formats": {fmt: {"load": {...}, "decode": {...}}}}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.generate import DEFAULT_CACHE
from bench.model_arg import add_model_argument, resolve_model
from runtime.memory.kv_pool import SequenceKV
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.demo import make_demo_model
from runtime.models.fast.build import FastPathOptions, get_fast_path
from runtime.models.loader import LoadedModel, load_model

FORMATS = {  # name -> (dtype, quantization, int8 head)
    "fp32": ("float32", None, False),
    "bf16": ("bfloat16", None, False),
    "int8": ("float32", "int8", False),
    "int4": ("float32", "int4", False),
    "int4+head": ("float32", "int4", True),
}
CONTEXT = 32


def _load(path: Path, fmt: str) -> tuple[LoadedModel, float]:
    dtype, quant, head = FORMATS[fmt]
    start = time.perf_counter()
    loaded = load_model(path, dtype=dtype, device="cpu", quantization=quant, quantize_lm_head=head)
    return loaded, time.perf_counter() - start


def _compile(loaded: LoadedModel, cache: Path) -> tuple[object, float]:
    start = time.perf_counter()
    fast = get_fast_path(loaded, FastPathOptions(compile="on", max_batch=64, cache_dir=cache))
    assert fast is not None
    if fast.fallback_reason is not None:
        raise SystemExit(f"compile fell back: {fast.fallback_reason}")
    return fast, time.perf_counter() - start


def _sequences(model: CausalLM, batch: int, steps: int) -> list[SequenceKV]:
    a, dtype = model.args, model.embed_tokens.weight.dtype
    per_seq = -(-(CONTEXT + steps) // 16) * 16
    pool = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, batch * per_seq, dtype)
    kvs = [SequenceKV(pool.data) for _ in range(batch)]
    pages = per_seq // 16
    for i, kv in enumerate(kvs):
        kv.page_ids = pool.page_ids[i * pages : (i + 1) * pages]
    return kvs


def _step_seconds(model: CausalLM, step: object, kvs: list[SequenceKV], steps: int) -> float:
    """Median seconds of `steps` greedy decode steps from a CONTEXT-token past (random K/V)."""
    ids = torch.arange(len(kvs)) + 5
    times = []
    for kv in kvs:
        kv.num_tokens = CONTEXT
    for _ in range(steps):
        start = time.perf_counter()
        hidden = step(ids, [SeqSlice(i, i + 1, kv) for i, kv in enumerate(kvs)])  # type: ignore[operator]
        ids = model.compute_logits(hidden).argmax(-1)
        times.append(time.perf_counter() - start)
        for kv in kvs:
            kv.advance(1)
    return statistics.median(times[1:])


def _decode(loaded: LoadedModel, fast: object, args: argparse.Namespace) -> dict:
    model = loaded.model
    assert isinstance(model, CausalLM)
    out: dict[str, dict] = {}
    steps = 6 if args.quick else 16
    rounds = 3 if args.quick else 5
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            kvs = _sequences(model, batch, steps)
            best = {"eager": float("inf"), "compiled": float("inf")}
            with torch.inference_mode():
                for _ in range(rounds):  # alternating: drift and neighbours hit both alike
                    best["eager"] = min(best["eager"], _step_seconds(model, model, kvs, steps))
                    best["compiled"] = min(best["compiled"], _step_seconds(model, fast, kvs, steps))
            row = {k: round(batch / v, 1) for k, v in best.items()}
            row["ratio"] = round(best["eager"] / best["compiled"], 2)
            out[f"t{threads}_b{batch}"] = row
            print(
                f"  {threads} thread(s), batch {batch}: eager {row['eager']} tok/s, compiled "
                f"{row['compiled']} tok/s, compiled/eager {row['ratio']}",
                flush=True,
            )
    return out


def _child(path: Path, fmt: str, cache: Path, mode: str) -> None:
    """One start in a fresh process: the load (eager), or the load and the compiled step built
    on the warm cache (compiled); prints one JSON line with its wall and CPU seconds (the
    process's, all threads: on a shared machine the steadier of the two)."""
    torch.set_num_threads(1)
    start, cpu_start = time.perf_counter(), time.process_time()
    loaded, _ = _load(path, fmt)
    if mode == "compiled":
        fast, _ = _compile(loaded, cache)
        loaded_graphs = fast.step.num_loaded_graphs  # type: ignore[attr-defined]
        assert loaded_graphs == 2, "the restart compiled instead of loading"
    seconds = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}
    print(json.dumps(seconds))


def _start(path: Path, fmt: str, cache: Path, mode: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.compiled_step", "--child", f"{fmt}:{mode}"]
    cmd += ["--cache-dir", str(cache), "--model", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _restart(path: Path, fmt: str, cache: Path, rounds: int) -> dict:
    """Fresh processes, eager and compiled starts alternating, the best of `rounds` each: the
    load alone against the load plus the compiled step on the warm cache, in wall and in CPU
    seconds."""
    best = {
        (mode, clock): float("inf") for mode in ("eager", "compiled") for clock in ("wall", "cpu")
    }
    for _ in range(rounds):
        for mode in ("eager", "compiled"):
            for clock, value in _start(path, fmt, cache, mode).items():
                best[mode, clock] = min(best[mode, clock], value)
    out = {}
    for clock in ("wall", "cpu"):
        out[f"eager_start_{clock}_s"] = round(best["eager", clock], 2)
        out[f"restart_{clock}_s"] = round(best["compiled", clock], 2)
        out[f"restart_{clock}_ratio"] = round(best["compiled", clock] / best["eager", clock], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--size", choices=["tiny", "small"], default="small")
    parser.add_argument("--formats", default="fp32,int4", help=f"of {','.join(FORMATS)}")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--no-restart", action="store_true", help="skip the warm-cache child")
    parser.add_argument(
        "--keep-cache", action="store_true", help="compile on what an earlier run left (A/B runs)"
    )
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_model_argument(parser)
    args = parser.parse_args(argv)
    path = resolve_model(args.model, args.cache_dir)
    if args.child is not None:
        assert path is not None
        fmt, mode = args.child.split(":")
        _child(path, fmt, args.cache_dir, mode)
        return
    args.batches = [int(b) for b in args.batches.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    if path is None:
        path = args.cache_dir / f"llama-{args.size}"
        if not (path / "config.json").is_file():
            make_demo_model(path, arch="llama", size=args.size, seed=0)
    report: dict[str, dict] = {}
    for fmt in args.formats.split(","):
        cache = args.cache_dir / "compiled-step" / fmt
        if not args.keep_cache:
            shutil.rmtree(cache, ignore_errors=True)  # the first load compiles from nothing
        torch.set_num_threads(1)
        loaded, load_s = _load(path, fmt)
        fast, compile_s = _compile(loaded, cache)
        load = {"eager_load_s": round(load_s, 2), "first_compile_s": round(compile_s, 1)}
        if not args.no_restart:
            load.update(_restart(path, fmt, cache, rounds=2 if args.quick else 3))
        print(f"{fmt} ({path.name}): {load}", flush=True)
        report[fmt] = {"load": load, "decode": _decode(loaded, fast, args)}
    print(json.dumps({"model": path.name, "formats": report}))


if __name__ == "__main__":
    main()
