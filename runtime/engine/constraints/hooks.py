"""What the Engine calls for a constrained request (only for one: a plain request calls none of
these), one line each: validate, label, new_state, record_outcome (when it closes). The wait for
the grammar's compile before queueing is the engine's (runtime.engine.grammar_wait)."""

from __future__ import annotations

from runtime.engine.constraints.cache import GrammarCache
from runtime.engine.constraints.state import ConstraintState
from runtime.engine.request import GenerationRequest
from runtime.engine.stats import FinishReason, RequestStats
from runtime.errors import InvalidRequestError

__all__ = ["label", "new_state", "record_outcome", "validate"]


def validate(grammars: GrammarCache | None, request: GenerationRequest) -> None:
    """A constraint the grammar engine refuses is a 400 naming the request's field."""
    spec = request.constraint
    if spec is None:
        return
    if grammars is None:
        raise InvalidRequestError("this model cannot take structured output", param=spec.param)
    if request.sampling.ignore_eos:  # a finished grammar allows only eos: it must end the output
        raise InvalidRequestError(
            f"ignore_eos cannot be combined with {spec.param}", param="ignore_eos"
        )
    spec.check(grammars.limits)  # sizes, $ref, regexes, satisfiable; then XGrammar's parse


def label(request: GenerationRequest) -> str:
    return "none" if request.constraint is None else request.constraint.stats_label


def new_state(grammars: GrammarCache | None, request: GenerationRequest) -> ConstraintState | None:
    """The request's matcher-to-be; its compile starts now (or is found in the cache)."""
    if request.constraint is None or grammars is None:
        return None
    spec = request.constraint
    future, hit = grammars.get(spec, tenant=request.tenant or request.cache_salt)
    return ConstraintState(spec, future, hit, release=lambda: grammars.release(spec, future))


def record_outcome(state: ConstraintState, stats: RequestStats) -> None:
    """Into the request's stats (under the core lock, as it closes)."""
    if not state.future.done():  # it ended waiting for its compile: stop it, if it was the last
        state.release()
    stats.grammar_cache_hit = state.cache_hit
    stats.grammar_compile_seconds = state.compile_seconds
    stats.grammar_cache_evictions = state.num_evicted
    stats.grammar_compile_timeout = state.compile_timed_out
    ended = stats.finished_reason in (FinishReason.STOP, FinishReason.LENGTH)
    stats.grammar_incomplete = ended and not state.is_complete
