"""The scheduler's side of speculative decoding: which decode rows draft this step, with the KV
pages for their drafted positions, and the rollback once the target has verified them.

The scheduler calls `plan` at the end of `schedule()` (only when speculation is configured: a
plain engine has no speculator and pays one `is None` check per step). Each decode row that may
speculate gets up to k drafted tokens and pages for them; its chunk becomes 1 + k query tokens,
counted with the step's prefill-like tokens (the step goes through the model's chunked forward)
and in `num_draft_tokens`. Drafting never preempts and never admits less: a row whose pages or
whose share of the token budget are not there simply decodes one token.

After the forward, the postprocess pushes the emitted tokens (accepted drafts, then the target's
own next token) and calls `settle`: the KV cursor moves over the accepted drafts (their K/V were
written by the verifying forward, and are exactly the target's), the pages taken for rejected
positions go back (`KVCache.trim`), and the newly full pages are published for prefix reuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from runtime.engine.spec.config import SpecConfig
from runtime.engine.spec.ngram import propose_ngram
from runtime.engine.spec.state import SpecState
from runtime.engine.spec.threshold import DEFAULT_MAX_BATCH, SpecThreshold

if TYPE_CHECKING:
    from runtime.engine.spec.rows import SpecBatch, SpecItem, SpecSeq
    from runtime.memory.kv_pool import SequenceKV, TokenSlice

__all__ = ["Speculator", "spec_eligible"]

# self_draft rows reserve their k slots here; the runner's drafter writes the real ids in
PLACEHOLDER = -1


class _KV(Protocol):
    def ensure(self, kv: SequenceKV, num_new_tokens: int) -> bool: ...
    def trim(self, kv: SequenceKV, num_tokens: int) -> None: ...
    def cache_full_pages(self, kv: SequenceKV, tokens: TokenSlice) -> None: ...


def spec_eligible(seq: SpecSeq) -> bool:
    """Decided once per sequence: may it speculate at all? Its request did not opt out. Every
    feature is reproduced by the verification: a seed, n > 1, logprobs (the target's logits at
    each emitted token's position, verify.emitted_logprobs; the prompt's are sent with the
    first token, before the row ever drafts), constraints (each draft judged under the grammar,
    constrained.py), logits controls (each position's as after the drafts before it,
    controls.py) and verification sampling (the raw logit of each emitted token)."""
    return bool(getattr(seq.request, "speculative", True))


class Speculator:
    def __init__(self, config: SpecConfig, kv: _KV, threshold: SpecThreshold | None = None) -> None:
        self.config = config
        self.kv = kv
        # a step with more sequences drafts nothing: what attach resolved (the setting, the
        # warm-up's measurement or the default), else the setting or the default
        if threshold is None:
            given = config.max_batch_for_speculation
            threshold = SpecThreshold(given or DEFAULT_MAX_BATCH, "setting" if given else "default")
        self.threshold = threshold
        self.max_batch = threshold.max_batch

    @property
    def method(self) -> str:
        return self.config.method

    def plan(self, out: SpecBatch, budget_left: int) -> None:
        """Draft for the step's decode rows that may speculate (see the module doc)."""
        config = self.config
        if len(out.items) > self.max_batch:
            return  # the step's rows already fill it: drafts would take their compute
        for item in out.items:
            if budget_left <= 0:
                return
            seq = item.seq
            if item.num_new_tokens != 1 or seq.num_pending_tokens != 1 or not seq.output_token_ids:
                continue  # prefill chunks (and a first token still to come) do not draft
            state = seq.spec
            if state is None:
                state = seq.spec = SpecState(enabled=spec_eligible(seq))
            if not state.may_draft():
                continue  # not eligible, or paused: its drafts were losing
            room = seq.request.sampling.max_tokens - len(seq.output_token_ids) - 1
            k = min(config.num_speculative_tokens, room, budget_left)
            if k <= 0:
                continue
            drafts = self._propose(seq, k)
            if not drafts:
                continue
            assert seq.kv is not None
            if not self.kv.ensure(seq.kv, 1 + len(drafts)):
                return  # no free page: nobody drafts (never preempt for a guess)
            self._take(out, item, drafts)
            budget_left -= len(drafts)

    def _propose(self, seq: SpecSeq, k: int) -> list[int]:
        if self.config.method == "ngram":
            c = self.config
            return propose_ngram(seq.token_ids, k, c.ngram_min, c.ngram_max)
        return [PLACEHOLDER] * k  # self_draft: the runner drafts them

    @staticmethod
    def _take(out: SpecBatch, item: SpecItem, drafts: list[int]) -> None:
        item.draft_token_ids = drafts
        out.num_draft_tokens += len(drafts)
        # the row is a 1 + k token chunk now: a prefill-like chunk, not a one-token decode
        out.num_decode_tokens -= 1
        out.num_prefill_tokens += 1 + len(drafts)
        n = len(drafts)
        context = item.seq.num_computed_tokens
        # its attention pairs beyond the decode's (see SchedulerOutput.num_attention_pairs)
        out.num_attention_pairs += n * context + (n + 1) * (n + 2) // 2 - 1

    def settle(
        self,
        batch: SpecBatch,
        seq: SpecSeq,
        num_drafted: int,
        num_accepted: int,
        num_emitted: int,
    ) -> None:
        """After the emitted tokens were pushed: cursor over the accepted drafts, rejected
        positions' pages back, full pages published; the counts into the step's and the
        request's stats."""
        batch.num_accepted_tokens += num_accepted
        batch.num_emitted_tokens += num_emitted
        state = seq.spec
        if state is not None:
            c = self.config
            state.observe(
                num_drafted,
                num_accepted,
                min_ratio=c.min_acceptance_ratio,
                min_drafts=c.min_drafts_to_judge,
            )
        record = seq.group.members[0].stats if seq.group is not None else seq.stats
        record.spec_draft_tokens += num_drafted
        record.spec_accepted_tokens += num_accepted
        kv = seq.kv
        if kv is None:  # closed by a stop among the emitted tokens: its KV is already freed
            return
        # the accepted drafts' K/V are in place; the last emitted token is pending (not computed)
        kv.advance(min(num_accepted, seq.num_tokens - 1 - kv.num_tokens))
        self.kv.trim(kv, seq.num_tokens)
        self.kv.cache_full_pages(kv, seq.token_slice)
