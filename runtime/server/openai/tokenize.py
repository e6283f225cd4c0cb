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

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.offload import INLINE_CHARS, json_response, maybe_off_loop
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

    def work() -> dict[str, Any]:
        if isinstance(body, TokenizeChatRequest):
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt
            )
        else:
            text = body.prompt
        ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
        return {"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": None}

    # render, encode and the reply's JSON off the loop, unless short (runtime.server.offload)
    size = (
        message_chars(body.messages)
        if isinstance(body, TokenizeChatRequest)
        else len(getattr(body, "prompt", ""))
    )
    if size < INLINE_CHARS and not (chat and tokenizer.chat_template is not None):
        return work()
    return await json_response(work)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
    engine = _route(request, body.model).engine
    vocab = int(engine.loaded.args.vocab_size)
    if any(t >= vocab for t in body.tokens):
        raise InvalidRequestError(f"token ids must be in [0, {vocab})", param="tokens")
    decode = engine.tokenizer.decode
    text = await maybe_off_loop(len(body.tokens), decode, body.tokens, skip_special_tokens=False)
    return {"prompt": text}
