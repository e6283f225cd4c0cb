"""A tensor-parallel worker (ranks 1..N-1): load this rank's shard, allocate its KV pool, then
run every step rank 0 broadcasts until told to stop. It never samples and never schedules: its
forward's only output is its share of the all_reduces.

Any error here ends the process (exit 1): a worker out of step with rank 0 cannot recover by
itself, and rank 0 notices the death before the next step and restarts the workers.

`python -m runtime.engine.tp.worker` runs one outside the server (a LeaderWorkerSet's worker
pod): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment, the model from the usual
FASTLLM_* settings.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import torch

from runtime.engine.tp import group
from runtime.engine.tp.messages import SHUTDOWN, PoolSpec, StepMessage, WorkerPool, WorkerSpec
from runtime.memory.gather_scratch import GatherScratch
from runtime.models.parallel.load import load_shard
from runtime.models.parallel.shard import ShardSpec

log = logging.getLogger("fastllm.tp")


def _watch_parent(parent: int) -> None:
    """A spawned worker whose server died without a word exits (its group is gone anyway)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def worker_main(spec: WorkerSpec, rank: int, watch_parent: bool = True) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s tp-rank{rank} %(message)s")
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    if watch_parent:
        threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    device = spec.device_of(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        control = group.join(spec, rank)
        loaded = load_shard(
            spec.model_path,
            ShardSpec(rank, spec.world),
            dtype=spec.dtype,
            device=device,
            legacy_support=spec.legacy_support,
            load_tokenizer=False,
            quantization=spec.quantization,
            quant_group_size=spec.quant_group_size,
            quantize_lm_head=spec.quantize_lm_head,
        )
        pool_spec = group.broadcast(None, None)  # the default group: waits while ranks load
        assert isinstance(pool_spec, PoolSpec)
        pool = WorkerPool(pool_spec, loaded.dtype, device)
        scratch = GatherScratch(loaded.dtype, device)
        model = loaded.model
        model.limit_positions(pool_spec.num_pages * pool_spec.page_size)  # type: ignore[operator]
        log.info("shard loaded; KV pool of %d pages", pool_spec.num_pages)
        while True:
            message = group.broadcast(None, control)
            if message == SHUTDOWN:
                break
            assert isinstance(message, StepMessage)
            input_ids, slices = message.unpack(pool, scratch, device)
            with torch.inference_mode():
                model(input_ids, slices)
    except Exception:
        log.exception("tensor-parallel worker failed; exiting")
        group.leave()
        sys.exit(1)
    group.leave()


def main() -> None:  # pragma: no cover - a worker pod's entry point
    from runtime.config import load_settings

    settings = load_settings(None)
    spec = WorkerSpec(
        model_path=str(settings.model_path),
        world=int(os.environ["WORLD_SIZE"]),
        master_addr=os.environ["MASTER_ADDR"],
        master_port=int(os.environ["MASTER_PORT"]),
        timeout_s=settings.tensor_parallel_timeout_s,
        dtype=settings.dtype,
        device="cpu"
        if settings.device == "cpu"
        else ("cuda" if torch.cuda.is_available() else "cpu"),
        legacy_support=settings.legacy_support,
        quantization=None if settings.quantization == "none" else settings.quantization,
        quant_group_size=settings.quant_group_size,
        quantize_lm_head=settings.quantize_lm_head,
        num_threads=settings.num_threads,
    )
    worker_main(spec, int(os.environ["RANK"]), watch_parent=False)


if __name__ == "__main__":  # pragma: no cover
    main()
