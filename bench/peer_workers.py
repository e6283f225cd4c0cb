"""The worker processes of `bench.peer`: one per side, each loading its model once and then
answering one command at a time over a pipe (so only the side being timed has threads awake).

Commands: ("tokens", n) -> the first n greedy token ids (n = 0: the logits after the prompt);
("decode", threads, n) -> seconds of
prefill + n tokens minus prefill + 1 token (the decode time of n tokens), on the chosen clock;
("prefill", threads) -> seconds of the prompt's prefill and its first token (the prompt is
PROMPT_TOKENS ids; ours goes through the offline engine, so a request's fixed cost is in it).

The llama.cpp side runs through either Python binding of llama.cpp (bench.peer_llama_cpp), driven
the same way: load the GGUF, decode a batch of token ids, read the logits of the batch's last
token, argmax.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.peer_llama_cpp import PROMPT_TOKENS, LlamaCppPySync, LlamaCppPython

# gemms: only the weight GEMMs of a batch-1 decode step, back to back (no attention, no norms,
# no engine): the ceiling this runtime could reach with torch's GEMMs on this CPU
SIDES = ("fast", "eager", "llama_cpp", "gemms")
# the real-model comparison (a quantized GGUF as is vs ours converted): our int4 and int8 engines
# (the one matching the file's format is the compared side: `matching_side`), and the float
# engines for reference
REAL_SIDES = ("int4", "int8", "fp32", "bf16", "llama_cpp", "kernels")
# --compiled adds the matching side on the compiled decode step (compile=on: minutes on a first
# load, seconds from inductor's saved graphs after)
COMPILED_SIDE = "compiled"
# kernels (--real): only the quantized weight GEMMs of a batch-1 decode step (the matching
# format's projections and its int8 LM head), back to back: no norms, no attention, no engine
TIMING_ONLY = frozenset({"gemms", "kernels"})


def matching_side(gguf_path: Path) -> str:
    """Our quantization that matches a GGUF's weights: int8 for a mostly-Q8_0 file, int4
    otherwise (Q4_0, Q4_1 and the 4-bit K-quants are group-wise 4-bit)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    names = [t.tensor_type.name for t in reader.tensors if t.name.endswith(".weight")]
    return "int8" if names.count("Q8_0") * 2 > len(names) else "int4"


def prompt_ids() -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(4, 1000, (PROMPT_TOKENS,), generator=gen).tolist()


def _ours(
    model_dir: Path,
    compile_mode: str,
    dtype: str = "float32",
    quantization: str | None = None,
    quantize_lm_head: bool = False,
) -> Callable[[int, int], list[Any]]:
    import torch

    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model

    loaded = load_model(
        model_dir,
        dtype=dtype,
        device="cpu",
        quantization=quantization,
        quantize_lm_head=quantize_lm_head,
    )
    prompt = prompt_ids()

    def run(threads: int, n: int) -> list[Any]:
        torch.set_num_threads(threads)
        if n == 0:  # the logits after the prompt, as a list (one eager forward)
            return _prompt_logits(loaded, prompt)
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        (result,) = generate(loaded, [prompt], params, compile=compile_mode, num_threads=threads)
        return result.token_ids

    return run


def _gemms(model_dir: Path) -> Callable[[int, int], list[Any]]:
    import torch
    import torch.nn.functional as F

    from runtime.models.layers import Linear
    from runtime.models.loader import load_model

    model: Any = load_model(  # a CausalLM: its args and embeddings are not on nn.Module
        model_dir, dtype="float32", device="cpu", load_tokenizer=False
    ).model
    weights = [m.weight_t for m in model.modules() if isinstance(m, Linear)]
    head = None if any(w.shape[1] == model.args.vocab_size for w in weights) else model
    x = torch.randn(1, model.args.hidden_size)
    inputs = [torch.randn(1, w.shape[0]) for w in weights]  # [1, in] per GEMM, made once

    @torch.inference_mode()
    def run(threads: int, n: int) -> list[Any]:
        torch.set_num_threads(threads)
        for _ in range(n):
            for a, w in zip(inputs, weights, strict=True):
                torch.matmul(a, w)
            if head is not None:  # tied embeddings: the logits GEMM reads the embedding matrix
                F.linear(x, head.embed_tokens.weight)
        return []

    return run


