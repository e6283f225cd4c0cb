"""The self-draft: the served model's own weights, quantized (int4 by default), drafting k
tokens greedily for each drafting row, batched over the rows (k forwards of the draft per step).

The draft shares the target's tokenizer, embedding table, norms and LM head (the same tensors,
not copies); only the decoder projections are quantized copies (runtime.models.quantize). Its KV
has the target's layout, in pages of a pool of its own (a quarter of the target's budget, from
the same allocator) with prefix reuse under its own model key. Each drafting row's draft KV
tracks the tokens it holds (`fed`): at the next step, what the target rejected is dropped (the
cursor goes back to the longest prefix that still matches the sequence, its pages past it are
trimmed) and the tokens the draft has not seen yet are fed in one chunk before the k drafts.

Exactness never depends on the draft: a draft the drafter cannot produce (no page for its KV) is
filled with token 0, which the target simply rejects. A closed sequence's draft KV is freed at the
next drafting step (`_sweep`), or when the engine closes the draft pool.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from runtime.engine.spec.controls import control_rows
from runtime.errors import ConfigError
from runtime.memory.kv_cache import KVCache
from runtime.memory.kv_pool import SequenceKV
from runtime.models.base import CausalLM, SeqSlice
from runtime.models.quantize import PROJECTIONS, quantize_head, quantize_model

if TYPE_CHECKING:
    from collections.abc import Sequence as Seq

    from runtime.engine.spec.config import SpecConfig
    from runtime.engine.spec.rows import SpecItem, SpecSeq
    from runtime.models.loader import LoadedModel

__all__ = ["SelfDrafter", "draft_model"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _DraftKV:
    seq: SpecSeq
    kv: SequenceKV
    fed: list[int] = field(default_factory=list)  # the tokens whose K/V the draft KV holds
    num_real: int = 0  # of `fed`, those known to be the sequence's own tokens (not drafts)


@torch.inference_mode()
def draft_model(model: CausalLM, method: str, group_size: int = 32) -> CausalLM:
    """A copy of `model` whose decoder projections are quantized with `method` and whose LM
    head is int8; every other tensor (embeddings, norms, rope table) is the target's own."""
    projections: set[int] = set()
    for layer in model.layers:
        for path in PROJECTIONS:
            parent, attr = path.split(".")
            module = getattr(getattr(layer, parent), attr)
            projections.update(id(t) for t in module.parameters())
            projections.update(id(t) for t in module.buffers())
    memo: dict[int, object] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in projections:
            memo[id(tensor)] = tensor  # shared, not copied
    draft = cast(CausalLM, copy.deepcopy(model, memo))
    summary = quantize_model(draft, method, group_size=group_size)
    # the LM head in int8 too: on a small model it is the largest GEMM of a batch-1 step
    # (runtime.models.quantize), and the draft's precision never reaches the output
    quantize_head(draft, summary)
    return draft.eval()


