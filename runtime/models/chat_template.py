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

from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.errors import InvalidRequestError

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_ROLES = ("system", "user", "assistant", "tool")


def _raise_exception(message: str) -> None:
    # templates call raise_exception('Conversation roles must alternate ...')
    raise InvalidRequestError(f"chat template: {message}", param="messages")


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


def render_chat_template(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,  # for templates that render tools themselves
) -> str:
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise InvalidRequestError(f"messages[{i}] needs a string 'content'", param="messages")
        if message.get("role") not in _ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}", param="messages"
            )
    try:
        compiled = _compile(template or DEFAULT_CHAT_TEMPLATE)
        text: str = compiled.render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
    except TemplateError as exc:
        raise InvalidRequestError(f"chat template failed: {exc}", param="messages") from exc
    return text
