"""A request's prompt, rendered and tokenized off the event loop (runtime.server.offload), with
its length bound checked before the whole of it is tokenized.

Two cheap checks come first, each refusing with the 400 the engine would give after a full
encode (issue 39, item 2: 16 prompts of 900 KB were each tokenized in full, +440 MB, before the
context check refused them):
1. characters: no token covers more characters than the vocabulary's longest entry
   (Tokenizer.max_token_chars), so a prompt longer than `room × that` characters cannot fit;
2. a head: where the prompt is much longer than `room` tokens could plausibly be, its first
   characters are encoded alone; if they are already well over `room` tokens, so is the whole.
What passes both is encoded in full (in the pool when long) and the engine checks it exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from runtime.errors import InvalidRequestError
from runtime.models.base import CausalLM
from runtime.models.tokenizer import Tokenizer
from runtime.server.offload import INLINE_CHARS, off_loop

if TYPE_CHECKING:
    from runtime.server.openai.schemas import ChatMessage

# a normalizer may fold a few characters into one (NFKC), which the vocabulary bound cannot see
_NORMALIZER_SLACK = 2
# the head check: so many characters per token of room are encoded (English runs ~4 a token)
_HEAD_CHARS_PER_TOKEN = 8
# tokens the head's cut may have split differently from the whole text's
_HEAD_MARGIN_TOKENS = 64


def room_for(engine: Any) -> int | None:
    """The most prompt tokens a generating model takes (its context less one generated token);
    None for an embedding model (the engine refuses it for what it is). A prompt that fits this
    but leaves too little for max_tokens is the engine's to refuse, naming max_tokens."""
    loaded = engine.loaded
    if not isinstance(loaded.model, CausalLM):  # LoadedModel.is_causal_lm, without the call
        return None
    return max(1, int(loaded.args.max_position_embeddings) - 1)


def check_prompt_chars(tokenizer: Tokenizer, num_chars: int, room: int | None, param: str) -> None:
    """The character bound alone (no encoding): a 400 for a prompt no tokenization can fit."""
    if room is None:
        return
    longest = tokenizer.max_token_chars
    if longest is not None and num_chars > _NORMALIZER_SLACK * longest * room:
        raise InvalidRequestError(
            f"prompt is too long: {num_chars} characters are more than {room} tokens can hold "
            f"with this model's tokenizer (at most {longest} characters a token), so it "
            "exceeds the model's context",
            param=param,
        )


def encode_bounded(
    tokenizer: Tokenizer,
    text: str,
    *,
    room: int | None,
    param: str = "prompt",
    add_special_tokens: bool = True,
) -> list[int]:
    """`tokenizer.encode(text)`, refused (InvalidRequestError naming `param`) when the prompt
    is known to exceed `room` tokens before it is tokenized in full (None: no bound)."""
    if room is None:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    check_prompt_chars(tokenizer, len(text), room, param)
    head_chars = (room + _HEAD_MARGIN_TOKENS) * _HEAD_CHARS_PER_TOKEN
    if len(text) > 2 * head_chars:  # only where the head saves most of the work
        head = tokenizer.encode(text[:head_chars], add_special_tokens=False)
        if len(head) > room + _HEAD_MARGIN_TOKENS:
            raise InvalidRequestError(
                f"prompt is too long: its first {head_chars} of {len(text)} characters are "
                f"already {len(head)} tokens, and this model's context takes {room}",
                param=param,
            )
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


async def encode_prompt(
    tokenizer: Tokenizer, text: str, *, room: int | None, param: str = "prompt"
) -> list[int]:
    """`encode_bounded`, in the pool for a long text."""
    if len(text) < INLINE_CHARS:
        return encode_bounded(tokenizer, text, room=room, param=param)
    return await off_loop(encode_bounded, tokenizer, text, room=room, param=param)


async def render_and_encode(
    tokenizer: Tokenizer,
    render: Callable[[], str],
    num_chars: int,
    *,
    room: int | None,
    param: str = "messages",
) -> list[int]:
    """A chat prompt's ids: `render()` then `encode_bounded`, in one trip to the pool unless the
    messages are short (`num_chars`) and the template is the built-in one (a checkpoint's
    renders in a sandbox process: the thread waits on its pipe, not the loop)."""
    # no character check before rendering: a template may leave text out (earlier reasoning)

    def work() -> list[int]:
        return encode_bounded(tokenizer, render(), room=room, param=param)

    return await off_loop(work) if needs_pool(tokenizer, num_chars) else work()


def needs_pool(tokenizer: Tokenizer, num_chars: int) -> bool:
    """Whether rendering + encoding a chat prompt of `num_chars` leaves the loop."""
    return tokenizer.chat_template is not None or num_chars >= INLINE_CHARS


def message_chars(messages: Sequence[ChatMessage]) -> int:
    """The characters of the messages' text (what rendering and encoding are about)."""
    return sum(len(m.text) for m in messages)
