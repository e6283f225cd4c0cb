"""Logprobs and echo per choice index of a body (one choice, or prompt batches and `n` /
`best_of`, runtime.server.openai.choices): the shapes of runtime.server.openai.logprobs, built
per choice; the handlers make these only when the body asks for logprobs or echo.

lm-evaluation-harness scores loglikelihoods with a batch of token-id prompts, `echo`,
`logprobs: 1` and `max_tokens: 1`: each prompt's choice carries its own prompt logprobs (from its
engine request's first output), in the batch's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.engine.request import TokenOutput
from runtime.models.tokenizer import Tokenizer
from runtime.server.openai.logprobs import (
    CompletionShaper,
    EchoedPrompt,
    TokenTexts,
    chat_logprobs,
    completion_shaper,
    sampled_positions,
)
from runtime.server.openai.schemas import ChatCompletionRequest, CompletionRequest

__all__ = ["ChatChoiceLogprobs", "CompletionChoiceShapers"]


class CompletionChoiceShapers:
    """One `CompletionShaper` per choice index of the body (prompt p's j-th choice is p * n + j),
    made on its first chunk: a streamed choice's text offsets continue across its chunks."""

    def __init__(
        self, tokenizer: Tokenizer, body: CompletionRequest, prompt_ids: list[list[int]]
    ) -> None:
        self.tokenizer = tokenizer
        self.body = body
        self.prompt_ids = prompt_ids
        self.shapers: dict[int, CompletionShaper] = {}
        # one text cache for the body, one echoed prompt per prompt: its `n` choices share them
        self.texts = TokenTexts(tokenizer, body.return_tokens_as_token_ids)
        self.echoed: dict[int, EchoedPrompt] = {}

    @property
    def active(self) -> bool:
        """echo or logprobs asked: the choices' text and logprobs go through the shapers."""
        return self.body.echo or self.body.logprobs is not None

    @property
    def drops_sampled(self) -> bool:
        """max_tokens 0 with echo: the sampled token is left out (usage counts 0 completion)."""
        return self.body.max_tokens == 0

    def shape(
        self, index: int, outputs: Sequence[TokenOutput], text: str
    ) -> tuple[str, dict[str, Any] | None]:
        shaper = self.shapers.get(index)
        if shaper is None:
            p = index // self.body.n
            shaper = self.shapers[index] = completion_shaper(
                self.tokenizer,
                self.body.prompts[p],
                self.prompt_ids[p],
                self.body,
                texts=self.texts,
                echoed=self.echoed.setdefault(p, EchoedPrompt()),
            )
        return shaper.shape(outputs, text)


class ChatChoiceLogprobs:
    """Chat's `choices[].logprobs` of one choice's outputs (None when not asked)."""

    def __init__(self, tokenizer: Tokenizer, body: ChatCompletionRequest) -> None:
        self.asked = body.logprobs
        self.texts = TokenTexts(tokenizer, body.return_tokens_as_token_ids)

    def of(self, outputs: Sequence[TokenOutput]) -> dict[str, Any] | None:
        return chat_logprobs(self.texts, sampled_positions(outputs)) if self.asked else None
