"""Prompt batches and `n` / `best_of` behind /v1/completions and /v1/chat/completions: the
`Choices` run (runtime.server.openai.generate.Run), which the handlers start only for such bodies.

Each prompt of a batch is an engine request of its own (ids `<id>`, `<id>-1`, ...; one span and
one inference_log row each); each runs its `best_of` (else `n`) sequences as choices of one
request (runtime.engine.choices: one prefill, forked page tables). The body answers them together,
`choices[].index` in OpenAI's order: prompt p's j-th choice is index p * n + j. With best_of > n
the n sequences of highest cumulative logprob are returned, best first. Usage counts each prompt's
tokens once and the completion tokens of every sequence run (those best_of left out included).
A prompt the engine refuses cancels those already submitted; a client that goes away cancels all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from runtime.engine.request import TokenOutput
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FinishReason
from runtime.engine.timings import RequestMetrics
from runtime.errors import FastllmError, InvalidRequestError, RequestCancelled
from runtime.server.errors import error_payload
from runtime.server.openai import generate as gen
from runtime.server.openai.generate import IndexedChunk, IndexedOutputsChunk
from runtime.server.openai.streaming import DONE, sse, with_metrics


@dataclass
class Choice:
    index: int  # the engine's sequence index within its prompt
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    cumulative_logprob: float | None = None
    outputs: list[TokenOutput] = field(default_factory=list)  # for its logprobs and echo


@dataclass
class PromptResult:
    choices: list[Choice] = field(default_factory=list)  # the returned ones, in order
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0  # of every sequence run
    metrics: RequestMetrics | None = None  # enable_request_metrics (on its last final output)


async def _collect(sub: gen.Submitted, n: int) -> PromptResult:
    result = PromptResult()
    outputs: dict[int, list[TokenOutput]] = {}
    finals: dict[int, TokenOutput] = {}
    async for out in sub.handle:
        if out.error is not None:
            raise out.error
        if out.finished_reason == FinishReason.CANCELLED:
            raise RequestCancelled("the request was cancelled")
        outputs.setdefault(out.index, []).append(out)
        if out.is_final:
            finals[out.index] = out
            result.metrics = out.metrics or result.metrics
    for index, final in sorted(finals.items()):
        result.prompt_tokens, result.cached_tokens = final.prompt_tokens, final.cached_tokens
        result.completion_tokens += final.completion_tokens
        outs = outputs[index]
        choice = Choice(index, "".join(o.text for o in outs), final.finished_reason, outputs=outs)
        choice.completion_tokens, choice.cumulative_logprob = (
            final.completion_tokens,
            final.cumulative_logprob,
        )
        result.choices.append(choice)
    if len(result.choices) > n:  # best_of: the n the model found most likely
        ranked = sorted(result.choices, key=lambda c: -(c.cumulative_logprob or 0.0))
        result.choices = ranked[:n]
    return result


def cancel_all(subs: list[gen.Submitted]) -> None:
    for sub in subs:
        sub.cancel()  # a no-op for those that finished


async def join_prompts(request: Request, subs: list[gen.Submitted], n: int) -> list[PromptResult]:
    """Every prompt's choices; a client that disconnects meanwhile cancels them all."""
    results: asyncio.Future[list[PromptResult]] = asyncio.ensure_future(
        asyncio.gather(*(_collect(sub, n) for sub in subs))
    )
    watcher: asyncio.Future[None] = asyncio.ensure_future(gen._wait_disconnect(request))
    try:
        waited: set[asyncio.Future[Any]] = {results, watcher}
        done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if results not in done:
            raise RequestCancelled("the client went away; the request was cancelled")
        return await results
    finally:
        watcher.cancel()
        results.cancel()
        for sub in subs:
            sub.cancel()  # a no-op for those that finished
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await results


@dataclass
class Choices:
    """Several prompts (one engine request each) and / or several choices per prompt."""

    subs: list[gen.Submitted]
    n: int  # choices returned per prompt
    continuous_usage: bool = False  # usage in every chunk (vLLM's continuous_usage_stats)

    @property
    def created(self) -> int:
        return self.subs[0].created

    def cancel(self) -> None:
        cancel_all(self.subs)

    def events(self, chunks: gen.Chunks) -> AsyncIterator[bytes]:
        return choice_events(
            self.subs,
            self.n,
            chunks.chunk,
            first=chunks.first,
            usage=chunks.usage,
            continuous_usage=self.continuous_usage,
            rich=chunks.rich,
        )

    async def join(self, request: Request) -> gen.Joined:
        results = await join_prompts(request, self.subs, self.n)
        choices = [
            gen.Finished(p * self.n + j, choice.text, choice.finish_reason, choice.outputs)
            for p, result in enumerate(results)
            for j, choice in enumerate(result.choices)
        ]
        return gen.Joined(
            choices,
            sum(r.prompt_tokens for r in results),
            sum(r.completion_tokens for r in results),
            sum(r.cached_tokens for r in results),
            results[0].metrics if len(results) == 1 else None,  # one body, one request's
        )


