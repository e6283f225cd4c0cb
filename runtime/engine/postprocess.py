"""The step's postprocess, under the core's lock (nano-vllm's `postprocess`): the scheduler's KV
bookkeeping, then each sampled token to its sequence, its stop check and its handle. Logprobs
come in the step's output and go to the sequences that keep a logprobs state; a choice forking
this step (n > 1) takes its first token from the output too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.engine.model_runner import StepOutput
from runtime.engine.request import TokenLogprob, TokenOutput
from runtime.engine.scheduled import SchedulerOutput
from runtime.engine.sequence import Sequence
from runtime.engine.stats import FinishReason, RequestEvent
from runtime.errors import FastllmError

if TYPE_CHECKING:
    from runtime.engine.core_view import CoreView
    from runtime.engine.spec.verify import SpecResult

__all__ = ["empty_output", "push_token", "update_from_output"]


def update_from_output(core: CoreView, batch: SchedulerOutput, output: StepOutput) -> None:
    core.scheduler.update_from_output(batch)  # cursors, published pages, closed ones freed
    batch_size = len(batch.items)
    logprobs = output.logprobs
    for i, (item, token_id) in enumerate(zip(batch.items, output.token_ids, strict=True)):
        seq = item.seq
        if seq.is_closed:
            continue
        seq.stats.batch_size = max(seq.stats.batch_size, batch_size)
        if token_id is None:
            continue  # a prefill chunk that ended mid-prompt (or a drafting row, below)
        if seq.pending_forks:  # its prefill ended: the other choices share its KV now
            _fork(core, seq, output.forks or {})
        push_token(core, seq, token_id, None if logprobs is None else logprobs[i])
    if output.spec is not None:  # verified drafts: several tokens each (runtime.engine.spec)
        for i, result in output.spec.items():
            seq = batch.items[i].seq
            if not seq.is_closed:
                _push_verified(core, batch, seq, result)


def _push_verified(
    core: CoreView, batch: SchedulerOutput, seq: Sequence, result: SpecResult
) -> None:
    """A drafting row's emitted tokens (with the target's logprobs, when asked), one by one
    through the stop check (a stop among them ends it there), then the scheduler's KV
    bookkeeping for the accepted drafts."""
    num_pushed = 0
    entries, logits = result.logprobs, result.chosen_logits
    for j, token_id in enumerate(result.token_ids):
        if logits is not None:  # runtime.verify: set before the push (a stop submits the job)
            assert seq.features is not None and seq.features.verify is not None
            seq.features.verify.chosen_logit = logits[j]
        push_token(core, seq, token_id, None if entries is None else entries[j])
        num_pushed += 1
        if seq.is_closed:
            break
    speculator = core.scheduler.speculator
    assert speculator is not None
    speculator.settle(batch, seq, result.num_drafted, result.num_accepted, num_pushed)


def _fork(
    core: CoreView, seq: Sequence, forked: dict[int, tuple[int, TokenLogprob | None]]
) -> None:
    assert seq.features is not None and seq.features.choice is not None
    forks, seq.features.choice.pending_forks = seq.features.choice.pending_forks, []
    for fork in forks:
        token = forked.get(id(fork))
        if fork.is_closed or token is None:
            continue
        # echo + logprobs: the prompt is the same for every choice, so is its logprobs list
        mine = seq.features.logprobs
        theirs = None if fork.features is None else fork.features.logprobs
        if mine is not None and theirs is not None:
            theirs.prompt = mine.prompt
        core.scheduler.fork(seq, fork)
        push_token(core, fork, *token)


def push_token(core: CoreView, seq: Sequence, token_id: int, logprob: TokenLogprob | None) -> None:
    """A sampled token into the sequence, its stop check and its handle."""
    seq.output_token_ids.append(token_id)
    if len(seq.output_token_ids) == 1:
        seq.mark(RequestEvent.FIRST_TOKEN)
    text, reason = seq.stop_checker.push(token_id)
    output = TokenOutput(
        request_id=seq.request_id,
        token_ids=[token_id],
        text=text,
        finished_reason=reason,
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=len(seq.output_token_ids),
        cached_tokens=seq.stats.cached_tokens,
        index=seq.index,
    )
    if seq.features is not None and seq.features.logprobs is not None:
        seq.features.logprobs.annotate(output, logprob)
    if reason is None:
        seq.handle.push(output)
    else:
        core.close(seq, finished_reason=reason, output=output)


def empty_output(
    seq: Sequence, finished_reason: FinishReason | None, error: FastllmError | None
) -> TokenOutput:
    """The final output of a sequence that ends without a token (cancelled, failed, timed out)."""
    return TokenOutput(
        request_id=seq.request_id,
        token_ids=[],
        text="",
        finished_reason=finished_reason,
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=len(seq.output_token_ids),
        error=error,
        cached_tokens=seq.stats.cached_tokens,
        index=seq.index,
    )