def _kernels(model_dir: Path, quantization: str) -> Callable[[int, int], list[Any]]:
    import torch

    from runtime.models.loader import load_model
    from runtime.models.quant import QuantizedLinear

    loaded = load_model(
        model_dir,
        dtype="float32",
        device="cpu",
        quantization=quantization,
        quantize_lm_head=True,
        load_tokenizer=False,
    )
    layers = [m for m in loaded.model.modules() if isinstance(m, QuantizedLinear)]
    inputs = [torch.randn(1, m.in_features) for m in layers]  # fp32 [1, in], as the step's

    @torch.inference_mode()
    def run(threads: int, n: int) -> list[Any]:
        torch.set_num_threads(threads)
        for _ in range(n):
            for layer, x in zip(layers, inputs, strict=True):
                layer(x)  # the bf16 cast of the input and the cast back are the kernel's cost too
        return []

    return run


def _prompt_logits(loaded: Any, prompt: list[int]) -> list[float]:
    import torch

    from runtime.memory.kv_pool import SequenceKV
    from runtime.models.base import SeqSlice

    model, a = loaded.model, loaded.args
    dtype = next(model.parameters()).dtype
    kv = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, len(prompt), dtype=dtype)
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), [SeqSlice(0, len(prompt), kv)])
        return model.compute_logits(hidden[-1:])[0].float().tolist()


def llama_cpp_runner(
    gguf_path: Path, binding: str, prompt: list[int] | None = None
) -> Callable[[int, int], list[Any]]:
    """run(threads, n): llama.cpp's first n greedy tokens after `prompt` (default
    `prompt_ids()`), or with n = 0 its logits after the prompt."""
    import numpy as np

    make = LlamaCppPython if binding == "llama_cpp" else LlamaCppPySync
    llms: dict[int, Any] = {}
    prompt = prompt_ids() if prompt is None else prompt

    def run(threads: int, n: int) -> list[Any]:
        if threads not in llms:
            llms[threads] = make(gguf_path, threads)
        llm = llms[threads]
        llm.reset()
        llm.eval(prompt)
        if n == 0:
            return llm.logits().tolist()
        tokens: list[int] = []
        while True:
            tokens.append(int(np.argmax(llm.logits())))
            if len(tokens) == n:
                return tokens
            llm.eval(tokens[-1:])

    return run


def f32_gguf(model_dir: Path) -> Path:
    """The f32 GGUF of a checkpoint, written once beside it."""
    from bench.gguf_export import write_gguf

    gguf_path = model_dir.parent / f"{model_dir.name}-f32.gguf"
    if not gguf_path.is_file():
        write_gguf(model_dir, gguf_path)
    return gguf_path


def _make_run(spec: dict[str, Any]) -> Callable[[int, int], list[Any]]:
    """spec: {"side": "llama_cpp", "gguf", "binding"} | {"side": "gemms", "model_dir"} |
    {"side": ours, "model_dir", "compile", "dtype", "quantization"}."""
    if spec["side"] == "llama_cpp":
        return llama_cpp_runner(Path(spec["gguf"]), spec["binding"])
    if spec["side"] == "gemms":
        return _gemms(Path(spec["model_dir"]))
    if spec["side"] == "kernels":
        return _kernels(Path(spec["model_dir"]), spec["quantization"])
    return _ours(
        Path(spec["model_dir"]),
        spec["compile"],
        spec["dtype"],
        spec["quantization"],
        spec.get("quantize_lm_head", False),
    )