def start(
    submit: gen.Submit,
    request_id: str,
    prompts: list[list[int]],
    params: Callable[[list[int]], SamplingParams],
    *,
    n: int,
    best_of: int | None,
    stream: bool,
    continuous_usage: bool,
) -> Choices:
    """Submits every prompt (each runs its best_of, else n, sequences; a constraint binds each
    choice, with a matcher of its own)."""
    if stream and best_of is not None and best_of > n:
        # the ranking needs every sequence's end: nothing could be streamed before it
        raise InvalidRequestError("best_of > n cannot be streamed", param="best_of")
    subs: list[gen.Submitted] = []
    try:
        for k, ids in enumerate(prompts):
            subs.append(submit(request_id if k == 0 else f"{request_id}-{k}", ids, params(ids)))
    except BaseException:
        for sub in subs:  # one refused prompt refuses the request: stop what already runs
            sub.cancel()
        raise
    return Choices(subs, n, continuous_usage)


async def choice_events(
    subs: list[gen.Submitted],
    n: int,
    chunk: IndexedChunk,
    *,
    first: Callable[[int], dict[str, Any]] | None = None,
    usage: Callable[[int, int, int], dict[str, Any]] | None = None,
    continuous_usage: bool = False,
    rich: IndexedOutputsChunk | None = None,
) -> AsyncIterator[bytes]:
    """SSE bytes for several prompts' choices (not best_of > n: the route refuses that): each
    wake-up of a handle becomes one chunk per choice that moved, `choices[0].index` naming it.
    `rich`: builds every chunk from its outputs instead (logprobs, echo), also when the text is
    held back, so each token's logprobs go out with the chunk of that token."""
    queue: asyncio.Queue[tuple[int, list[TokenOutput] | None]] = asyncio.Queue()

    async def pump(p: int, sub: gen.Submitted) -> None:
        try:
            async for outputs in sub.handle.batches():
                queue.put_nowait((p, outputs))
        finally:
            queue.put_nowait((p, None))

    prompt_tokens = [0] * len(subs)
    cached_tokens = [0] * len(subs)
    completion: dict[tuple[int, int], int] = {}
    metrics: dict[str, Any] | None = None  # enable_request_metrics, one prompt's: last chunk

    def usage_now() -> dict[str, Any]:
        return gen.usage(sum(prompt_tokens), sum(completion.values()), sum(cached_tokens))

    tasks = [asyncio.ensure_future(pump(p, sub)) for p, sub in enumerate(subs)]
    try:
        if first is not None:
            for index in range(len(subs) * n):
                yield sse(first(index))
        num_open = len(subs)
        while num_open:
            p, outputs = await queue.get()
            if outputs is None:
                num_open -= 1
                continue
            by_choice: dict[int, list[TokenOutput]] = {}
            for out in outputs:
                by_choice.setdefault(out.index, []).append(out)
            for j, outs in by_choice.items():
                last = outs[-1]
                prompt_tokens[p], cached_tokens[p] = last.prompt_tokens, last.cached_tokens
                completion[(p, j)] = last.completion_tokens
                text = "".join(out.text for out in outs)
                error: FastllmError | None = last.error
                if error is None and last.finished_reason == FinishReason.CANCELLED:
                    error = RequestCancelled("the request was cancelled")
                if error is not None:
                    if text:
                        yield sse(
                            chunk(p * n + j, text, None)
                            if rich is None
                            else rich(p * n + j, outs, text, None)
                        )
                    yield sse(error_payload(error.message, error.error_type, code=error.code))
                    return
                if last.metrics is not None and len(subs) == 1:
                    metrics = last.metrics.as_dict()
                if rich is not None:
                    payload = rich(p * n + j, outs, text, last.finished_reason)
                    if continuous_usage:
                        payload["usage"] = usage_now()
                    yield sse(with_metrics(payload, metrics if last.metrics else None, usage))
                elif text or last.finished_reason is not None:
                    payload = chunk(p * n + j, text, last.finished_reason)
                    if continuous_usage:
                        payload["usage"] = usage_now()
                    yield sse(with_metrics(payload, metrics if last.metrics else None, usage))
        if usage is not None:
            totals = usage(sum(prompt_tokens), sum(completion.values()), sum(cached_tokens))
            yield sse(with_metrics(totals, metrics))
        yield DONE
    finally:
        for task in tasks:
            task.cancel()
        for sub in subs:
            sub.cancel()  # the client went away mid-stream: free the KV now
