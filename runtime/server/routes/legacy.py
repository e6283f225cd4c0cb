"""The deprecated one-shot API of older runtimes, served only with `legacy_support` on:

    POST /predict {"prompt": "...", "max_length": 32}  ->  {"text": "..."}

`max_length` is the number of tokens to generate at most (as the old runtime read it); decoding
is greedy. Every answer carries `Deprecation: true`, a `Link` to the successor
(/v1/completions) and a `Warning: 299` saying so. It goes through the same router, engine, metrics,
traces and inference_log as /v1/completions, with the default model.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from runtime.engine.sampling import SamplingParams
from runtime.errors import ServiceUnavailable
from runtime.server.errors import ERROR_RESPONSES
from runtime.server.openai import generate as gen
from runtime.server.prompts import encode_prompt, room_for
from runtime.server.state import ServerState, get_state

DEPRECATION_HEADERS = {
    "Deprecation": "true",
    "Link": '</v1/completions>; rel="successor-version"',
    "Warning": '299 - "POST /predict is deprecated; use POST /v1/completions"',
}
router = APIRouter(tags=["legacy"])


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    max_length: int = Field(16, ge=1, le=4096, description="tokens to generate at most")


class PredictResponse(BaseModel):
    text: str


def _default_model(state: ServerState) -> str:
    name = state.settings.served_model_name
    return name if name in state.router.routes else state.router.model_names[0]


@router.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES, deprecated=True)
async def predict(body: PredictRequest, request: Request) -> JSONResponse:
    """Deprecated: use POST /v1/completions."""
    state = get_state(request)
    if state.drain.is_draining or not state.is_ready:  # /predict is outside the /v1 guard
        raise ServiceUnavailable(state.load_error or "the server is not ready; retry later")
    state.drain.enter()
    try:
        model = _default_model(state)
        rid = gen.begin(request, "predict", model, "text_completion")
        route = state.router.pick(model)
        tokenizer = route.engine.tokenizer  # a long prompt: bounded, encoded off the loop
        ids = await encode_prompt(tokenizer, body.prompt, room=room_for(route.engine))
        params = SamplingParams(max_tokens=body.max_length, temperature=0.0)
        sub = gen.submit(request, route, rid, ids, params, operation="text_completion", user=None)
        out = await gen.join(request, sub)
    finally:
        state.drain.exit()
    return JSONResponse({"text": out.text}, headers=DEPRECATION_HEADERS)
