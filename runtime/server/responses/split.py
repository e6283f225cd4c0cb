"""Which part of a growing output can be streamed now, per ToolPlan mode.

- none: everything;  named: everything (it is the call's arguments);
- required: nothing (the whole output is parsed into a call at the end);
- auto: everything before the first `<tool_call>`, holding back a tail that could start it.
`rest()` is what was held, for the end to send as text or parse into calls.
"""

from __future__ import annotations

from runtime.server.openai.tools import ToolPlan
from runtime.server.openai.tools.parse import OPEN_TAG

__all__ = ["Splitter"]


def _held_tail(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of the open tag."""
    for n in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if text.endswith(OPEN_TAG[:n]):
            return n
    return 0


class Splitter:
    def __init__(self, plan: ToolPlan) -> None:
        self.mode = plan.mode if plan.is_offered else "none"
        self.text = ""  # everything generated
        self.sent = 0  # characters of `text` given out by push
        self.holding = self.mode == "required"

    def push(self, delta: str) -> str:
        self.text += delta
        if self.mode in ("none", "named"):
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        if self.holding:
            return ""
        cut = self.text.find(OPEN_TAG, self.sent)
        if cut >= 0:
            self.holding = True
        else:
            cut = max(self.sent, len(self.text) - _held_tail(self.text))
        out, self.sent = self.text[self.sent : cut], cut
        return out

    def rest(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
