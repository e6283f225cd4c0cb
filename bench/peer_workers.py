"""The worker processes of `bench.peer`: one per side, each loading its model once and then
answering one command at a time over a pipe (so only the side being timed has threads awake).

Commands: ("tokens", n) -> the first n greedy token ids (n = 0: the logits after the prompt);
("decode", threads, n) -> seconds of
prefill + n tokens minus prefill + 1 token (the decode time of n tokens), on the chosen clock.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 32
# gemms: only the weight GEMMs of a batch-1 decode step, back to back (no attention, no norms,
# no engine): the ceiling this runtime could reach with torch's GEMMs on this CPU
SIDES = ("fast", "eager", "llama_cpp", "gemms")


def llama_cpp_missing() -> str | None:
    """Why the llama.cpp side cannot run here, or None."""
    for module, hint in (
        ("llama_cpp", 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python'),
        ("gguf", "pip install gguf"),
    ):
        try:
            __import__(module)
        except ImportError as exc:
            return f"{module} is not importable ({exc}); install it with: {hint}"
    return None


def prompt_ids() -> list[int]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(4, 1000, (PROMPT_TOKENS,), generator=gen).tolist()


def _ours(model_dir: Path, compile_mode: str) -> Callable[[int, int], list[Any]]:
    import torch

    from runtime.engine.offline import generate
    from runtime.engine.sampling import SamplingParams
    from runtime.models.loader import load_model

    loaded = load_model(model_dir, dtype="float32", device="cpu")
    prompt = prompt_ids()

    def run(threads: int, n: int) -> list[Any]:
        torch.set_num_threads(threads)
        if n == 0:  # the logits after the prompt, as a list (one eager forward)
            return _prompt_logits(loaded, prompt)
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        (result,) = generate(loaded, [prompt], params, compile=compile_mode)
        return result.token_ids

    return run


def _gemms(model_dir: Path) -> Callable[[int, int], list[Any]]:
    import torch
    import torch.nn.functional as F

    from runtime.models.layers import Linear
    from runtime.models.loader import load_model

    model = load_model(model_dir, dtype="float32", device="cpu", load_tokenizer=False).model
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


def _prompt_logits(loaded: Any, prompt: list[int]) -> list[float]:
    import torch

    from runtime.memory.kv_cache import SequenceKV
    from runtime.models.base import SeqSlice

    model, a = loaded.model, loaded.args
    kv = SequenceKV.empty(a.num_layers, a.num_kv_heads, a.head_dim, len(prompt))
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), [SeqSlice(0, len(prompt), kv)])
        return model.compute_logits(hidden[-1:])[0].tolist()


def _llama_cpp(model_dir: Path) -> Callable[[int, int], list[Any]]:
    import llama_cpp
    import numpy as np

    from bench.gguf_export import write_gguf

    gguf_path = model_dir.parent / f"{model_dir.name}-f32.gguf"
    if not gguf_path.is_file():
        write_gguf(model_dir, gguf_path)
    llms: dict[int, Any] = {}
    prompt = prompt_ids()

    def run(threads: int, n: int) -> list[Any]:
        if threads not in llms:
            llms[threads] = llama_cpp.Llama(
                model_path=str(gguf_path),
                n_ctx=PROMPT_TOKENS + 256,
                n_batch=PROMPT_TOKENS,
                n_threads=threads,
                n_threads_batch=threads,
                verbose=False,
            )
        llm = llms[threads]
        vocab = llm.n_vocab()
        llm.reset()
        llm.eval(prompt)
        if n == 0:
            return np.ctypeslib.as_array(
                llama_cpp.llama_get_logits(llm.ctx), shape=(vocab,)
            ).tolist()
        tokens: list[int] = []
        while True:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(vocab,))
            tokens.append(int(np.argmax(logits)))
            if len(tokens) == n:
                return tokens
            llm.eval(tokens[-1:])

    return run


def _serve(side: str, model_dir: str, clock_name: str, conn: Connection) -> None:
    path = Path(model_dir)
    if side == "llama_cpp":
        run = _llama_cpp(path)
    elif side == "gemms":
        run = _gemms(path)
    else:
        run = _ours(path, "off" if side == "eager" else "auto")
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
        elif command[0] == "decode":
            _, threads, n = command
            conn.send(timed(threads, n + 1) - timed(threads, 1))
        else:
            return


class Worker:
    def __init__(self, side: str, model_dir: Path, clock: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(side, str(model_dir), clock, child))
        self.process.start()
        assert self.conn.recv() == ("ready",), f"{side} worker failed to start"

    @classmethod
    def start_all(cls, cache_dir: Path, clock: str) -> dict[str, Worker]:
        from runtime.models.demo import make_demo_model

        model_dir = cache_dir / "llama-small-seed0"
        if not (model_dir / "config.json").is_file():
            make_demo_model(model_dir, arch="llama", size="small", seed=0, progress=True)
        return {side: cls(side, model_dir, clock) for side in SIDES}

    def prompt_logits(self) -> list[float]:
        return self.greedy_tokens(0)  # type: ignore[return-value]

    def greedy_tokens(self, n: int) -> list[int]:
        self.conn.send(("tokens", n))
        return self.conn.recv()

    def decode_seconds(self, threads: int, n: int) -> float:
        self.conn.send(("decode", threads, n))
        return max(self.conn.recv(), 1e-9)

    def close(self) -> None:
        self.conn.send(("stop",))
        self.process.join(timeout=30)
