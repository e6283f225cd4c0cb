"""One sequence's speculation, decided once (on its first decode step) and then tracked.

`Sequence.spec` is None until the speculator first sees the sequence decode; then it holds a
`SpecState` whose `enabled` says whether the row may draft at all (its request allows it and uses
no feature speculation does not support) and, as the request runs, whether it still pays.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpecState"]


@dataclass(eq=False)
class SpecState:
    enabled: bool  # drafts for this sequence; False for good once it stops paying
    num_draft_tokens: int = 0  # drafted and verified
    num_accepted_tokens: int = 0  # of those, accepted by the target
    num_spec_steps: int = 0  # steps in which it verified drafts
    num_emitted_tokens: int = 0  # tokens those steps produced (accepted + one each)

    @property
    def acceptance_ratio(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    def observe(
        self, num_drafted: int, num_accepted: int, *, min_ratio: float, min_drafts: int
    ) -> None:
        """One verification: counts, and off for good once acceptance says it loses."""
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_spec_steps += 1
        self.num_emitted_tokens += num_accepted + 1
        if (
            self.num_draft_tokens >= min_drafts
            and self.num_accepted_tokens < min_ratio * self.num_draft_tokens
        ):
            self.enabled = False
