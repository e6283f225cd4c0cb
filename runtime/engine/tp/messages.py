"""What rank 0 sends its tensor-parallel workers: once at start the model to load (`WorkerSpec`,
as the process's argument) and the KV pool's geometry (`PoolSpec`); then one `StepMessage` per
step, broadcast on the control group (gloo, even next to NCCL: it is a few hundred bytes of
Python, and a gloo group's wait can outlive an idle server)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.memory.gather_scratch import GatherScratch
from runtime.memory.kv_pool import SequenceKV
from runtime.models.batch_plan import SeqSlice


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to load its shard and join the group."""

    model_path: str
    world: int
    master_addr: str
    master_port: int
    timeout_s: float  # the data group's collective timeout
    dtype: str = "float32"
    device: str = "cpu"  # "cpu" or "cuda" (rank r then uses cuda:r)
    legacy_support: bool = False
    quantization: str | None = None
    quant_group_size: int = 32
    quantize_lm_head: bool = False
    num_threads: int = 0  # torch intra-op threads per worker; 0: torch's default

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def device_of(self, rank: int) -> torch.device:
        """Rank r's device: cuda:(r mod the node's GPUs), so ranks on several nodes (one
        LeaderWorkerSet pod each, or several GPUs a pod) each find a local device."""
        if not self.device.startswith("cuda"):
            return torch.device("cpu")
        return torch.device(f"cuda:{rank % max(1, torch.cuda.device_count())}")


@dataclass(frozen=True)
class PoolSpec:
    """Rank 0's page pool: every rank holds the same pages (same ids) for its own KV heads."""

    num_layers: int
    num_kv_heads: int  # this rank's (the shard's) KV heads
    num_pages: int
    page_size: int
    head_dim: int

    def allocate(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Uninitialized, as rank 0's pool is reserved: on CPU the OS backs it as pages are
        first written. A page is zeroed the first time a step names it (`WorkerPool.prepare`),
        so no NaN bit pattern of fresh memory ever meets a masked key."""
        shape = (
            self.num_layers,
            2,
            self.num_kv_heads,
            self.num_pages,
            self.page_size,
            self.head_dim,
        )
        data = torch.empty(shape, dtype=dtype, device=device)
        data[:, :, :, 0].zero_()  # the zero page: padding of every batched gather
        return data


class WorkerPool:
    """A worker's page pool and which of its pages were ever zeroed. Rank 0 zeroes a page when
    it hands it out; a worker zeroes one the first time it sees it and never again: a reused
    page holds the finite values of its last use, which masked attention multiplies by 0."""

    def __init__(self, spec: PoolSpec, dtype: torch.dtype, device: torch.device) -> None:
        self.data = spec.allocate(dtype, device)
        self.zeroed = bytearray(spec.num_pages)
        self.zeroed[0] = 1

    def prepare(self, pages: list[int]) -> None:
        fresh = [p for p in pages if not self.zeroed[p]]
        if fresh:
            for page in fresh:
                self.zeroed[page] = 1
            self.data.index_fill_(3, torch.tensor(fresh, device=self.data.device), 0)


# one sequence of a step: (start, end, tokens already stored, the pages it reaches)
SliceRow = tuple[int, int, int, list[int]]
SHUTDOWN = "shutdown"


@dataclass
class StepMessage:
    """One step's inputs: packed token ids, each sequence's slice and page table, and the page
    copies rank 0 made since the last step (the partial last page of a forked sequence)."""

    input_ids: list[int]
    slices: list[SliceRow]
    copies: list[tuple[int, int]]  # (source page, destination page)

    @classmethod
    def of(
        cls, input_ids: torch.Tensor, slices: list[SeqSlice], copies: list[tuple[int, int]]
    ) -> StepMessage:
        rows: list[SliceRow] = []
        for piece in slices:
            kv = piece.kv
            needed = -(-(kv.num_tokens + piece.end - piece.start) // kv.page_size)
            rows.append((piece.start, piece.end, kv.num_tokens, kv.page_ids[:needed]))
        return cls(input_ids.tolist(), rows, copies)

    def unpack(
        self, pool: WorkerPool, scratch: GatherScratch, device: torch.device
    ) -> tuple[torch.Tensor, list[SeqSlice]]:
        """The worker's side: apply the copies to its pool, and the forward's arguments."""
        data = pool.data
        for source, dest in self.copies:
            pool.zeroed[dest] = 1
            data[:, :, :, dest] = data[:, :, :, source]
        slices: list[SeqSlice] = []
        for start, end, num_tokens, pages in self.slices:
            pool.prepare(pages)
            kv = SequenceKV(data, scratch=scratch)
            kv.page_ids, kv.num_tokens = pages, num_tokens
            slices.append(SeqSlice(start, end, kv))
        return torch.tensor(self.input_ids, dtype=torch.long, device=device), slices
