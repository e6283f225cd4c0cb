"""Multi-LoRA serving: what adapters cost a batch, against the base model alone, same run.

    python -m bench.lora [--quick] [--model DIR] [--rank 16] [--device cpu|cuda] [--threads N]

Model: the `small` llama (random weights) under --cache-dir (bench.serving's checkpoint), or
--model; --quick uses the tiny demo llama, fewer streams and rounds. Adapters: PEFT-format
directories with random A and B (B != 0) of rank --rank on all seven projections (q, k, v, o,
gate, up, down), written under the cache directory.
1. ratio_1 / ratio_4: engine throughput (generated tokens / wall) of the same greedy workload
   with every stream on one adapter, or spread over 4 distinct adapters, over the same workload
   on the base model (0 adapters); rounds alternated, best of each kept. Target >= 0.8 at 4
   adapters of rank 16 (the issue's).
2. load_seconds_per_adapter: read, validate and make resident one adapter (mean over the
   adapters, from `Engine.load_lora`), and its resident bytes.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.config import ModelArgs
from runtime.models.loader import read_args

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
TARGETS = {"ratio_4": 0.8}
MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def write_adapter(args: ModelArgs, out: Path, rank: int, seed: int, std: float = 0.02) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors), random A, B
    (normal with `std`: a larger one makes an adapter's greedy tokens differ from the base's)."""
    from safetensors.torch import save_file

    from runtime.models.lora.peft import _fan

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(args.num_layers):
        for module, block in MODULES.items():
            fan_in, fan_out = _fan(args, module)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * std
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False}
    config["target_modules"] = sorted(MODULES)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def ensure_model(path: str | None, cache_dir: Path, quick: bool) -> Path:
    from runtime.models.demo import make_demo_model

    if path:
        return Path(path)
    name = "llama-tiny-seed0" if quick else "llama-small-seed0"  # bench.serving's checkpoint
    default = cache_dir / name
    if not (default / "config.json").exists():
        print(f"building {name} under {default}", file=sys.stderr)
        make_demo_model(default, arch="llama", size="tiny" if quick else "small", seed=0)
    return default


def run_round(engine: Engine, work: list[list[int]], loras: list[str], new: int, tag: str) -> float:
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    handles = [
        engine.submit(GenerationRequest(f"{tag}-{i}", p, params, lora=loras[i % len(loras)]))
        for i, p in enumerate(work)
    ]
    total = sum(h.result(timeout=3600).completion_tokens for h in handles)
    return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default=None, help="checkpoint directory")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = ensure_model(args.model, args.cache_dir, args.quick)
    streams, new, length, rounds = (8, 16, 32, 3) if args.quick else (16, 32, 64, 3)
    rounds = args.rounds or rounds
    model_args = read_args(model_dir)
    root = args.cache_dir / f"lora-{model_dir.name}-r{args.rank}"
    dirs = [write_adapter(model_args, root / f"a{i}", args.rank, seed=i) for i in range(4)]
    config = EngineConfig(
        model_path=model_dir, model_name="bench", device=args.device, max_loras=4,
        max_lora_rank=max(16, args.rank),
    )  # fmt: skip
    engine = Engine(config)
    engine.load()
    load_s: list[float] = []
    nbytes = 0
    for i, path in enumerate(dirs):
        start = time.perf_counter()
        nbytes = engine.load_lora(f"a{i}", str(path))
        load_s.append(time.perf_counter() - start)
    g = torch.Generator().manual_seed(1)
    vocab = model_args.vocab_size
    work = torch.randint(3, vocab, (streams, length), generator=g).tolist()
    cases: dict[str, list[str]] = {"base": [""], "one": ["a0"], "four": ["a0", "a1", "a2", "a3"]}
    for name, loras in cases.items():  # warm-up (first steps of each shape, thread choice)
        run_round(engine, work[:4], loras, 4, f"warm-{name}")
    best: dict[str, float] = dict.fromkeys(cases, 0.0)
    for r in range(rounds):
        for name, loras in cases.items():
            best[name] = max(best[name], run_round(engine, work, loras, new, f"{name}{r}"))
    engine.shutdown()
    result: dict[str, Any] = {
        "device": args.device,
        "model": model_dir.name,
        "rank": args.rank,
        "streams": streams,
        "tokens_per_s_base": best["base"],
        "tokens_per_s_1_adapter": best["one"],
        "tokens_per_s_4_adapters": best["four"],
        "ratio_1": best["one"] / best["base"],
        "ratio_4": best["four"] / best["base"],
        "load_seconds_per_adapter": sum(load_s) / len(load_s),
        "adapter_bytes": nbytes,
        "targets": TARGETS,
    }
    print(
        f"{streams} streams, rank {args.rank}: base {best['base']:.1f} tok/s; 1 adapter "
        f"{best['one']:.1f} (ratio {result['ratio_1']:.2f}); 4 adapters {best['four']:.1f} "
        f"(ratio {result['ratio_4']:.2f}); load {1000 * result['load_seconds_per_adapter']:.1f} "
        f"ms per adapter ({nbytes} bytes resident)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
