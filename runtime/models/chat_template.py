"""Chat templates: a checkpoint's own Jinja template (tokenizer_config.json `chat_template`),
rendered the way transformers does (sandboxed, trim_blocks + lstrip_blocks), or our built-in one.

The built-in template, used when a tokenizer has none (our demo models), renders

    <bos><|system|>
    You are terse.<eos>
    <|user|>
    Hello<eos>
    <|assistant|>
                                   <- generation starts here (add_generation_prompt)

i.e. each message is `<|role|>\\n` + content + eos + `\\n`. It needs no special tokens beyond
bos/eos, so any byte-level tokenizer can encode it.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.errors import InvalidRequestError, ModelLoadError
from runtime.models.template_sandbox import TemplateFailure, get_sandbox

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_ROLES = ("system", "user", "assistant", "tool")
# rendered once at load: a template that cannot render this is refused before serving
SAMPLE_CONVERSATION: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
)


def _raise_exception(message: str) -> None:
    # templates call raise_exception('Conversation roles must alternate ...')
    raise InvalidRequestError(f"chat template: {message}", param="messages")


@lru_cache(maxsize=1)
def _compile_default() -> Any:
    """The built-in template (ours, trusted): rendered in-process."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(DEFAULT_CHAT_TEMPLATE)


def render_chat_template(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,  # for templates that render tools themselves
) -> str:
    """The prompt text. A checkpoint's template renders in the sandbox's worker processes
    (runtime.models.template_sandbox: time, output and memory bounds); whatever it does wrong is
    an InvalidRequestError (400), never a 500 or a hang."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise InvalidRequestError(f"messages[{i}] needs a string 'content'", param="messages")
        if message.get("role") not in _ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}", param="messages"
            )
    context = {
        "messages": messages,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
        "tools": tools,
    }
    if not template:
        try:
            text: str = _compile_default().render(**context)
        except TemplateError as exc:
            raise InvalidRequestError(f"chat template failed: {exc}", param="messages") from exc
        return text
    try:
        return get_sandbox().render(template, context)
    except TemplateFailure as exc:
        if exc.kind == "raised":
            raise InvalidRequestError(f"chat template: {exc.message}", param="messages") from exc
        raise InvalidRequestError(f"chat template failed: {exc.message}", param="messages") from exc


async def render_chat_template_async(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """`render_chat_template` off the event loop (a thread waits on the worker), for handlers."""
    return await asyncio.to_thread(
        render_chat_template,
        template,
        messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
    )


def check_chat_template(template: str | None, *, bos_token: str, eos_token: str) -> None:
    """Render a sample conversation once, at load: a template that does not parse, fails, hangs
    or explodes is a one-line ModelLoadError here instead of a 400 on every request. A template
    that refuses the sample through its own raise_exception (e.g. no system role) passes: that is
    its rule about conversations, which requests will meet as 400s naming it."""
    if not template:
        return
    samples = [list(SAMPLE_CONVERSATION), list(SAMPLE_CONVERSATION[1:])]
    for messages in samples:
        try:
            get_sandbox().render(
                template,
                {
                    "messages": messages,
                    "bos_token": bos_token,
                    "eos_token": eos_token,
                    "add_generation_prompt": True,
                    "tools": None,
                },
            )
            return
        except TemplateFailure as exc:
            if exc.kind != "raised":
                raise ModelLoadError(
                    f"chat template fails on a sample conversation: {exc.message}"
                ) from exc
