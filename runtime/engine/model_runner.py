"""Runs one scheduled step on the model: pack, forward, sample. Never touches the engine's queues.

All sequences' new tokens go into one packed `input_ids[T]` (prefill chunks and decodes side by
side); the model writes each sequence's K/V into its pages (the scheduler appended the pages they
need) and returns `hidden[T, H]`; the cursors stay where they were (the scheduler's
`update_from_output` moves them and keys the filled pages for prefix reuse). Only the last row
of a sequence whose chunk reaches its end is turned into logits and sampled.
A step of decodes only (one token per sequence) goes through the fast path when one was built
(`runtime.models.fast`: the same forward compiled and/or captured per batch bucket on CUDA);
any other step calls the model's forward directly.
"""

from __future__ import annotations

from typing import cast

import torch

from runtime.engine.choices import with_forks
from runtime.engine.constraints.mask import accept_sampled, apply_constraint_masks
from runtime.engine.logits import needs_processing, process_logits
from runtime.engine.logprobs import asks_sampled_logprobs, prompt_logprobs, sampled_logprobs
from runtime.engine.sampling import sample
from runtime.engine.scheduler import SchedulerOutput
from runtime.engine.sequence import Sequence
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.fast.build import FastPath
from runtime.models.loader import LoadedModel


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
        self.num_fast_steps = 0  # steps that went through the fast path (tests, stats)

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> list[int | None]:
        """Sampled token per scheduled item (None for a prefill chunk that ends mid-prompt)."""
        flat_ids: list[int] = []
        slices: list[SeqSlice] = []
        for item in batch.items:
            seq = item.seq
            assert seq.kv is not None
            start = len(flat_ids)
            flat_ids.extend(seq.pending_token_ids(item.num_new_tokens))
            slices.append(SeqSlice(start=start, end=len(flat_ids), kv=seq.kv))
        input_ids = torch.tensor(flat_ids, dtype=torch.long, device=self.device)  # [T]
        if self.fast_path is not None and batch.num_prefill_tokens == 0:
            hidden = self.fast_path(input_ids, slices)  # [T, H]
            self.num_fast_steps += 1
        else:
            hidden = self.model(input_ids, slices)
        for item, piece in zip(batch.items, slices, strict=True):
            if item.seq.needs_prompt_logits:  # echo + logprobs: this chunk's prompt positions
                self._prompt_logprobs(item.seq, hidden[piece.start : piece.end])
        sampling_idx = [i for i, item in enumerate(batch.items) if item.samples]
        sampled: list[int | None] = [None] * len(batch.items)
        if not sampling_idx:
            return sampled
        rows = torch.tensor([slices[i].end - 1 for i in sampling_idx], device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))  # [N, vocab] float32
        seqs, fork_rows = with_forks([batch.items[i].seq for i in sampling_idx])
        if len(fork_rows) > len(sampling_idx):  # n choices: one prefill, a row for each choice
            logits = logits.index_select(0, torch.tensor(fork_rows, device=self.device))
        params = [s.request.sampling for s in seqs]
        pending = None  # logprobs are taken before the controls and masks change the logits
        if any(map(asks_sampled_logprobs, params)):
            pending = sampled_logprobs(logits, seqs)
        raw: dict[int, torch.Tensor] = {}  # verified rows' logits before the controls
        if any(p.uses_logits_controls for p in params) and any(map(needs_processing, seqs)):
            raw = {j: logits[j].clone() for j, s in enumerate(seqs) if s.is_verified}
            process_logits(logits, seqs)
        # structured output: forbidden tokens -> -inf, whether or not the row uses a control;
        # after the controls, so no penalty or bias can lift a forbidden token back
        apply_constraint_masks(logits, seqs)
        token_ids = sample(logits, params, [s.generator for s in seqs])
        if pending is not None:
            pending.finish(token_ids, seqs)
        tokens = token_ids.tolist()
        accept_sampled(seqs, tokens)  # each constrained row's matcher takes its token
        for j, (i, token_id) in enumerate(zip(sampling_idx, tokens, strict=False)):
            sampled[i] = int(token_id)
            if seqs[j].is_verified:  # runtime.verify.verifier compares it with the reference path
                seqs[j].chosen_logit = float(raw.get(j, logits[j])[token_id])
        num_own = len(sampling_idx)
        for fork, token_id in zip(seqs[num_own:], tokens[num_own:], strict=True):
            fork.fork_token = int(token_id)  # the core forks it after this step
        return sampled

    def _prompt_logprobs(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """Logprobs of the prompt tokens this chunk's positions predict (position p predicts
        prompt[p + 1]; the last prompt position predicts the first sampled token instead)."""
        prompt = seq.prompt_token_ids
        if seq.prompt_logprobs is None:
            seq.prompt_logprobs = [None] * len(prompt)
        start = seq.num_computed_tokens  # the chunk's first position (not advanced yet)
        end = min(start + hidden.shape[0], len(prompt) - 1)
        if end <= start:
            return
        k = seq.request.sampling.prompt_logprobs or 0
        entries = prompt_logprobs(
            self.model.compute_logits, hidden[: end - start], prompt[start + 1 : end + 1], k
        )
        seq.prompt_logprobs[start + 1 : end + 1] = entries
