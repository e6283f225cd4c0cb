"""From a validated OpenAI body to a running engine request, and back to a response.

Shared by /v1/completions and /v1/chat/completions: route the model, open the trace span, submit,
then either join the result or stream it. Once `submit` returned (or refused with Overloaded) the
engine owns the request's stats; `request.state.engine_recorded` tells the error handlers so.

A handler drives a `Run`: `Single` (one prompt, one choice: one engine request) here, or
runtime.server.openai.choices.Choices (prompt batches, n, best_of). Either streams chunks built
per choice index, or joins into `Joined`, so one handler serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request

from runtime.engine.constraints import ConstraintSpec
from runtime.engine.request import GenerationRequest, RequestHandle, TokenOutput, context_room
from runtime.engine.sampling import SamplingParams
from runtime.engine.stats import FinishReason
from runtime.engine.timings import RequestMetrics
from runtime.errors import Overloaded, RequestCancelled
from runtime.server.auth import authorization_of
from runtime.server.openai.controls import control_fields
from runtime.server.openai.schemas import _Sampling
from runtime.server.openai.streaming import token_events
from runtime.server.openai.tenancy import prefix_salt, tenant_of
from runtime.server.state import get_state
from runtime.serving.router import Route


@dataclass
class Submitted:
    request_id: str
    created: int
    route: Route
    handle: RequestHandle

    def cancel(self) -> None:
        if not self.handle.finished:
            self.route.engine.cancel(self.request_id)


def begin(request: Request, prefix: str, model: str, operation: str) -> str:
    """Name the request (its id, model and operation are what a failure record carries)."""
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    request.state.request_id = request_id
    request.state.model = model
    request.state.operation = operation
    return request_id


def sampling_params(body: _Sampling, max_tokens: int, **logprobs: Any) -> SamplingParams:
    """`logprobs`: the route's logprobs fields (runtime.server.openai.controls); the sampling
    controls are read only when the body sent one (runtime.server.openai.features)."""
    controls = control_fields(body) if body.features.controls else {}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_strings,
        ignore_eos=body.ignore_eos,
        n=body.n,
        best_of=getattr(body, "best_of", None),  # completions only
        **controls,
        **logprobs,
    )


def default_max_tokens(engine: Any, num_prompt_tokens: int, default: int) -> int:
    """OpenAI's default when max_tokens is absent, capped by what the context leaves."""
    context = int(engine.loaded.args.max_position_embeddings)
    return max(1, min(default, context_room(context, num_prompt_tokens)))


def submit(
    request: Request,
    route: Route,
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    operation: str,
    user: str | None,
    constraint: ConstraintSpec | None = None,
    cache_salt: str | None = None,
    priority: int | None = None,
    speculative: bool = True,
) -> Submitted:
    state = get_state(request)
    settings = state.settings
    authorization = authorization_of(  # the Messages routes also take `x-api-key`
        request.url.path, request.headers.get("authorization"), request.headers.get("x-api-key")
    )
    tenant = tenant_of(authorization, settings.api_keys)
    salt = prefix_salt(tenant, cache_salt, shared=settings.prefix_cache_shared_across_keys)
    traceparent = request.headers.get("traceparent")
    if state.start_span is not None:
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": route.model,
            "gen_ai.request.max_tokens": params.max_tokens,
        }
        if route.adapter:  # the LoRA adapter the request selected by `model`
            attributes["fastllm.lora.adapter"] = route.adapter
        state.start_span(request_id, traceparent, attributes)
    generation = GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        sampling=params,
        model=route.base_model,
        version=route.version,
        operation=operation,
        traceparent=traceparent,
        user=user,
        constraint=constraint,
        cache_salt=salt,
        tenant=tenant or f"client:{request.client.host if request.client else ''}",
        report_metrics=settings.enable_request_metrics,
        priority=key_priority(tenant, settings.api_key_priorities)
        if priority is None
        else priority,
        group=getattr(request.state, "request_id", None),  # a batch's prompts: one group
        speculative=speculative,
        lora=route.adapter,
    )
    if state.tenants is not None:
        state.tenants.expect(request_id, tenant)
    try:
        handle = route.engine.submit(generation)
    except Overloaded:
        request.state.engine_recorded = True  # the engine counted its own refusal
        raise
    request.state.engine_recorded = True
    return Submitted(request_id, int(time.time()), route, handle)


