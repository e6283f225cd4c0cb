"""Logprobs in the shapes OpenAI clients parse (and vLLM returns), from the engine's entries.

Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one position per token;
with `echo` the prompt's tokens come first (the first one `null`: nothing predicts it).
`top_logprobs` maps token text to logprob for the k alternatives plus the token itself (as vLLM
does, so k = 0 still names it); two tokens with the same text share a key (the legacy format's
limit). `text_offset` counts characters from the start of the choice's `text`, token by token.
Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
A token's text is its own decoding (special tokens included), or `token_id:<id>` with
`return_tokens_as_token_ids` (vLLM's extension: exact even where decodings collide); logprobs
below -9999 are sent as -9999 (JSON has no -Infinity; vLLM clamps the same way).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from runtime.engine.logprobs import TokenLogprob
from runtime.engine.request import TokenOutput
from runtime.models.tokenizer import Tokenizer


class ShapedBody(Protocol):
    """The completion body's fields the shaper reads (a protocol: schemas.py imports this)."""

    @property
    def echo(self) -> bool: ...
    @property
    def return_tokens_as_token_ids(self) -> bool: ...
    @property
    def logprobs(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...


MIN_LOGPROB = -9999.0

# (token id, its entry or None): one position of a choice
Position = tuple[int, TokenLogprob | None]


# --- response models (documented in /openapi.json; the routes return plain dicts) --------------
class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None


# --- formatting -----------------------------------------------------------------------------------
def _value(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


class TokenTexts:
    """Token id -> its text, decoded once per id for the response being built."""

    def __init__(self, tokenizer: Tokenizer, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids  # vLLM's return_tokens_as_token_ids: "token_id:123"
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = (
                f"token_id:{token_id}"
                if self.as_ids
                else self.tokenizer.decode([token_id], skip_special_tokens=False)
            )
        return text


@dataclass
class CompletionLogprobsBuilder:
    """Builds `choices[].logprobs` of a completion; streamed chunks share one builder so their
    text offsets continue where the previous chunk's ended."""

    texts: TokenTexts
    offset: int = 0

    def build(self, positions: Iterable[Position]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token_id, entry in positions:
            text = self.texts(token_id)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_value(entry.logprob))
            top = {self.texts(t): _value(v) for t, v in entry.top}
            top.setdefault(text, _value(entry.logprob))
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(texts: TokenTexts, positions: Iterable[Position]) -> dict[str, Any]:
    content = []
    for token_id, entry in positions:
        if entry is None:
            continue
        text = texts(token_id)
        content.append(
            {
                "token": text,
                "logprob": _value(entry.logprob),
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [
                    {"token": texts(t), "logprob": _value(v), "bytes": list(texts(t).encode())}
                    for t, v in entry.top
                ],
            }
        )
    return {"content": content, "refusal": None}


def sampled_positions(outputs: Sequence[TokenOutput]) -> list[Position]:
    """The sampled tokens of these outputs with their entries (an output without entries, e.g.
    a final output that carries no token, adds nothing)."""
    positions: list[Position] = []
    for out in outputs:
        entries: Sequence[TokenLogprob | None] = out.logprobs or [None] * len(out.token_ids)
        positions.extend(zip(out.token_ids, entries, strict=True))
    return positions


def prompt_positions(prompt_ids: Sequence[int], out: TokenOutput) -> list[Position]:
    entries = out.prompt_logprobs or [None] * len(prompt_ids)
    return list(zip(prompt_ids, entries, strict=True))


@dataclass
class EchoedPrompt:
    """One prompt's echoed logprob rows, built once and shared by its `n` choices (each choice
    carries the same prompt entries; building them per choice was most of an echo + logprobs
    reply's GIL time)."""

    entries: Sequence[TokenLogprob | None] | None = None
    rows: dict[str, Any] | None = None
    end_offset: int = 0


@dataclass
class CompletionShaper:
    """A completion choice's `text` and `logprobs` from engine outputs, whole or chunk by chunk:
    `echo` puts the prompt (its text, and with logprobs its positions) before the first one."""

    texts: TokenTexts
    prompt_ids: list[int]
    echo_text: str | None  # the prompt's text when echo is on
    with_logprobs: bool
    drop_sampled: bool = False  # max_tokens 0 with echo: the prompt only
    started: bool = False
    echoed: EchoedPrompt | None = None  # shared by the choices of one prompt

    def __post_init__(self) -> None:
        self.builder = CompletionLogprobsBuilder(self.texts)

    def shape(self, outputs: Sequence[TokenOutput], text: str) -> tuple[str, dict[str, Any] | None]:
        head: dict[str, Any] | None = None
        if self.drop_sampled:
            text = ""
        if not self.started:
            self.started = True
            if self.echo_text is not None:
                text = self.echo_text + text
                if outputs and self.with_logprobs:
                    head = self._prompt_rows(outputs[0])
        if not self.with_logprobs:
            return text, None
        positions = [] if self.drop_sampled else sampled_positions(outputs)
        tail = self.builder.build(positions)
        if head is None:
            return text, tail
        return text, {key: head[key] + tail[key] for key in tail}

    def _prompt_rows(self, out: TokenOutput) -> dict[str, Any]:
        echoed = self.echoed
        entries = out.prompt_logprobs
        if echoed is not None and echoed.rows is not None and echoed.entries == entries:
            self.builder.offset = echoed.end_offset  # the same prompt, the same rows
            return echoed.rows
        rows = self.builder.build(prompt_positions(self.prompt_ids, out))
        if echoed is not None:
            echoed.entries, echoed.rows, echoed.end_offset = entries, rows, self.builder.offset
        return rows


def completion_shaper(
    tokenizer: Tokenizer,
    prompt: str | list[int],
    prompt_ids: list[int],
    body: ShapedBody,
    *,
    texts: TokenTexts | None = None,
    echoed: EchoedPrompt | None = None,
) -> CompletionShaper:
    """`texts` and `echoed`: shared by the choices of one body (CompletionChoiceShapers)."""
    echo_text = None
    if body.echo:  # the prompt as sent; token ids as their decoding
        echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt_ids)
    if texts is None:
        texts = TokenTexts(tokenizer, body.return_tokens_as_token_ids)
    with_logprobs = body.logprobs is not None
    return CompletionShaper(
        texts, prompt_ids, echo_text, with_logprobs, body.max_tokens == 0, echoed=echoed
    )
