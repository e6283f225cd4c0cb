"""One sequence's speculation, decided once (on its first decode step) and then tracked.

`Sequence.spec` is None until the speculator first sees the sequence decode; then it holds a
`SpecState`: `enabled` says whether the row may draft at all (its request did not opt out),
decided once. While it drafts, its recent acceptance is watched: when it falls below the bar
(a verified chunk costs more than the tokens it saves), the row pauses drafting for a number of
decode steps that doubles at each pause (8, 16, ... 256), then tries again, so a request whose
text turns repetitive later (a quote after a preamble) still gets there, and one that never
does pays a vanishing share of its steps.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpecState"]

FIRST_PAUSE_STEPS = 8
MAX_PAUSE_STEPS = 256
RECENT_WEIGHT = 0.5  # the latest verification's share in the recent acceptance


@dataclass(eq=False)
class SpecState:
    enabled: bool  # may draft at all (decided once)
    num_draft_tokens: int = 0  # drafted and verified
    num_accepted_tokens: int = 0  # of those, accepted by the target
    num_spec_steps: int = 0  # steps in which it verified drafts
    num_emitted_tokens: int = 0  # tokens those steps produced (accepted + one each)
    recent_acceptance: float | None = None  # moving acceptance since drafting (re)started
    drafts_since_resume: int = 0
    pause_steps_left: int = 0  # decode steps still to run without drafts
    next_pause_steps: int = FIRST_PAUSE_STEPS
    num_pauses: int = 0

    @property
    def acceptance_ratio(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    def may_draft(self) -> bool:
        """Called once per decode step of the row: False while paused (counting the step)."""
        if not self.enabled:
            return False
        if self.pause_steps_left:
            self.pause_steps_left -= 1
            return False
        return True

    def observe(
        self, num_drafted: int, num_accepted: int, *, min_ratio: float, min_drafts: int
    ) -> None:
        """One verification: counts, and a pause once recent acceptance says it loses."""
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self.num_spec_steps += 1
        self.num_emitted_tokens += num_accepted + 1
        if not num_drafted:
            return
        ratio = num_accepted / num_drafted
        recent = self.recent_acceptance
        recent = ratio if recent is None else (1 - RECENT_WEIGHT) * recent + RECENT_WEIGHT * ratio
        self.recent_acceptance = recent
        self.drafts_since_resume += num_drafted
        if self.drafts_since_resume >= min_drafts and recent < min_ratio:
            self.pause_steps_left = self.next_pause_steps
            self.next_pause_steps = min(2 * self.next_pause_steps, MAX_PAUSE_STEPS)
            self.num_pauses += 1
            self.recent_acceptance, self.drafts_since_resume = None, 0
