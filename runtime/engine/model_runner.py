"""Runs one scheduled step on the model: pack, forward, logits, sample. Never touches the
engine's queues.

All sequences' new tokens go into one packed `input_ids[T]` (prefill chunks and decodes side by
side); the model writes each sequence's K/V into its pages (the scheduler appended the pages they
need) and returns `hidden[T, H]`; the cursors stay where they were (the scheduler's
`update_from_output` moves them and keys the filled pages for prefix reuse). Only the last row
of a sequence whose chunk reaches its end is turned into logits and sampled, through the step's
`SamplingBatch` (runtime.engine.sampling: built once, nothing for a feature no row uses).
A step of decodes only (one token per sequence) goes through the fast path when one was built
(`runtime.models.fast`: the same forward compiled and/or captured per batch bucket on CUDA); on
CPU the compiled step runs prefill and mixed steps too (its graphs are dynamic in the token
count); any other step calls the model's forward directly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import torch

from runtime.engine.request import TokenLogprob
from runtime.engine.sampling.batch import SamplingBatch
from runtime.engine.sampling.sampler import Sampler, SamplerOutput
from runtime.engine.scheduled import ScheduledSeq, SchedulerOutput
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.fast.build import FastPath
from runtime.models.loader import LoadedModel

if TYPE_CHECKING:
    from runtime.engine.lora.registry import ResidentAdapter
    from runtime.engine.spec.drafter import SelfDrafter
    from runtime.engine.spec.verify import SpecResult

__all__ = ["ModelRunner", "StepOutput"]


@dataclass
class StepOutput:
    """What a step produced, for the core's `update_from_output`."""

    token_ids: list[int | None]  # per scheduled item; None: a chunk that ended mid-prompt
    logprobs: list[TokenLogprob | None] | None = None  # per item; None: no row asked
    # n > 1: each choice forked this step (by id) -> its first token and that token's logprob
    forks: dict[int, tuple[int, TokenLogprob | None]] | None = None
    # speculative decoding: each drafting item (by index) -> its verification's emitted tokens
    # (its token_ids entry is None); None: no row drafted
    spec: dict[int, SpecResult] | None = None

    @property
    def num_sampled(self) -> int:
        drafting = 0 if self.spec is None else len(self.spec)
        return drafting + sum(1 for token in self.token_ids if token is not None)

    @classmethod
    def of(
        cls, num_items: int, sampling_idx: list[int], batch: SamplingBatch, out: SamplerOutput
    ) -> StepOutput:
        """Spread the sampler's rows back onto the step's items (and its forks)."""
        step = cls([None] * num_items)
        for i, token_id in zip(sampling_idx, out.token_ids, strict=False):
            step.token_ids[i] = token_id
        if out.logprobs is not None:
            step.logprobs = [None] * num_items
            for i, entry in zip(sampling_idx, out.logprobs, strict=False):
                step.logprobs[i] = entry
        if len(batch.rows) > batch.num_own:
            step.forks = {
                id(row): (out.token_ids[j], None if out.logprobs is None else out.logprobs[j])
                for j, row in enumerate(batch.rows)
                if j >= batch.num_own
            }
        return step


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        fast_path: FastPath | None = None,
    ) -> None:
        self.loaded = loaded
        self.model = cast(CausalLM, loaded.model)
        self.device = loaded.device
        self.fast_path = fast_path
        self.sampler = Sampler()
        self.num_fast_steps = 0  # steps that went through the fast path (tests, stats)
        self.drafter: SelfDrafter | None = None  # speculative_method=self_draft (spec/drafter.py)

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> StepOutput:
        """Pack, forward, logits, sample: the token (and logprob, when asked) of each item."""
        if batch.num_draft_tokens:  # speculative rows to verify (runtime.engine.spec)
            return self._execute_with_drafts(batch)
        if batch.num_lora:  # the one check a step without adapters pays
            return self._execute_lora(batch)
        return self._execute(batch)

    def _execute(
        self, batch: SchedulerOutput, lora: list[ResidentAdapter | None] | None = None
    ) -> StepOutput:
        input_ids, slices = self._pack(batch.items)
        if lora is None:
            hidden = self._forward(input_ids, slices, decode_only=batch.num_prefill_tokens == 0)
        else:
            from runtime.engine.lora.step import groups_of
            from runtime.models.lora import lora_forward

            hidden = lora_forward(self.model, input_ids, slices, groups_of(slices, lora))
        if batch.num_featured:  # echo + logprobs: the prompt positions of the chunks that ask
            self._prompt_logprobs(batch.items, slices, hidden)
        sampling_idx = [i for i, item in enumerate(batch.items) if item.samples]
        if not sampling_idx:
            return StepOutput([None] * len(batch.items))
        last = torch.tensor([slices[i].end - 1 for i in sampling_idx], device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, last))  # [N, vocab] float32
        sampling = SamplingBatch.build(
            [batch.items[i].seq for i in sampling_idx],
            featured=batch.num_featured > 0,
            all_greedy=batch.num_random == 0,
            device=self.device,
        )
        out = self.sampler(logits, sampling)
        return StepOutput.of(len(batch.items), sampling_idx, sampling, out)

    def _execute_with_drafts(self, batch: SchedulerOutput) -> StepOutput:
        from runtime.engine.spec.step import execute_with_drafts

        if self.drafter is not None:  # self_draft: the placeholders become the draft's tokens
            self.drafter.draft(batch.items)
        input_ids, slices = self._pack(batch.items)
        # the chunked forward (never the fast path); through `_forward`, so a tensor-parallel
        # runner's workers get the step too
        hidden = self._forward(input_ids, slices, decode_only=False)
        if batch.num_featured:
            self._prompt_logprobs(batch.items, slices, hidden)
        drafted = execute_with_drafts(self.model, self.sampler, self.device, batch, slices, hidden)
        num_items = len(batch.items)
        if drafted.sampling is None or drafted.sampled is None:
            step = StepOutput([None] * num_items)
        else:
            step = StepOutput.of(num_items, drafted.plain_idx, drafted.sampling, drafted.sampled)
        step.spec = drafted.spec  # the drafting rows' tokens (their token_ids entries stay None)
        return step

    def _execute_lora(self, batch: SchedulerOutput) -> StepOutput:
        """Rows ordered by adapter (each adapter's rows one run), then back in batch order."""
        from runtime.engine.lora.step import arrange

        order, adapters = arrange(batch.items)
        step = self._execute(replace(batch, items=[batch.items[i] for i in order]), adapters)
        token_ids: list[int | None] = [None] * len(order)
        for j, i in enumerate(order):
            token_ids[i] = step.token_ids[j]
        logprobs: list[TokenLogprob | None] | None = None
        if step.logprobs is not None:
            logprobs = [None] * len(order)
            for j, i in enumerate(order):
                logprobs[i] = step.logprobs[j]
        return StepOutput(token_ids, logprobs, step.forks)

    def _pack(self, items: list[ScheduledSeq]) -> tuple[torch.Tensor, list[SeqSlice]]:
        """Every item's new tokens side by side: input_ids [T] and each one's slice of it."""
        flat_ids: list[int] = []
        slices: list[SeqSlice] = []
        for item in items:
            seq = item.seq
            assert seq.kv is not None
            start = len(flat_ids)
            flat_ids.extend(seq.pending_token_ids(item.num_new_tokens))
            if item.draft_token_ids:  # speculative: the drafts after it, verified in this step
                flat_ids.extend(item.draft_token_ids)
            slices.append(SeqSlice(start=start, end=len(flat_ids), kv=seq.kv))
        return torch.tensor(flat_ids, dtype=torch.long, device=self.device), slices

    def _forward(
        self, input_ids: torch.Tensor, slices: list[SeqSlice], *, decode_only: bool
    ) -> torch.Tensor:
        if self.fast_path is not None and (decode_only or self.fast_path.runs_prefill):
            hidden = self.fast_path(input_ids, slices)  # [T, H]
            self.num_fast_steps += 1
            return hidden
        return self.model(input_ids, slices)

    def _prompt_logprobs(
        self, items: list[ScheduledSeq], slices: list[SeqSlice], hidden: torch.Tensor
    ) -> None:
        for item, piece in zip(items, slices, strict=True):
            seq = item.seq
            state = None if seq.features is None else seq.features.logprobs
            if state is not None and state.needs_prompt_logits:
                state.add_prompt_chunk(
                    self.model.compute_logits,
                    hidden[piece.start : piece.end],
                    seq.prompt_token_ids,
                    seq.num_computed_tokens,  # the chunk's first position (not advanced yet)
                )
