"""Label-matcher regexes on RE2 (`google-re2`), the engine Prometheus itself uses: matching takes
time linear in the label value whatever the pattern, so `(\\w|\\w)*!` cannot pin a CPU the way a
backtracking engine lets it (Python's `re` also holds the interpreter lock for the whole match,
so neither a worker thread nor a deadline could interrupt one). A pattern RE2 refuses
(backreferences, lookaround, or plain syntax errors) is an AlertRuleError, a 400 on the query API.
"""

from __future__ import annotations

from typing import Any, Protocol

import re2

from alerts.errors import AlertRuleError

# RE2's memory for one compiled program; a pattern needing more is refused, not swapped in
MAX_REGEX_PROGRAM_BYTES = 8 << 20


class Pattern(Protocol):
    def fullmatch(self, text: str) -> Any | None: ...


def compile_regex(pattern: str) -> Pattern:
    """Compile as Prometheus does: `.` also matches a newline; anchoring is the caller's
    (`fullmatch`)."""
    options = re2.Options()
    options.dot_nl = True
    options.log_errors = False  # a refused pattern is answered, not logged to stderr by RE2
    options.max_mem = MAX_REGEX_PROGRAM_BYTES
    try:
        compiled: Pattern = re2.compile(pattern, options)
    except re2.error as exc:
        shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
        raise AlertRuleError(f"invalid regular expression {shown!r}: {_reason(exc)}") from None
    return compiled


def _reason(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else exc
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
