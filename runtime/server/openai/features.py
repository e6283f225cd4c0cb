"""What a completions or chat body asks beyond a plain request, decided once per body.

A plain request (one prompt, one choice, no logprobs, controls, constraint or tools) takes the
handlers' short path: none of the feature modules below runs for it. A field counts as asked when
the client sent it (pydantic's `model_fields_set`), whatever its value: a feature module handles
its own neutral values (`logprobs: false`, `tools: []`), so sending one costs only its module.
Each body computes its own (`body.features`, runtime.server.openai.schemas), once.

    choices     n > 1, best_of, a prompt batch, per-chunk usage   runtime.server.openai.choices
    logprobs    logprobs / top_logprobs (chat); logprobs, echo     logprobs.py, choice_logprobs.py
    controls    penalties, logit_bias, min_tokens, stop_token_ids controls.py
    structured  response_format, structured_outputs, guided_*     structured.py
    tools       tools / tool_choice, or tool turns in the history  tools/
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHAT_LOGPROBS", "COMPLETION_LOGPROBS", "CONTROLS", "STRUCTURED", "TOOLS", "Features"]

CONTROLS = frozenset(
    (
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "stop_token_ids",
    )
)
STRUCTURED = frozenset(
    (
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    )
)
CHAT_LOGPROBS = frozenset(("logprobs", "top_logprobs"))
COMPLETION_LOGPROBS = frozenset(("logprobs", "echo"))  # echo: the prompt's text (and logprobs)
TOOLS = frozenset(("tools", "tool_choice"))


@dataclass(frozen=True, slots=True)
class Features:
    choices: bool  # several prompts or sequences, or usage per chunk
    logprobs: bool
    controls: bool
    structured: bool
    tools: bool  # chat only
