"""Structured outputs: constrained decoding with XGrammar (a maintained grammar engine; this
package only wires it into the engine).

    spec.py      ConstraintSpec (what a request asks for) and its parse (a 400 on a bad one)
    vocab.py     the tokenizer's vocabulary for XGrammar, built once per loaded model
    cache.py     GrammarCache: compiles off the engine loop; an LRU bounded in bytes
    state.py     ConstraintState: one request's matcher, advanced and rolled back with it
    mask.py      GrammarMask: the sampling batch's processor for the constrained rows
"""

from runtime.engine.constraints.cache import GrammarCache, GrammarCacheStats
from runtime.engine.constraints.spec import CONSTRAINT_KINDS, ConstraintSpec
from runtime.engine.constraints.state import ConstraintState

__all__ = [
    "CONSTRAINT_KINDS",
    "ConstraintSpec",
    "ConstraintState",
    "GrammarCache",
    "GrammarCacheStats",
]
