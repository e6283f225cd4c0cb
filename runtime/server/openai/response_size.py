"""How large a joined (non-streamed) completion will be, decided before anything runs: a body
whose response would pass `settings.max_response_bytes` is a 400 saying so (issue 39, item 2:
`echo` + `logprobs: 20` over 8 prompts of 2,000 ids with `n: 16` built 116 MB in 20 s).

The figures below are lower bounds of what runtime.server.openai.logprobs writes per position
(a short token, a 7-digit logprob, its offset; each alternative one more short token and logprob),
so the estimate is below the real size and a refused body would really have passed the bound.
A streamed body is sent a chunk at a time and is not bounded here.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import InvalidRequestError

# completions: "tok", -1.234567 in tokens / token_logprobs / text_offset; `"tok": -1.234567,`
# per alternative in top_logprobs
_COMPLETION_POSITION_BYTES = 24
_COMPLETION_ALTERNATIVE_BYTES = 18
# chat: {"token":"tok","logprob":-1.234567,"bytes":[116,111,107],"top_logprobs":[...]}, each
# alternative {"token":"tok","logprob":-1.234567,"bytes":[...]}
_CHAT_POSITION_BYTES = 64
_CHAT_ALTERNATIVE_BYTES = 48
_TEXT_BYTES_PER_TOKEN = 1  # a token is at least one character of the choice's text


@dataclass(frozen=True)
class ResponseShape:
    """The largest response a body can get back (every choice runs to max_tokens), in totals
    over its choices."""

    num_choices: int  # prompts × n
    positions: int  # tokens with a logprobs entry: max_tokens per choice (+ the prompt's, echo)
    text_chars: int  # the choices' text: a character a generated token, the echoed prompts'
    alternatives: int | None  # top logprobs per position; None: no logprobs
    chat: bool

    @property
    def estimate_bytes(self) -> int:
        if self.alternatives is None:
            return self.text_chars
        position, alternative = (
            (_CHAT_POSITION_BYTES, _CHAT_ALTERNATIVE_BYTES)
            if self.chat
            else (_COMPLETION_POSITION_BYTES, _COMPLETION_ALTERNATIVE_BYTES)
        )
        return self.text_chars + self.positions * (position + self.alternatives * alternative)


def completion_shape(
    prompts: list[str | list[int]],
    prompt_ids: list[list[int]],
    *,
    n: int,
    max_tokens: int,
    echo: bool,
    logprobs: int | None,
) -> ResponseShape:
    generated = len(prompts) * n * max_tokens
    echoed = sum(len(ids) for ids in prompt_ids) * n if echo else 0
    echo_chars = sum(len(p) for p in prompts if isinstance(p, str)) * n if echo else 0
    return ResponseShape(
        num_choices=len(prompts) * n,
        positions=generated + (echoed if logprobs is not None else 0),
        text_chars=generated * _TEXT_BYTES_PER_TOKEN + echo_chars,
        alternatives=logprobs,
        chat=False,
    )


def chat_shape(
    *, n: int, max_tokens: int, logprobs: bool, top_logprobs: int | None
) -> ResponseShape:
    generated = n * max_tokens
    return ResponseShape(
        num_choices=n,
        positions=generated if logprobs else 0,
        text_chars=generated * _TEXT_BYTES_PER_TOKEN,
        alternatives=(top_logprobs or 0) if logprobs else None,
        chat=True,
    )


def check_response_size(shape: ResponseShape, limit_bytes: int) -> None:
    """A 400 when the estimate passes the limit, naming what makes it large."""
    estimate = shape.estimate_bytes
    if estimate <= limit_bytes:
        return
    what = f"{shape.num_choices} choices, {shape.positions} tokens in all"
    if shape.alternatives is not None:
        what += f", with logprobs and {shape.alternatives} alternatives each"
    param = "logprobs" if shape.alternatives is not None else "n"
    raise InvalidRequestError(
        f"the response could be {estimate >> 20} MiB or more ({what}), above this server's "
        f"limit of {limit_bytes >> 20} MiB (max_response_bytes): ask for fewer prompts, "
        "choices, tokens or alternatives, or stream it",
        param=param,
    )