def key_priority(tenant: str | None, priorities: list[int]) -> int:
    """The default `priority` of the API key `key-<n>` (api_key_priorities, in api_keys' order);
    0 without keys or past the list."""
    if tenant is None or not priorities or not tenant.startswith("key-"):
        return 0
    index = int(tenant.removeprefix("key-")) - 1
    return priorities[index] if 0 <= index < len(priorities) else 0


async def join(request: Request, submitted: Submitted) -> TokenOutput:
    """The whole completion; a client that disconnects meanwhile cancels the request."""
    result = asyncio.ensure_future(submitted.handle.aresult())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if result not in done:
            submitted.cancel()  # the handle then ends with "cancelled" at once
        out = await result
        if out.finished_reason == FinishReason.CANCELLED:
            raise RequestCancelled("the client went away; the request was cancelled")
        return out
    finally:
        watcher.cancel()
        if not result.done():  # this handler itself was cancelled
            submitted.cancel()
            result.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts the prompt tokens
    whose KV the prefix cache supplied (included in prompt_tokens, as OpenAI counts them)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_chunk_builder(
    base: Callable[[], dict[str, Any]], count_completion: bool = True
) -> Callable[[int, int, int], dict[str, Any]]:
    """The final streamed chunk of include_usage: no choices, just the usage.
    `count_completion` False: max_tokens 0 with echo (the sampled token is left out)."""

    def build(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        payload = base()
        payload["choices"] = []
        completion = completion_tokens if count_completion else 0
        payload["usage"] = usage(prompt_tokens, completion, cached_tokens)
        return payload

    return build


# --- one handler for one choice or many ------------------------------------------------------
# (choice index in the body, text delta, finish_reason) -> one chunk's JSON object
IndexedChunk = Callable[[int, str, str | None], dict[str, Any]]
# the same from the outputs behind the delta too (logprobs, echo: runtime.server.openai.logprobs)
IndexedOutputsChunk = Callable[[int, list[TokenOutput], str, str | None], dict[str, Any]]


@dataclass
class Finished:
    """One choice of a joined run."""

    index: int  # in the body: prompt p's j-th choice is p * n + j
    text: str
    finish_reason: str | None
    outputs: list[TokenOutput] = field(default_factory=list)  # for its logprobs and echo


@dataclass
class Joined:
    choices: list[Finished]
    prompt_tokens: int  # each prompt's once
    completion_tokens: int  # of every sequence run (those best_of left out included)
    cached_tokens: int
    metrics: RequestMetrics | None = None  # enable_request_metrics: the body's `metrics`

    def usage(self, count_completion: bool = True) -> dict[str, Any]:
        """`count_completion` False: max_tokens 0 with echo (the sampled token is left out)."""
        completion = self.completion_tokens if count_completion else 0
        return usage(self.prompt_tokens, completion, self.cached_tokens)


@dataclass(frozen=True)
class Chunks:
    """How a streamed run's chunks are built, per choice index."""

    chunk: IndexedChunk  # a text delta
    first: Callable[[int], dict[str, Any]] | None = None  # an opening chunk (chat's role delta)
    usage: Callable[[int, int, int], dict[str, Any]] | None = None  # the include_usage chunk
    rich: IndexedOutputsChunk | None = None  # every chunk from its outputs (logprobs, echo)


# (request id, prompt ids, params) -> the submitted request: `submit` with the rest bound
Submit = Callable[[str, list[int], SamplingParams], Submitted]


class Run(Protocol):
    """Submitted engine requests of one body, streamed or joined."""

    @property
    def created(self) -> int: ...
    def cancel(self) -> None: ...
    def events(self, chunks: Chunks) -> AsyncIterator[bytes]: ...
    async def join(self, request: Request) -> Joined: ...


@dataclass
class Single:
    """The plain case: one prompt, one choice, one engine request."""

    submitted: Submitted

    @property
    def created(self) -> int:
        return self.submitted.created

    def cancel(self) -> None:
        self.submitted.cancel()

    def events(self, chunks: Chunks) -> AsyncIterator[bytes]:
        sub, chunk, rich = self.submitted, chunks.chunk, chunks.rich
        return token_events(
            sub.handle,
            sub.cancel,
            lambda text, finish_reason: chunk(0, text, finish_reason),
            first=None if chunks.first is None else chunks.first(0),
            usage=chunks.usage,
            rich=None if rich is None else lambda outs, text, reason: rich(0, outs, text, reason),
        )

    async def join(self, request: Request) -> Joined:
        out = await join(request, self.submitted)
        choice = Finished(0, out.text, out.finished_reason, [out])
        return Joined(
            [choice], out.prompt_tokens, out.completion_tokens, out.cached_tokens, out.metrics
        )