class SelfDrafter:
    def __init__(self, model: CausalLM, cache: KVCache) -> None:
        self.model = model
        self.cache = cache
        self.entries: dict[str, _DraftKV] = {}

    @classmethod
    def build(cls, loaded: LoadedModel, config: SpecConfig, kv_cache: KVCache) -> SelfDrafter:
        target = loaded.quantization
        if target is not None and target.method == config.draft_quant:
            raise ConfigError(
                f"speculative_method=self_draft: the model is served in {target.method} already "
                f"(speculative_draft_quant={config.draft_quant} would draft with the same weights)",
                param="speculative_draft_quant",
            )
        if config.draft_quant == "int4" and loaded.device.type not in ("cpu", "cuda"):
            raise ConfigError(
                f"speculative_draft_quant=int4 is not available on {loaded.device.type}",
                param="speculative_draft_quant",
            )
        model = draft_model(cast(CausalLM, loaded.model), config.draft_quant)
        args = loaded.args
        cache = KVCache(
            num_layers=args.num_layers,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            dtype=loaded.dtype,
            device=loaded.device,
            allocator=kv_cache.allocator,
            max_bytes=max(kv_cache.max_bytes // 4, 2 * kv_cache.bytes_per_page),
            page_size=kv_cache.page_size,
            enable_prefix_caching=kv_cache.enable_prefix_caching,
            model_version=f"{kv_cache.model_version}#draft-{config.draft_quant}",
            owner=f"{kv_cache.owner}#draft",
        )
        return cls(model, cache)

    @torch.inference_mode()
    def draft(self, items: Seq[SpecItem]) -> None:
        """Replace each drafting item's placeholders by the draft model's greedy tokens."""
        self._sweep()
        rows: list[tuple[SpecItem, _DraftKV]] = []
        for item in items:
            drafts = item.draft_token_ids
            if not drafts:
                continue
            entry = self._entry(item.seq, len(drafts))
            if entry is None:  # no draft KV room: a draft the target will reject, still exact
                item.draft_token_ids = [0] * len(drafts)
                continue
            rows.append((item, entry))
        if not rows:
            return
        # the tokens each draft KV has not seen (at least the pending one), in one chunk each
        chunks = [e.seq.token_ids[e.kv.num_tokens :] for _, e in rows]
        # rows with logits controls draft under them (controls.py), as the target will judge
        controlled = any(e.seq.request.sampling.uses_logits_controls for _, e in rows)
        tokens = self._forward(rows, chunks, 0 if controlled else None)
        for (_, entry), chunk in zip(rows, chunks, strict=True):
            entry.fed.extend(chunk)
            entry.num_real = len(entry.fed)
            self.cache.cache_full_pages(entry.kv, entry.seq.token_slice)
        k_max = max(len(item.draft_token_ids or ()) for item, _ in rows)
        for j in range(k_max):
            for (item, _), token in zip(rows, tokens, strict=True):
                assert item.draft_token_ids is not None
                if j < len(item.draft_token_ids):
                    item.draft_token_ids[j] = token
            live = [(i, r) for i, r in enumerate(rows) if j + 1 < len(r[0].draft_token_ids or ())]
            if not live:
                break
            chunks = [[tokens[i]] for i, _ in live]
            next_tokens = self._forward([r for _, r in live], chunks, j + 1 if controlled else None)
            for (i, (_, entry)), token in zip(live, next_tokens, strict=True):
                entry.fed.append(tokens[i])
                tokens[i] = token

    def _entry(self, seq: SpecSeq, k: int) -> _DraftKV | None:
        """The sequence's draft KV, cut back to what still matches its tokens, with pages for
        what it will be fed this step; None when the pool has no room."""
        entry = self.entries.get(seq.request_id)
        if entry is None or entry.seq is not seq:
            if entry is not None:
                self.cache.free(seq.request_id)
            kv = self.cache.allocate(seq.request_id, seq.token_ids[:-1])
            entry = self.entries[seq.request_id] = _DraftKV(seq, kv)
            entry.fed = seq.token_ids[: kv.num_tokens]
            entry.num_real = kv.num_tokens
        tokens = seq.token_ids
        keep = entry.num_real
        limit = min(len(entry.fed), len(tokens) - 1)  # the pending token is always fed
        while keep < limit and entry.fed[keep] == tokens[keep]:
            keep += 1
        keep = min(keep, limit)
        del entry.fed[keep:]
        entry.kv.num_tokens = keep  # the rejected drafts' K/V are past the cursor now
        self.cache.trim(entry.kv, keep)
        if not self.cache.ensure(entry.kv, len(tokens) - keep + k - 1):
            return None
        return entry

    def _forward(
        self,
        rows: list[tuple[SpecItem, _DraftKV]],
        chunks: list[list[int]],
        num_drafted: int | None,  # drafts each row holds so far; None: no row has controls
    ) -> list[int]:
        """One draft forward over each row's chunk: the greedy next token of each row."""
        flat: list[int] = []
        slices: list[SeqSlice] = []
        for (_, entry), chunk in zip(rows, chunks, strict=True):
            slices.append(SeqSlice(start=len(flat), end=len(flat) + len(chunk), kv=entry.kv))
            flat.extend(chunk)
        device = self.cache.device
        hidden = self.model(torch.tensor(flat, dtype=torch.long, device=device), slices)
        last = torch.tensor([s.end - 1 for s in slices], device=device)
        logits = self.model.compute_logits(hidden.index_select(0, last))
        for (_, entry), chunk in zip(rows, chunks, strict=True):
            entry.kv.advance(len(chunk))
        if num_drafted is not None:
            seqs = [entry.seq for _, entry in rows]
            done = [(item.draft_token_ids or [])[:num_drafted] for item, _ in rows]
            control_rows(logits, seqs, done)
        return cast(list[int], logits.argmax(dim=-1).tolist())

    def _sweep(self) -> None:
        """Free the draft KV of sequences that closed (or were replaced) since the last step."""
        for seq_id in [s for s, e in self.entries.items() if e.seq.is_closed]:
            del self.entries[seq_id]
            self.cache.free(seq_id)

    def close(self) -> None:
        self.entries.clear()
        self.cache.close()
