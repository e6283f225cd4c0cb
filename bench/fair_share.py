"""A small chat sent while one request runs a big batch (issue 39, item 5: a 4-token chat waited
49.6 s behind 32 prompts × n 8), in three modes of the same engine, in one process:

    python -m bench.fair_share [--quick]

- fifo: the batch's prompts carry no group (what the server sent before fair share): the chat
  queues behind every prompt of the batch;
- ordered: the prompts share a group, share bound 1.0: the chat takes the next free slot;
- fair: the group holds at most `--share` of the batch (the server's default 0.9): the chat
  starts at the next step.
Printed per mode: the chat's latency and the engine steps it spanned, the batch's wall time, and
each against fifo (a ratio measured in this run; the machine is noisy, the steps are not).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.kv import StepSink
from runtime.engine.engine import Engine, EngineConfig
from runtime.engine.request import GenerationRequest
from runtime.engine.sampling import SamplingParams
from runtime.models.loader import LoadedModel, load_model


def run(
    loaded: LoadedModel, *, grouped: bool, share: float, prompts: int, n: int, tokens: int
) -> dict[str, float]:
    sink = StepSink()
    config = EngineConfig(
        model_name="fair",
        device="cpu",
        max_num_seqs=64,  # the server's default
        min_num_seqs=64,
        initial_num_seqs=64,
        compile="off",
        batch_warmup=False,
        max_request_batch_share=share,
        num_threads=1,
    )
    engine = Engine(config, sink, loader=lambda: loaded)
    engine.load()
    try:
        started = time.perf_counter()
        big = [
            engine.submit(
                GenerationRequest(
                    f"big-{k}",
                    list(range(10 + k, 42 + k)),
                    SamplingParams(max_tokens=tokens, n=n, seed=k, ignore_eos=True),
                    group="big" if grouped else None,
                    tenant="t",
                )
            )
            for k in range(prompts)
        ]
        next(iter(big[0]))  # the batch is running
        first_step, chat_started = len(sink.steps), time.perf_counter()
        chat = engine.submit(
            GenerationRequest(
                "chat", [5, 6, 7, 8], SamplingParams(max_tokens=4, ignore_eos=True), tenant="t"
            )
        )
        chat.result()
        chat_s, chat_steps = time.perf_counter() - chat_started, len(sink.steps) - first_step
        for handle in big:
            handle.result()
        return {
            "chat_s": chat_s,
            "chat_steps": chat_steps,
            "batch_s": time.perf_counter() - started,
            "batch_steps": len(sink.steps),
        }
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 prompts × n 8 × 32 tokens")
    parser.add_argument("--share", type=float, default=0.9, help="the server's default")
    args = parser.parse_args()
    prompts, n, tokens = (32, 8, 32) if args.quick else (32, 8, 256)
    with tempfile.TemporaryDirectory() as tmp:
        from runtime.models.demo import make_demo_model

        loaded = load_model(make_demo_model(Path(tmp) / "llama", arch="llama"), device="cpu")
    print(f"batch: {prompts} prompts × n {n} × {tokens} tokens on a batch of 64; chat: 4 tokens")
    run(loaded, grouped=False, share=1.0, prompts=4, n=n, tokens=8)  # warm-up, not counted
    modes = {
        "fifo": run(loaded, grouped=False, share=1.0, prompts=prompts, n=n, tokens=tokens),
        "ordered": run(loaded, grouped=True, share=1.0, prompts=prompts, n=n, tokens=tokens),
        "fair": run(loaded, grouped=True, share=args.share, prompts=prompts, n=n, tokens=tokens),
    }
    base = modes["fifo"]
    for name, r in modes.items():
        print(
            f"{name:8s} chat {r['chat_s'] * 1e3:8.1f} ms over {r['chat_steps']:4d} steps "
            f"(x{r['chat_s'] / base['chat_s']:.3f} of fifo)   batch {r['batch_s']:.2f} s "
            f"(x{r['batch_s'] / base['batch_s']:.2f}) over {r['batch_steps']} steps "
            f"(x{r['batch_steps'] / base['batch_steps']:.2f} of fifo)"
        )


if __name__ == "__main__":
    main()