def _serve(spec: dict[str, Any], clock_name: str, conn: Connection) -> None:
    run = _make_run(spec)
    clock = time.process_time if clock_name == "cpu" else time.perf_counter

    def timed(threads: int, n: int) -> float:
        start = clock()
        run(threads, n)
        return clock() - start

    conn.send(("ready",))
    while True:
        command = conn.recv()
        if command[0] == "tokens":
            conn.send(run(1, command[1]))
        elif command[0] == "prefill":
            conn.send(timed(command[1], 1))
        elif command[0] == "decode":
            _, threads, n = command
            conn.send(timed(threads, n + 1) - timed(threads, 1))
        else:
            return


def _ours_spec(model_dir: Path, side: str, compared: str = "int4") -> dict[str, Any]:
    if side in ("kernels", COMPILED_SIDE):  # the compared format's kernels, or its compiled step
        spec = _ours_spec(model_dir, compared)
        return {**spec, "side": side, "compile": "on" if side == COMPILED_SIDE else "auto"}
    compile_mode = "off" if side == "eager" else "auto"
    dtype = "bfloat16" if side == "bf16" else "float32"
    quantization = side if side in ("int4", "int8") else None
    return {
        "side": side,
        "model_dir": str(model_dir),
        "compile": compile_mode,
        "dtype": dtype,
        "quantization": quantization,
        # llama.cpp's quantized files store the output table quantized too (SmolLM2's Q4_1: Q8_0)
        "quantize_lm_head": quantization is not None,
    }


class Worker:
    def __init__(self, spec: dict[str, Any], clock: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(spec, clock, child))
        self.process.start()
        assert self.conn.recv() == ("ready",), f"{spec['side']} worker failed to start"

    @classmethod
    def start_all(cls, cache_dir: Path, clock: str, binding: str) -> dict[str, Worker]:
        """The random `small` llama: ours (fast, eager), llama.cpp on its f32 GGUF, the GEMMs."""
        from runtime.models.demo import make_demo_model

        model_dir = cache_dir / "llama-small-seed0"
        if not (model_dir / "config.json").is_file():
            make_demo_model(model_dir, arch="llama", size="small", seed=0, progress=True)
        specs = {
            "llama_cpp": {
                "side": "llama_cpp",
                "gguf": str(f32_gguf(model_dir)),
                "binding": binding,
            },
            "gemms": {"side": "gemms", "model_dir": str(model_dir)},
        }
        return {side: cls(specs.get(side) or _ours_spec(model_dir, side), clock) for side in SIDES}

    @classmethod
    def start_real(
        cls,
        gguf_path: Path,
        model_dir: Path,
        clock: str,
        binding: str,
        compared: str = "int4",
        compiled: bool = False,
    ) -> dict[str, Worker]:
        """A GGUF as is on llama.cpp; ours on its converted checkpoint (REAL_SIDES, and the
        compared format's compiled step with `compiled`)."""
        llama = {"side": "llama_cpp", "gguf": str(gguf_path), "binding": binding}
        sides = REAL_SIDES + ((COMPILED_SIDE,) if compiled else ())
        return {
            side: cls(
                llama if side == "llama_cpp" else _ours_spec(model_dir, side, compared), clock
            )
            for side in sides
        }

    def prompt_logits(self) -> list[float]:
        return self.greedy_tokens(0)  # type: ignore[return-value]

    def greedy_tokens(self, n: int) -> list[int]:
        self.conn.send(("tokens", n))
        return self.conn.recv()

    def decode_seconds(self, threads: int, n: int) -> float:
        self.conn.send(("decode", threads, n))
        return max(self.conn.recv(), 1e-9)

    def prefill_seconds(self, threads: int) -> float:
        self.conn.send(("prefill", threads))
        return max(self.conn.recv(), 1e-9)

    def close(self) -> None:
        self.conn.send(("stop",))
        self.process.join(timeout=30)
