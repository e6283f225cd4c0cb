"""POST /tokenize and /detokenize in vLLM's shape: evaluation tools (lm-evaluation-harness) find a
server-side tokenizer here. Gated by the API keys as /v1 is (and read by the same edge guard).

    /tokenize {"model", "prompt", "add_special_tokens": true}
              or {"model", "messages", "add_generation_prompt": true, "add_special_tokens": false}
              -> {"count", "max_model_len", "tokens", "token_strs": null}
    /detokenize {"model", "tokens"} -> {"prompt"}

`model` may be left out: the default model (`served_model_name`, else the first). Nothing runs on
the engine: these are not requests of the inference_log.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.offload import (
    INLINE_CHARS,
    SCALAR_SLICE,
    json_bytes,
    maybe_off_loop,
    off_loop,
)
from runtime.server.openai.schemas import ChatMessage, TokenId
from runtime.server.prompts import message_chars
from runtime.server.state import get_state
from runtime.serving.router import Route

router = APIRouter(tags=["tokenizer"])
PATHS = ("/tokenize", "/detokenize")  # the edge guard treats them as it treats /v1


class _Body(BaseModel):
    # extra fields refused: a body is exactly one of the shapes (one with both `prompt` and an
    # invalid `messages` would otherwise pass as a prompt body, against its own schema)
    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = Field(None, min_length=1, max_length=256)


class TokenizeCompletionRequest(_Body):
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(_Body):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = Field(False, description="the chat template has its own")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    tokens: list[TokenId] = Field(max_length=1 << 20)


class DetokenizeResponse(BaseModel):
    prompt: str


@functools.lru_cache(maxsize=8)
def _digits(vocab_size: int) -> list[bytes]:
    """Every id's decimal spelling, once per vocabulary size."""
    return [str(i).encode() for i in range(vocab_size)]


def _id_slices(ids: list[int], digits: list[bytes]) -> Iterator[bytes]:
    # a slice per join: each C call holds the GIL about a millisecond, not the whole list's time
    for start in range(0, len(ids), SCALAR_SLICE):
        yield b",".join(map(digits.__getitem__, ids[start : start + SCALAR_SLICE]))


def reply(ids: list[int], context: int) -> dict[str, Any]:
    return {"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": None}


def reply_bytes(ids: list[int], context: int, vocab_size: int) -> bytes:
    """`json_bytes(reply(ids, context))`, the ids spelled from a table: a 1 MB prompt's 540,000
    ids took the JSON encoder ~40 ms of GIL, the table ~20 ms. The tokenizer's ids are all in
    [0, vocab_size) (unsigned, below its vocabulary with the added tokens); one past the table
    would send the whole reply through the encoder."""
    try:
        tokens = b",".join(_id_slices(ids, _digits(vocab_size)))
    except IndexError:
        return json_bytes(reply(ids, context))
    head = b'{"count":%d,"max_model_len":%d,"tokens":[' % (len(ids), context)
    return b"".join((head, tokens, b'],"token_strs":null}'))


def _route(request: Request, model: str | None) -> Route:
    state = get_state(request)
    if model is None:  # the default model, as the legacy /predict picks it
        name = state.settings.served_model_name
        model = name if name in state.router.routes else state.router.model_names[0]
    return state.router.pick(model)


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest, request: Request) -> Any:
    engine = _route(request, body.model).engine
    tokenizer = engine.tokenizer
    context = int(engine.loaded.args.max_position_embeddings)
    chat = isinstance(body, TokenizeChatRequest)
    messages = [m.turn for m in body.messages] if isinstance(body, TokenizeChatRequest) else []

    def work() -> list[int]:
        if isinstance(body, TokenizeChatRequest):
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt
            )
        else:
            text = body.prompt
        return tokenizer.encode(text, add_special_tokens=body.add_special_tokens)

    # render, encode and the reply's JSON off the loop, unless short (runtime.server.offload)
    size = (
        message_chars(body.messages)
        if isinstance(body, TokenizeChatRequest)
        else len(getattr(body, "prompt", ""))
    )
    if size < INLINE_CHARS and not (chat and tokenizer.chat_template is not None):
        return reply(work(), context)
    vocab = tokenizer.vocab_size
    content = await off_loop(lambda: reply_bytes(work(), context, vocab))
    return Response(content, media_type="application/json")


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
    engine = _route(request, body.model).engine
    vocab = int(engine.loaded.args.vocab_size)
    if any(t >= vocab for t in body.tokens):
        raise InvalidRequestError(f"token ids must be in [0, {vocab})", param="tokens")
    decode = engine.tokenizer.decode
    text = await maybe_off_loop(len(body.tokens), decode, body.tokens, skip_special_tokens=False)
    return {"prompt": text}
