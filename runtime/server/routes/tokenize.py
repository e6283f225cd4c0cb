"""POST /tokenize and /detokenize in vLLM's shape: evaluation tools (lm-evaluation-harness) find a
server-side tokenizer here. Gated by the API keys as /v1 is (and read by the same edge guard).

    /tokenize {"model", "prompt", "add_special_tokens": true}
              or {"model", "messages", "add_generation_prompt": true, "add_special_tokens": false}
              -> {"count", "max_model_len", "tokens", "token_strs": null}
    /detokenize {"model", "tokens"} -> {"prompt"}

`model` may be left out when the server serves one model. Nothing runs on the engine: these are
not requests of the inference_log.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import InvalidRequestError
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.schemas import ChatMessage, TokenId
from runtime.server.state import get_state
from runtime.serving.router import Route

router = APIRouter(tags=["tokenizer"])
PATHS = ("/tokenize", "/detokenize")  # the edge guard treats them as it treats /v1


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = Field(None, min_length=1, max_length=256)


class TokenizeRequest(_Body):
    prompt: str | None = Field(None, description="text to tokenize (or `messages`)")
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)] | None = None
    add_special_tokens: bool | None = Field(
        None, description="default true for `prompt`, false for `messages` (as vLLM)"
    )
    add_generation_prompt: bool = True


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
    if model is None:
        names = state.router.model_names
        if len(names) != 1:
            raise InvalidRequestError(
                "model is required: this server serves several", param="model"
            )
        model = names[0]
    return state.router.pick(model)


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request) -> Any:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("send exactly one of prompt and messages", param="prompt")
    engine = _route(request, body.model).engine
    tokenizer = engine.tokenizer
    if body.messages is not None:
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt
        )
        special = bool(body.add_special_tokens)  # the template already has its own
    else:
        assert body.prompt is not None
        text, special = body.prompt, body.add_special_tokens is not False
    ids = tokenizer.encode(text, add_special_tokens=special)
    context = int(engine.loaded.args.max_position_embeddings)
    return {"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": None}


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
    engine = _route(request, body.model).engine
    vocab = int(engine.loaded.args.vocab_size)
    if any(t >= vocab for t in body.tokens):
        raise InvalidRequestError(f"token ids must be in [0, {vocab})", param="tokens")
    return {"prompt": engine.tokenizer.decode(body.tokens, skip_special_tokens=False)}
